"""/tokenize, /detokenize, /tokenizer_info and GET /v1/models/{id} as vLLM serves them, checked
against the artifact's own tokenizer and chat template."""

from __future__ import annotations

import httpx
import pytest

from kiln.runtime.tokenizer import Tokenizer
from test_server import MODEL, server  # noqa: F401 (the served tiny model fixture)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tok(tiny_artifacts) -> Tokenizer:
    return Tokenizer.from_dir(tiny_artifacts["tied"])


def post(server, route: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{route}", json=body, timeout=30)


@pytest.mark.parametrize("special", [True, False])
def test_tokenize_and_detokenize_round_trip(server, tok, special):
    text = "Paged attention keeps the KV cache in pages."
    got = post(server, "/tokenize", {"model": MODEL, "prompt": text, "add_special_tokens": special}).json()
    assert got["tokens"] == tok.encode(text, add_special_tokens=special)
    assert got["count"] == len(got["tokens"]) and got["max_model_len"] > 0
    back = post(server, "/detokenize", {"model": MODEL, "tokens": got["tokens"]}).json()
    assert back["prompt"] == tok.decode(got["tokens"])


def test_tokenize_messages_uses_the_chat_template(server, tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    got = post(server, "/tokenize", {"messages": messages}).json()
    want = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)
    assert got["tokens"] == want


def test_tokenizer_info_has_what_lm_eval_reads(server, tok):
    info = httpx.get(f"{server.url}/tokenizer_info", timeout=30).json()
    assert info["eos_token"] == tok.eos_token and info["vocab_size"] == tok.vocab_size
    assert info["chat_template"] and info["model_max_length"] > 0


@pytest.mark.parametrize("route,body,param", [
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "a", "bogus": 1}, "bogus"),
    ("/detokenize", {"tokens": [1, 10 ** 9]}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
    ("/tokenize", {"messages": [{"role": "wizard", "content": "b"}]}, "messages"),
])
def test_bad_tokenizer_requests_are_400s(server, route, body, param):
    resp = post(server, route, body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_models_by_id(server):
    import openai
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.owned_by == "kiln"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("no-such-model")
