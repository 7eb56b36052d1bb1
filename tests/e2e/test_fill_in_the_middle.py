"""/v1/completions with a suffix (fill-in-the-middle, what code-completion clients send) through the official openai
client, on a tiny model whose vocabulary has Qwen2.5-Coder's FIM tokens: the text before the hole (prompt) and after
it (suffix) become the model's FIM prompt, and the completion is the one its token ids give, streamed or not; and
llama-server's /infill, its repository-level prompt laid out as llama.cpp lays it out."""

from __future__ import annotations

import shutil

import httpx

import openai
import pytest

import kiln
from kiln.runtime.engine import EngineConfig
from kiln.runtime.server import ServerArgs
from kiln.runtime.tokenizer import Tokenizer
from test_server import running_server
from tiny_models import write_tokenizer

pytestmark = pytest.mark.e2e
FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|fim_repo|>", "<|file_sep|>")
PREFIX, SUFFIX = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def fim_artifact(tiny_dirs, tmp_path_factory):
    """The tied tiny Llama with a tokenizer of the same 512 ids holding the FIM tokens, compiled."""
    root = tmp_path_factory.mktemp("fim")
    shutil.copytree(tiny_dirs["tied"], root / "hf")
    write_tokenizer(root / "hf", 512, specials=FIM)
    return kiln.compile(str(root / "hf"), target="cpu", quant="q0f32", output=root / "art", golden=False)


@pytest.fixture(scope="module")
def server(fim_artifact):
    """That artifact served."""
    with running_server(fim_artifact, ServerArgs(model_name="fim", engine=EngineConfig(max_num_seqs=4))) as s:
        yield s, Tokenizer.from_dir(fim_artifact)


def test_a_suffix_fills_the_middle(server):
    s, tok = server
    client = s.client()
    ids = tok.fim_prompt(PREFIX, SUFFIX)
    pad = tok.fim_end_ids[0]
    assert tok.id_to_token(ids[0]) == FIM[0] and tok.id_to_token(ids[-1]) == FIM[2]
    args = dict(model="fim", max_tokens=12, temperature=0, logit_bias={str(pad): -100})   # no early FIM end here
    want = client.completions.create(prompt=ids, **args)
    got = client.completions.create(prompt=PREFIX, suffix=SUFFIX, **args)
    assert got.choices[0].text == want.choices[0].text and got.usage.prompt_tokens == len(ids)
    streamed = "".join(c.choices[0].text for c in client.completions.create(prompt=PREFIX, suffix=SUFFIX,
                                                                             stream=True, **args))
    assert streamed == want.choices[0].text


def test_the_fim_padding_token_ends_a_middle(server):
    """The vocabulary's FIM ends stop the middle as EOS does (llama.cpp's end-of-generation tokens for infill): the
    padding token pushed to the top ends it at once."""
    s, tok = server
    pad = tok.fim_end_ids[0]
    got = s.client().completions.create(model="fim", prompt=PREFIX, suffix=SUFFIX, max_tokens=8, temperature=0,
                                        logit_bias={str(pad): 100})
    assert got.choices[0].finish_reason == "stop" and got.usage.completion_tokens <= 1


@pytest.mark.parametrize("body, param", [(dict(prompt=PREFIX, suffix=SUFFIX, echo=True), "echo"),
                                         (dict(prompt=[5, 6, 7], suffix=SUFFIX), "prompt")])
def test_what_a_suffix_cannot_go_with_is_a_400(server, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        server[0].client().completions.create(model="fim", max_tokens=4, **body)
    assert e.value.body["param"] == param


def test_llama_servers_infill(server):
    """/infill: the completion of the ids llama-server's format_prompt_infill builds (in this 256-token context no
    room is left for input_extra: prefix + prompt, suffix, middle), and a file separator ends it as EOS does."""
    s, tok = server
    pre, suf, mid = tok.fim_marks()
    def enc(text):
        return tok.encode(text, add_special_tokens=False)
    ids = [pre, *enc(PREFIX), *enc("a"), suf, *enc(SUFFIX), mid]          # the prompt after the prefix, apart
    body = {"n_predict": 8, "temperature": 0, "ignore_eos": True, "return_tokens": True}
    want = httpx.post(f"{s.url}/completion", json={"prompt": ids, **body}, timeout=120).json()
    got = httpx.post(f"{s.url}/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "a",
                                              "input_extra": [{"filename": "util.py", "text": "X = 1\n"}], **body},
                     timeout=120).json()
    assert got["tokens"] == want["tokens"] and got["content"] == want["content"]
    assert got["tokens_evaluated"] == len(ids)
    sep = tok.token_id_of(["<|file_sep|>"])
    ended = httpx.post(f"{s.url}/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 8,
                                                "temperature": 0, "logit_bias": [[sep, 100]]}, timeout=120).json()
    assert ended["stop_type"] == "eos" and ended["tokens_predicted"] <= 1


def test_infill_takes_one_prompt(server):
    s, _ = server
    r = httpx.post(f"{s.url}/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": [[5, 6]]},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


# llama.vim's /infill body (its fields and values; n_predict smaller, and t_max_predict_ms long enough that a slow
# CI step never ends the middle early)
LLAMA_VIM = {"id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX,
             "input_extra": [{"filename": "util.py", "text": "X = 1\n"}], "prompt": "", "n_predict": 12,
             "stop": [], "n_indent": 0, "top_k": 40, "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"],
             "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 60_000,
             "response_fields": ["content", "timings/prompt_n", "timings/predicted_n", "timings/predicted_ms",
                                 "truncated", "tokens_cached"]}


def test_llama_vims_infill_request(server, fim_artifact):
    """What llama.vim sends is served: its answer has the response_fields alone, and its tokens are the in-process
    engine's seeded draw through top-k, top-p and llama.cpp's infill sampler at temperature 1 (its chain names no
    temperature), the FIM ends stopping it as EOS does."""
    s, tok = server
    answer = httpx.post(f"{s.url}/infill", json={**LLAMA_VIM, "seed": 11}, timeout=120).json()
    assert set(answer) == set(LLAMA_VIM["response_fields"]) and answer["truncated"] is False
    full = httpx.post(f"{s.url}/infill", json={**LLAMA_VIM, "seed": 11, "response_fields": [], "return_tokens": True},
                      timeout=120).json()
    assert full["content"] == answer["content"] and full["id_slot"] == 0
    assert full["generation_settings"]["samplers"] == LLAMA_VIM["samplers"]
    engine = kiln.Engine(fim_artifact)
    pre, suf, mid = tok.fim_marks()
    def enc(text):
        return tok.encode(text, add_special_tokens=False)
    prompt = [pre, *enc(PREFIX), suf, *enc(SUFFIX), mid]
    assert full["tokens_evaluated"] == len(prompt)
    want = engine.generate([prompt], kiln.SamplingParams(
        max_tokens=12, seed=11, top_k=40, top_p=0.9, temperature=1.0, infill=True,
        stop_token_ids=tok.fim_end_ids))[0]
    assert full["tokens"] == want.token_ids and full["content"] == want.text
    greedy_late = {**LLAMA_VIM, "samplers": ["top_k", "top_p", "infill", "temperature"], "temperature": 0,
                   "response_fields": ["content"]}
    assert httpx.post(f"{s.url}/infill", json=greedy_late, timeout=120).status_code == 200


def test_a_samplers_chain_kiln_cannot_follow_is_a_400(server):
    r = httpx.post(f"{server[0].url}/infill", json={**LLAMA_VIM, "samplers": ["top_p", "infill"]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "samplers"


def test_an_extra_chunk_without_text_is_a_400(server):
    r = httpx.post(f"{server[0].url}/infill", json={**LLAMA_VIM, "input_extra": [{"filename": "a.py"}]}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_extra"
