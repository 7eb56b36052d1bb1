"""runtime/reasoning.py: a chat reply's reasoning apart from its content, however the text is cut into
stream pieces; and the chat Reply / ToolReply that carry it (`reasoning`, `reasoning_content`)."""

from __future__ import annotations

import functools

import pytest

from kiln.runtime import openai_api as api
from kiln.runtime import reasoning, tools
from kiln.runtime.protocol import StreamDelta

HARMONY_PROMPT = "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant"
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def splits(text: str):
    """Every way of cutting text in two, and in three with the second cut 1-6 characters on."""
    for a in range(len(text) + 1):
        yield [text[:a], text[a:]]
        for b in range(a + 1, min(a + 7, len(text) + 1)):
            yield [text[:a], text[a:b], text[b:]]


def parsed(kind: str, prompt: str, text: str) -> set[tuple[str, str]]:
    """The (reasoning, content) the parser gives for text, over every cut: one element if cuts never matter."""
    out = set()
    for pieces in splits(text):
        parser, r, c = reasoning.start(kind, prompt), [], []
        for piece in pieces:
            a, b = parser.feed(piece)
            r.append(a), c.append(b)
        a, b = parser.finish()
        out.add(("".join(r + [a]), "".join(c + [b])))
    return out


@pytest.mark.parametrize("prompt, text, expected", [
    ("<|im_start|>assistant\n", "<think>\nWhat is 2+2?\n</think>\n\nIt is 4.", ("\nWhat is 2+2?\n", "It is 4.")),
    ("<|im_start|>assistant\n", "\n<think>a</think>b", ("a", "b")),          # whitespace before <think>
    ("<｜Assistant｜><think>\n", "2+2 is 4.</think>\n\nIt is 4.", ("2+2 is 4.", "It is 4.")),   # R1 opens it
    ("<think>\n\n</think>\n\n", "It is 4.", ("", "It is 4.")),                 # Qwen3 enable_thinking false
    ("<|im_start|>assistant\n", "It is 4. <think>x</think>", ("", "It is 4. <think>x</think>")),
    ("<|im_start|>assistant\n", "<think>cut off </thi", ("cut off </thi", "")),
    ("<|im_start|>assistant\n", "  <thin", ("", "  <thin")),                # never became a tag
    ("<|im_start|>assistant\n", "<think>a</think>", ("a", "")),
    # an earlier turn's reasoning kept in the prompt (Qwen3's tool loops): the new reply still opens its own
    ("<think>a</think>b<|im_end|>\n<|im_start|>tool\nc<|im_end|>\n<|im_start|>assistant\n", "<think>x</think>y",
     ("x", "y")),
])
def test_think_tags(prompt, text, expected):
    assert parsed(reasoning.THINK, prompt, text) == {expected}


@pytest.mark.parametrize("prompt, text, expected", [
    (HARMONY_PROMPT, "<|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final"
                     "<|message|>It is 4.", ("User asks 2+2.", "It is 4.")),
    (HARMONY_PROMPT, "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
                     'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}', ("Need weather.", CALL)),
    (HARMONY_PROMPT, ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}', ("", CALL)),
    (HARMONY_PROMPT, "<|channel|>commentary<|message|>Looking it up.<|end|>", ("", "Looking it up.")),  # a preamble
    (HARMONY_PROMPT, '{"answer": 4}', ("", '{"answer": 4}')),           # not Harmony (a grammar's JSON): content
    (HARMONY_PROMPT + "<|channel|>final<|message|>", "It is 4.", ("", "It is 4.")),   # the prompt opened final
    ("no Harmony in this prompt", "<|channel|>final<|message|>x", ("", "<|channel|>final<|message|>x")),
    (HARMONY_PROMPT, "<|channel|>analysis<|message|>cut off", ("cut off", "")),
    (HARMONY_PROMPT, "<|channel|>analysis<|mess", ("", "")),             # a header cut off is no text
])
def test_harmony_channels(prompt, text, expected):
    assert parsed(reasoning.HARMONY, prompt, text) == {expected}


GEMMA4_PROMPT = "<|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n"
G4_CALL = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'


@pytest.mark.parametrize("prompt, text, expected", [
    (GEMMA4_PROMPT, "<|channel>thought\nUser asks 2+2.<channel|>It is 4.", ("User asks 2+2.", "It is 4.")),
    (GEMMA4_PROMPT, "It is 4.", ("", "It is 4.")),                      # thinking off: all content
    (GEMMA4_PROMPT, "<|channel>thought\nNeed weather.<channel|>" + G4_CALL, ("Need weather.", CALL)),
    (GEMMA4_PROMPT, "Checking." + G4_CALL + G4_CALL, ("", "Checking." + CALL + CALL)),      # two calls
    (GEMMA4_PROMPT + "<|channel>thought\n", "still in it<channel|>done", ("still in it", "done")),   # opened
    (GEMMA4_PROMPT, "<|channel>thought\ncut off", ("cut off", "")),
    (GEMMA4_PROMPT, "x<|tool_call>call:f{a:1", ("", "x<|tool_call>call:f{a:1")),          # a call cut off
    (GEMMA4_PROMPT, "<|tool_call>not a call<tool_call|>", ("", "<|tool_call>not a call<tool_call|>")),
    (GEMMA4_PROMPT, "a <|chan and |> bits", ("", "a <|chan and |> bits")),     # never became a tag
])
def test_gemma4_thought_channel_and_calls(prompt, text, expected):
    assert parsed(reasoning.GEMMA4, prompt, text) == {expected}


@pytest.mark.parametrize("args, expected", [
    ('{city:<|"|>Paris, "FR"<|"|>,days:3}', {"city": 'Paris, "FR"', "days": 3}),
    ('{a:true,b:null,c:-1.5e3,d:[<|"|>x<|"|>,{e:<|"|>y: z<|"|>}]}', {"a": True, "b": None, "c": -1500.0,
                                                                  "d": ["x", {"e": "y: z"}]}),
    ('{"quoted":"as JSON","n":1}', {"quoted": "as JSON", "n": 1}),
    ("", {}),
])
def test_gemma4_arguments_become_json(args, expected):
    import json
    call = reasoning.gemma4_call(f"call:tool{args}")
    assert json.loads(call.removeprefix("<tool_call>").removesuffix("</tool_call>")) == {"name": "tool",
                                                                                       "arguments": expected}


def test_detect_and_resolve():
    harmony = "{{- '<|start|>assistant<|channel|>analysis<|message|>' + m.thinking + '<|end|>' }}"
    qwen3 = "{%- if '</think>' in content %}{%- set reasoning_content = ... %}{% endif %}"
    assert reasoning.detect(harmony) == reasoning.HARMONY and reasoning.detect(qwen3) == reasoning.THINK
    assert reasoning.detect("{{ messages }}") is None and reasoning.detect(None) is None
    assert reasoning.detect([{"name": "default", "template": qwen3}]) == reasoning.THINK
    assert reasoning.resolve("auto", qwen3) == reasoning.THINK
    assert reasoning.resolve("none", qwen3) is None
    assert reasoning.resolve("harmony", "{{ messages }}") == reasoning.HARMONY
    gemma4 = "{{ '<|turn>model\\n' }}{% if thinking %}<|channel>thought\\n{{ m.reasoning }}<channel|>{% endif %}"
    assert reasoning.detect(gemma4) == reasoning.GEMMA4 and reasoning.detect("<|tool_call>") == reasoning.GEMMA4
    assert reasoning.detect("{{ '<|turn>model\\n' }}") == reasoning.GEMMA4           # any Gemma 4 template
    with pytest.raises(ValueError, match="must be one of auto, none, think, harmony, gemma4"):
        reasoning.resolve("deepseek", None)


def _streamed(reply: api.Reply, text: str, step: int) -> list[dict]:
    pieces = [text[i:i + step] for i in range(0, len(text), step)]
    chunks = [reply.add(StreamDelta(0, p, [7], "stop" if k == len(pieces) - 1 else None))
              for k, p in enumerate(pieces)]
    return [c["choices"][0] for c in chunks if c is not None]


def _joined(chunks: list[dict], key: str) -> str:
    return "".join(c["delta"].get(key) or "" for c in chunks)


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_chat_reply_carries_reasoning_in_stream_and_message(step):
    text = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer."
    reply = api.Reply("chat", "m", 5, lambda t: ("x", b"x"),
                      reasoning=functools.partial(reasoning.start, reasoning.HARMONY, HARMONY_PROMPT))
    chunks = _streamed(reply, text, step)
    assert _joined(chunks, "reasoning") == _joined(chunks, "reasoning_content") == "Think."
    assert _joined(chunks, "content") == "Answer."
    assert chunks[0]["delta"]["role"] == "assistant" and chunks[-1]["finish_reason"] == "stop"
    message = reply.final()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Answer.", "reasoning": "Think.",
                       "reasoning_content": "Think."}


def test_reply_cut_off_in_reasoning_has_null_content():
    reply = api.Reply("chat", "m", 5, lambda t: ("x", b"x"),
                      reasoning=functools.partial(reasoning.start, reasoning.THINK, "<think>\n"))
    _streamed(reply, "still thinking", 4)
    message = reply.final()["choices"][0]["message"]
    assert message["content"] is None and message["reasoning"] == "still thinking"


def test_without_a_parser_nothing_changes():
    reply = api.Reply("chat", "m", 5, lambda t: ("x", b"x"))
    chunks = _streamed(reply, "<think>a</think>b", 2)
    assert _joined(chunks, "content") == "<think>a</think>b" and not _joined(chunks, "reasoning")
    assert reply.final()["choices"][0]["message"] == {"role": "assistant", "content": "<think>a</think>b"}


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_harmony_function_call_becomes_tool_calls(step):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    request = tools.ToolRequest.parse([tool], None, None)
    text = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}')
    reply = tools.ToolReply("chat", "m", 5, lambda t: ("x", b"x"), tools=request,
                            reasoning=functools.partial(reasoning.start, reasoning.HARMONY, HARMONY_PROMPT))
    chunks = _streamed(reply, text, step)
    assert _joined(chunks, "reasoning") == "Need weather." and not _joined(chunks, "content")
    calls = [c for chunk in chunks for c in chunk["delta"].get("tool_calls", [])]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("get_weather",
                                                                                     '{"city": "Paris"}')]
    assert chunks[-1]["finish_reason"] == "tool_calls"
    choice = reply.final()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["reasoning"] == "Need weather."
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'


@pytest.mark.parametrize("step", [1, 7, 1000])
def test_gemma4_call_becomes_tool_calls(step):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    request = tools.ToolRequest.parse([tool], None, None)
    reply = tools.ToolReply("chat", "m", 5, lambda t: ("x", b"x"), tools=request,
                            reasoning=functools.partial(reasoning.start, reasoning.GEMMA4, GEMMA4_PROMPT))
    chunks = _streamed(reply, "<|channel>thought\nNeed weather.<channel|>" + G4_CALL, step)
    assert _joined(chunks, "reasoning") == "Need weather." and not _joined(chunks, "content")
    calls = [c for chunk in chunks for c in chunk["delta"].get("tool_calls", [])]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("get_weather",
                                                                                     '{"city": "Paris"}')]
    choice = reply.final()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["reasoning"] == "Need weather."


def test_past_reasoning_reaches_the_template_under_every_name():
    """A client sends an assistant turn's reasoning back as `reasoning` (vLLM), `reasoning_content` (DeepSeek,
    Qwen3's template) or `thinking` (gpt-oss's template): the template finds it under the name it reads."""
    for key in ("reasoning", "reasoning_content", "thinking"):
        turn = api.ChatMessageParam(role="assistant", content="4", **{key: "2 + 2 is 4"})
        (message,) = api.chat_messages([turn])
        assert {k: message[k] for k in ("reasoning", "reasoning_content", "thinking")} == dict.fromkeys(
            ("reasoning", "reasoning_content", "thinking"), "2 + 2 is 4")
    (user,) = api.chat_messages([api.ChatMessageParam(role="user", content="hi", thinking="x")])
    assert "reasoning" not in user
