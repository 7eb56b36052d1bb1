"""runtime/responses_api.py messages_of: Responses API input items as the chat messages a template renders,
with reasoning items attached to the assistant turn they belong to."""

from __future__ import annotations

import pytest

from kiln.runtime.openai_api import APIError
from kiln.runtime.responses_api import ResponsesRequest, messages_of

pytestmark = pytest.mark.unit
USER = {"role": "user", "content": "Weather in Paris?"}
THOUGHT = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Need the tool."}]}
CALL = {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}'}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "12 degrees"}
ANSWER = {"role": "assistant", "content": "It is 12 degrees."}


def _messages(*items, instructions=None):
    return messages_of(ResponsesRequest(input=list(items), instructions=instructions))


def _turns(messages):
    return [(m["role"], m.get("reasoning"), [c["function"]["name"] for c in m.get("tool_calls", [])], m["content"])
            for m in messages]


def test_reasoning_before_a_call_is_the_calls_turn():
    """Codex's tool loop: reasoning, function_call, function_call_output: the reasoning reasons the call's turn,
    before the tool's output, not the turn after it."""
    got = _turns(_messages(USER, THOUGHT, CALL, OUTPUT, ANSWER))
    assert got == [("user", None, [], "Weather in Paris?"), ("assistant", "Need the tool.", ["weather"], ""),
                   ("tool", None, [], "12 degrees"), ("assistant", None, [], "It is 12 degrees.")]


def test_reasoning_then_text_then_a_call_is_one_turn():
    said = {"role": "assistant", "content": "Let me check."}
    got = _turns(_messages(USER, THOUGHT, said, CALL, OUTPUT))
    assert got[1] == ("assistant", "Need the tool.", ["weather"], "Let me check.")
    assert [t[0] for t in got] == ["user", "assistant", "tool"]


def test_reasoning_before_an_answer_and_at_the_end():
    got = _turns(_messages(USER, THOUGHT, ANSWER, USER, THOUGHT, instructions="Be brief."))
    assert got == [("system", None, [], "Be brief."), ("user", None, [], "Weather in Paris?"),
                   ("assistant", "Need the tool.", [], "It is 12 degrees."), ("user", None, [], "Weather in Paris?"),
                   ("assistant", "Need the tool.", [], "")]


def test_a_call_without_its_id_is_refused_by_position():
    with pytest.raises(APIError, match=r"input\[1\]: a function_call item needs its call_id"):
        _messages(USER, {k: v for k, v in CALL.items() if k != "call_id"})
