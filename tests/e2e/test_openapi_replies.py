"""Every route's real replies match the reply schema /openapi.json documents for them (success and
error), for requests schemathesis rarely builds: logprobs, echo, n, base64 embeddings, tool calls."""

from __future__ import annotations

import httpx
import jsonschema_rs
import pytest

from test_server import MODEL, server  # noqa: F401 (the served tiny model fixture)

pytestmark = pytest.mark.e2e
HI = [{"role": "user", "content": "hi"}]


def documented(url: str, method: str, route: str, path: str | None = None, **kwargs) -> dict:
    """The JSON reply of ``method path`` (default: the route itself), validated against the schema
    documented for its status."""
    reply = httpx.request(method, url + (path or route), timeout=60, **kwargs)
    spec = httpx.get(f"{url}/openapi.json").json()
    responses = spec["paths"][route][method.lower()]["responses"]
    status = str(reply.status_code)
    schema = (responses.get(status) or responses[status[0] + "XX"])["content"]["application/json"]["schema"]
    jsonschema_rs.validator_for({**schema, "components": spec["components"]}).validate(reply.json())
    return reply.json()


@pytest.mark.parametrize("body", [
    {"messages": HI, "max_tokens": 4, "n": 2, "logprobs": True, "top_logprobs": 2},
    {"messages": HI, "max_tokens": 2, "temperature": 0},
    {"messages": HI, "max_tokens": 0},                                       # 400
    {"messages": HI, "max_tokens": 2, "model": "elsewhere"},                 # 404
], ids=["logprobs-n", "plain", "bad", "unknown-model"])
def test_chat_replies_are_documented(server, body):
    documented(server.url, "POST", "/v1/chat/completions", json=body)


@pytest.mark.parametrize("body", [
    {"prompt": "hello there", "max_tokens": 0, "echo": True, "logprobs": 2},
    {"prompt": ["a", "b"], "max_tokens": 3, "logprobs": 0, "n": 2, "temperature": 0.5, "seed": 1},
    {"prompt": [1, 2, 3], "max_tokens": 2, "stop": ["x"]},
], ids=["echo-scored", "batch", "token-ids"])
def test_completion_replies_are_documented(server, body):
    got = documented(server.url, "POST", "/v1/completions", json=body)
    assert got["choices"]


@pytest.mark.parametrize("body", [{"input": ["a b", "c"]}, {"input": [[1, 2]], "encoding_format": "base64"}])
def test_embedding_replies_are_documented(server, body):
    assert len(documented(server.url, "POST", "/v1/embeddings", json=body)["data"]) == len(body["input"])


def test_other_routes_are_documented(server):
    documented(server.url, "GET", "/v1/models")
    documented(server.url, "GET", "/v1/models/{model_id}", f"/v1/models/{MODEL}")
    documented(server.url, "GET", "/v1/models/{model_id}", "/v1/models/nope")
    documented(server.url, "GET", "/tokenizer_info")
    documented(server.url, "GET", "/health")
    ids = documented(server.url, "POST", "/tokenize", json={"messages": HI})["tokens"]
    documented(server.url, "POST", "/detokenize", json={"tokens": ids})
    for body in ({"input": "hi", "max_output_tokens": 3, "instructions": "Be brief."},
                 {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}], "max_output_tokens": 50},
                 {"input": "hi", "tools": [{"type": "function"}]}):
        documented(server.url, "POST", "/v1/responses", json=body)
