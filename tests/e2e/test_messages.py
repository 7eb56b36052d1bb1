"""Anthropic's Messages API (POST /v1/messages) through the official anthropic SDK, against the tiny compiled Llama:
a message carries the chat path's text and token counts, collected or streamed (the SDK's stream helper
assembles the same message), stop_sequences end it with stop_reason "stop_sequence" naming the string,
count_tokens gives the prompt's length, a repeated prompt's tokens come back as cache_read_input_tokens, the
API key is read from x-api-key, and what kiln cannot do is refused with a 400 in Anthropic's error shape.
(Tool use: tests/e2e/test_tools.py; thinking blocks: tests/e2e/test_reasoning_serve.py.)"""

from __future__ import annotations

import anthropic
import httpx
import pytest

from kiln.runtime.engine import EngineConfig
from kiln.runtime.server import ServerArgs
from test_server import running_server

pytestmark = [pytest.mark.e2e]
MODEL = "tiny-messages"
KEY = "sk-kiln-messages"
SYSTEM = "You answer in one line."
ASK = [{"role": "user", "content": "Tell me about the sea."}]
GREEDY = {"temperature": 0}          # (sampling fields: extra_body, as newer SDKs leave them out of create())


@pytest.fixture(scope="module", params=["engine-thread", "engine-process"])
def server(tiny_artifacts, request):
    """The engine stepped by a thread of the server's process, and in a process of its own (the deltas' stop
    strings and cached-token counts cross the pipe)."""
    args = ServerArgs(model_name=MODEL, api_key=KEY, engine=EngineConfig(max_num_seqs=4))
    with running_server(tiny_artifacts["tied"], args, engine_process=request.param == "engine-process") as s:
        yield s


@pytest.fixture
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


def test_message_is_the_chat_reply_collected_or_streamed(server, client):
    chat = server.client(KEY).chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": SYSTEM}, *ASK], max_tokens=12, extra_body=GREEDY)
    msg = client.messages.create(model=MODEL, max_tokens=12, system=SYSTEM, messages=ASK, extra_body=GREEDY)
    assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL and msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == chat.choices[0].message.content
    assert msg.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason]
    assert msg.stop_sequence is None
    u = msg.usage
    assert u.input_tokens + u.cache_read_input_tokens == chat.usage.prompt_tokens
    assert u.cache_read_input_tokens == chat.usage.prompt_tokens - 1        # the chat's prompt, cached
    assert u.output_tokens == chat.usage.completion_tokens
    with client.messages.stream(model=MODEL, max_tokens=12, system=[{"type": "text", "text": SYSTEM}],
                                messages=ASK, extra_body=GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == final.content[0].text == msg.content[0].text
    assert final.stop_reason == msg.stop_reason and final.usage.output_tokens == u.output_tokens
    counted = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=ASK)
    assert counted.input_tokens == chat.usage.prompt_tokens


def test_stop_sequences_end_the_message_naming_the_string(client):
    text = client.messages.create(model=MODEL, max_tokens=24, system=SYSTEM, messages=ASK,
                                  extra_body=GREEDY).content[0].text
    assert len(text) >= 6, text
    stop = text[len(text) // 2:len(text) // 2 + 3]           # (its first place may be before the middle)
    msg = client.messages.create(model=MODEL, max_tokens=24, system=SYSTEM, messages=ASK, extra_body=GREEDY,
                                 stop_sequences=["\x00never", stop])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert msg.content[0].text == text[:text.index(stop)]
    with client.messages.stream(model=MODEL, max_tokens=24, system=SYSTEM, messages=ASK, extra_body=GREEDY,
                                stop_sequences=[stop]) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == ("stop_sequence", stop,
                                                                                  msg.content[0].text)


def test_a_conversation_with_content_blocks(client):
    """Earlier turns as blocks (the assistant's text among them) render as the same prompt as plain text."""
    turns = [*ASK, {"role": "assistant", "content": [{"type": "text", "text": "It is wide."}]},
             {"role": "user", "content": [{"type": "text", "text": "And ", "cache_control": {"type": "ephemeral"}},
                                          {"type": "text", "text": "deep?"}]}]
    plain = [*ASK, {"role": "assistant", "content": "It is wide."}, {"role": "user", "content": "And deep?"}]
    blocks = client.messages.create(model=MODEL, max_tokens=6, system=SYSTEM, messages=turns, extra_body=GREEDY)
    text = client.messages.create(model=MODEL, max_tokens=6, system=SYSTEM, messages=plain, extra_body=GREEDY)
    assert blocks.content[0].text == text.content[0].text
    assert client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=turns).input_tokens == \
        text.usage.input_tokens + text.usage.cache_read_input_tokens


@pytest.mark.parametrize("change, refusal", [
    (dict(thinking={"type": "enabled", "budget_tokens": 1024}), "budget_tokens"),
    (dict(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]),
     "'image' block"),
    (dict(messages=[*ASK, {"role": "assistant", "content": "The sea is"}]), "prefilled assistant"),
    (dict(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "client tools only"),
    (dict(extra_body={"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}),   # (a beta
     "clear context kiln keeps"),                                                                # field)
    (dict(extra_body={"temperature": -1.0}), "temperature"),
    (dict(model="nope"), "does not exist"),
], ids=["thinking-budget", "image", "prefill", "server-tool", "clearing-context", "temperature", "model"])
def test_what_kiln_cannot_do_is_refused(client, change, refusal):
    body = {**dict(model=MODEL, max_tokens=4, messages=ASK), **change}
    with pytest.raises((anthropic.BadRequestError, anthropic.NotFoundError), match=refusal):
        client.messages.create(**body)


def test_errors_come_in_anthropics_shape(server):
    url = f"{server.url}/v1/messages"
    missing = httpx.post(url, json={"model": MODEL, "messages": ASK}, headers={"x-api-key": KEY})
    assert missing.status_code == 400
    assert missing.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                         "message": "max_tokens is required"}}
    unknown = httpx.post(url, json={"model": MODEL, "max_tokens": 4, "messages": ASK, "service_tier": "auto"},
                         headers={"x-api-key": KEY})
    assert unknown.status_code == 400 and "service_tier is not supported" in unknown.json()["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=4, messages=ASK)
    assert e.value.body["error"]["type"] == "authentication_error"
    chat = httpx.post(f"{server.url}/v1/chat/completions", json={"model": MODEL, "messages": ASK},
                      headers={"x-api-key": "wrong"})
    assert chat.status_code == 401 and chat.json()["error"]["code"] == "invalid_api_key"   # OpenAI's shape there


def test_claude_codes_request_is_served(server, client):
    """What Claude Code sends every request (captured from its CLI, 2.1.197): max_tokens 32000 (cut to the context's
    room), thinking adaptive and effort high (the tiny ChatML template has neither switch: the effort is named
    unapplied in the kiln-unapplied header), context_management clearing nothing, a system message among the
    messages, cache_control on blocks, metadata.user_id; streamed."""
    body = dict(model=MODEL, max_tokens=32000, stream=True, thinking={"type": "adaptive"},
                output_config={"effort": "high"},
                context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                metadata={"user_id": '{"session_id": "s"}'},
                system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
                messages=[{"role": "user", "content": [{"type": "text", "text": "hello",
                                                        "cache_control": {"type": "ephemeral"}}]},
                          {"role": "system", "content": "Today is Saturday."}])
    with httpx.stream("POST", f"{server.url}/v1/messages?beta=true", json=body,
                      headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"}, timeout=600) as reply:
        assert reply.status_code == 200, reply.read()
        assert "output_config.effort" in reply.headers["kiln-unapplied"]
        events = [line.removeprefix("event: ") for line in reply.iter_lines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]


def test_max_tokens_beyond_the_context_is_cut_to_its_room(server, client):
    """max_tokens past what the context leaves generates up to the context's end: stop_reason
    model_context_window_exceeded where it gets there (max_tokens where it was asked for exactly that), as the chat
    path's finish_reason length for max_tokens = the room says."""
    prompt = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=ASK).input_tokens
    room = server.engine.engine.artifact.context_window - prompt
    chat = server.client(KEY).chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": SYSTEM}, *ASK], max_tokens=room, temperature=0)
    filled = chat.choices[0].finish_reason == "length"
    over = client.messages.create(model=MODEL, max_tokens=room + 1000, system=SYSTEM, messages=ASK,
                                  extra_body=GREEDY)
    assert over.stop_reason == ("model_context_window_exceeded" if filled else "end_turn")
    assert over.usage.output_tokens == chat.usage.completion_tokens
    exact = client.messages.create(model=MODEL, max_tokens=room, system=SYSTEM, messages=ASK, extra_body=GREEDY)
    assert exact.stop_reason == ("max_tokens" if filled else "end_turn")
