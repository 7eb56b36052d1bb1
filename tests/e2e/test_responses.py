"""/v1/responses through the official openai SDK: the same greedy text as chat completions for the
same conversation, the SDK's streaming events, usage, and refusals of what kiln does not do."""

from __future__ import annotations

import httpx
import openai
import pytest

from test_server import MODEL, server  # noqa: F401 (the served tiny model fixture)

pytestmark = pytest.mark.e2e

INSTRUCTIONS = "Answer briefly."
QUESTION = "Name a colour."


def chat_reply(server, max_tokens: int):
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]
    return server.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens,
                                                   temperature=0)


def test_response_equals_chat_and_counts_usage(server):
    chat = chat_reply(server, 12)
    resp = server.client().responses.create(model=MODEL, instructions=INSTRUCTIONS, input=QUESTION,
                                            max_output_tokens=12, temperature=0)
    assert resp.output_text == chat.choices[0].message.content
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert resp.usage.input_tokens_details.cached_tokens == resp.usage.input_tokens - 1   # the chat's prompt
    assert resp.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")


def test_message_items_and_streaming(server):
    items = [{"role": "system", "content": INSTRUCTIONS},
             {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}]
    whole = server.client().responses.create(model=MODEL, input=items, max_output_tokens=12, temperature=0)
    events = list(server.client().responses.create(model=MODEL, input=items, max_output_tokens=12,
                                                   temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in (
        "response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == chat_reply(server, 12).choices[0].message.content
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == text


@pytest.mark.parametrize("body,param", [
    ({"input": "hi", "tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools"),
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "hi", "store": True}, "store"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ({"input": []}, "input"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "temperature": 5}, "temperature"),
])
def test_what_kiln_does_not_do_is_refused(server, body, param):
    resp = httpx.post(f"{server.url}/v1/responses", json={"model": MODEL, **body}, timeout=30)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_unknown_model_is_404(server):
    with pytest.raises(openai.NotFoundError):
        server.client().responses.create(model="nope", input="hi")


def test_text_format_shapes_the_output(server):
    """text.format json_schema (the Agents SDK's structured output) constrains the reply as chat's response_format
    does; verbosity, an unknown format type and a schema-less json_schema are refused naming `text`."""
    import json
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    fmt = {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}
    completed = 0
    for _ in range(4):                         # sampled (the Responses API has no seed): each that ends is JSON
        resp = server.client().responses.create(model=MODEL, input=QUESTION, text=fmt, max_output_tokens=200,
                                                temperature=1.0)
        assert resp.text.format.type == "json_schema"
        if resp.status == "completed":
            value = json.loads(resp.output_text)
            assert set(value) == {"ok"} and isinstance(value["ok"], bool)
            completed += 1
    assert completed >= 1
    for text in ({"verbosity": "low"}, {"format": {"type": "yaml"}}, {"format": {"type": "json_schema", "name": "x"}}):
        reply = httpx.post(f"{server.url}/v1/responses", json={"model": MODEL, "input": "hi", "text": text}, timeout=30)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "text", reply.text
