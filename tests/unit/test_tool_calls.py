"""runtime/tools.py without a model: validation, the tool-call parser, prompt messages, forced schemas."""

from __future__ import annotations

import json

import pytest

from kiln.runtime.openai_api import APIError
from kiln.runtime.tools import ToolRequest, normalize_messages, parse_tool_calls

pytestmark = pytest.mark.unit
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "time", "parameters": {"type": "object", "properties": {}}}}


def test_several_calls_are_parsed_with_ids_and_json_arguments():
    text = ('Let me check.\n<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>\n'
            '<tool_call>\n{"name": "time", "arguments": {}}\n</tool_call>')
    content, calls = parse_tool_calls(text, forced=False)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["weather", "time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert len({c["id"] for c in calls}) == 2
    assert len(parse_tool_calls(text, forced=False, parallel=False)[1]) == 1


@pytest.mark.parametrize("text", ['<tool_call>{"name": "weather", "arguments": {"city": </tool_call>',
                                  '<tool_call>{"arguments": {}}</tool_call>', "plain answer",
                                  '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>[1]</tool_call>'])
def test_malformed_output_is_left_as_content(text):
    assert parse_tool_calls(text, forced=False) == (text, [])


def test_forced_output_is_the_bare_call():
    content, calls = parse_tool_calls('{"name": "weather", "arguments": {"city": "Rome"}}', forced=True)
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"city": "Rome"}


def test_invalid_tools_and_choices_name_the_field():
    for tools, where in [([{"type": "function", "function": {}}], "tools[0].function.name"),
                         ([WEATHER, {"type": "function", "function": {"name": "x", "parameters": []}}],
                          "tools[1].function.parameters"),
                         ([{"type": "retrieval"}], "tools[0]")]:
        with pytest.raises(APIError, match=where.replace("[", r"\[").replace("]", r"\]")) as e:
            ToolRequest.parse(tools, None, None)
        assert e.value.status == 400 and e.value.param == "tools"
    with pytest.raises(APIError, match="not among tools") as e:
        ToolRequest.parse([WEATHER], {"type": "function", "function": {"name": "nope"}}, None)
    assert e.value.param == "tool_choice"
    with pytest.raises(APIError, match="needs tools"):
        ToolRequest.parse(None, "required", None)


def test_forced_choice_is_a_schema_over_the_allowed_calls():
    named = ToolRequest.parse([WEATHER, TIME], {"type": "function", "function": {"name": "weather"}}, False)
    schema = named.response_format()["json_schema"]["schema"]
    assert schema["properties"]["name"] == {"const": "weather"}
    assert schema["properties"]["arguments"] == WEATHER["function"]["parameters"]
    required = ToolRequest.parse([WEATHER, TIME], "required", None).response_format()["json_schema"]["schema"]
    assert [c["properties"]["name"]["const"] for c in required["anyOf"]] == ["weather", "time"]
    assert ToolRequest.parse([WEATHER], "auto", None).response_format() is None
    assert not ToolRequest.parse([WEATHER], "none", None).active


def test_messages_for_a_template_without_tools():
    req = ToolRequest.parse([WEATHER], "auto", None)
    history = normalize_messages([
        {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    assert history[0]["role"] == "system" and history[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    out = req.messages(history, template_uses_tools=False)
    assert out[0]["role"] == "system" and '"name": "weather"' in out[0]["content"]
    assert out[0]["content"].endswith("Be brief.")
    assert '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>' in out[2]["content"]
    assert out[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}
    assert req.messages(history, template_uses_tools=True)[0] == history[0]


def test_streamed_text_is_held_back_only_where_a_call_may_start():
    from kiln.runtime.protocol import StreamDelta
    from kiln.runtime.tools import ToolReply
    reply = ToolReply("chat", "m", 3, lambda t: ("", b""), tools=ToolRequest.parse([WEATHER], "auto", None))
    pieces = ["Hello", " there <tool", '_call>{"name": "weather", "arguments": {"city": "Oslo"}}', "</tool_call>"]
    chunks = [reply.add(StreamDelta(0, p, [1])) for p in pieces]
    chunks.append(reply.add(StreamDelta(0, "", [], finish_reason="stop")))
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c)
    assert content == "Hello there "
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls" and last["delta"]["tool_calls"][0]["function"]["name"] == "weather"
    final = reply.final()["choices"][0]
    assert final["message"]["content"] == "Hello there" and final["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("text", [
    "Plain text with a < and a <tool that never becomes a tag.",
    'Let me look. <tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>',
    'Text, then a broken call <tool_call>{"name": 3}</tool_call> and more <tool_ca',
    "ends with a partial tag <tool_c",
])
def test_streamed_content_is_the_text_before_any_tag_however_the_text_is_split(text):
    """Each chunk looks at its own text and the held tail only; what goes out is still the text up
    to the first `<tool_call>` (or all of it, if no valid call), for every way of splitting it."""
    import random
    from kiln.runtime.protocol import StreamDelta
    from kiln.runtime.tools import ToolReply
    calls = parse_tool_calls(text, forced=False)[1]
    for seed in range(30):
        rng = random.Random(seed)
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(12, len(text) - 1))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        reply = ToolReply("chat", "m", 3, lambda t: ("", b""), tools=ToolRequest.parse([WEATHER], "auto", None))
        streamed, before_end = [], []
        for k, piece in enumerate(pieces):
            chunk = reply.add(StreamDelta(0, piece, [k]))
            if chunk:
                streamed.append(chunk["choices"][0]["delta"].get("content") or "")
        before_end = "".join(streamed)
        last = reply.add(StreamDelta(0, "", [], finish_reason="stop"))["choices"][0]
        at = text.find("<tool_call>")
        assert before_end == (text if at < 0 else text[:at])[:len(before_end)]
        assert len(before_end) >= (at if at >= 0 else len(text) - len("<tool_call>") + 1)
        if calls:
            assert last["finish_reason"] == "tool_calls" and "content" not in last["delta"]
        else:
            assert before_end + (last["delta"].get("content") or "") == text


def test_a_streamed_chunk_does_not_read_the_whole_text(monkeypatch):
    """The reply's text is joined once, when the choice ends, not at every chunk (quadratic)."""
    from kiln.runtime import protocol
    from kiln.runtime.protocol import StreamDelta
    from kiln.runtime.tools import ToolReply
    reads = []
    join = protocol.GrowingText.__str__
    monkeypatch.setattr(protocol.GrowingText, "__str__", lambda self: reads.append(1) or join(self))
    reply = ToolReply("chat", "m", 3, lambda t: ("", b""), tools=ToolRequest.parse([WEATHER], "auto", None))
    for k in range(200):
        reply.add(StreamDelta(0, "word ", [k]))
    reply.add(StreamDelta(0, "<tool", [200]))                  # held: it could start a call
    assert reads == []
    assert reply.add(StreamDelta(0, "", [], finish_reason="stop"))["choices"][0]["delta"]["content"] == "<tool"
    assert len(reads) == 1


def test_a_forced_call_refuses_a_response_format():
    req = ToolRequest.parse([WEATHER], "required", None)
    assert req.forced_format({"type": "text"}) == req.response_format()
    with pytest.raises(APIError, match="response_format cannot be combined") as e:
        req.forced_format({"type": "json_object"})
    assert e.value.param == "response_format"
