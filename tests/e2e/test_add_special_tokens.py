"""vLLM's add_special_tokens through the official openai client, on the tiny Llama with a Gemma-style tokenizer (BOS
added by encode, and written by its chat template too): a text completion's prompt gets the BOS unless it is false;
a chat's rendered prompt gets none unless it is true (its template writes one: then two, as vLLM gives)."""

from __future__ import annotations

import shutil

import pytest

import kiln
from kiln.runtime.engine import EngineConfig
from kiln.runtime.server import ServerArgs
from kiln.runtime.tokenizer import Tokenizer
from test_server import running_server
from tiny_models import write_gemma_tokenizer

pytestmark = pytest.mark.e2e
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("bos")
    shutil.copytree(tiny_dirs["tied"], root / "hf")
    write_gemma_tokenizer(root / "hf", 512)
    art = kiln.compile(str(root / "hf"), target="cpu", quant="q0f32", output=root / "art", golden=False)
    with running_server(art, ServerArgs(model_name="bos", engine=EngineConfig(max_num_seqs=4))) as s:
        yield s, Tokenizer.from_dir(art)


def test_a_completions_prompt_gets_its_bos_unless_told_not_to(server):
    s, tok = server
    ids = tok.encode("Once upon a time")
    assert ids[0] == tok.bos_token_id and tok.encode("Once upon a time", add_special_tokens=False) == ids[1:]
    client = s.client()
    args = dict(model="bos", prompt="Once upon a time", max_tokens=4, temperature=0, echo=True, logprobs=0)
    with_bos = client.completions.create(**args).choices[0]
    without = client.completions.create(**args, extra_body={"add_special_tokens": False}).choices[0]
    assert len(with_bos.logprobs.tokens) == len(without.logprobs.tokens) + 1
    assert with_bos.logprobs.tokens[0] == "<bos>" and without.logprobs.tokens[0] != "<bos>"
    bare = client.completions.create(model="bos", prompt="a", max_tokens=1, extra_body={"add_special_tokens": False})
    assert bare.usage.prompt_tokens == len(tok.encode("a", add_special_tokens=False))


def test_a_chats_rendered_prompt_gets_a_bos_only_when_asked(server):
    s, tok = server
    client = s.client()
    plain = client.chat.completions.create(model="bos", messages=HELLO, max_tokens=1).usage.prompt_tokens
    rendered = tok.apply_chat_template(HELLO, add_generation_prompt=True)
    assert plain == len(tok.encode(rendered, add_special_tokens=False)) and rendered.startswith("<bos>")
    doubled = client.chat.completions.create(model="bos", messages=HELLO, max_tokens=1,
                                             extra_body={"add_special_tokens": True}).usage.prompt_tokens
    assert doubled == plain + 1
