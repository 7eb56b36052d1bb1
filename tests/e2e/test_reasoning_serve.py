"""`kiln serve --reasoning-parser` through the openai client: a chat reply's reasoning as `reasoning` (and
`reasoning_content`) apart from its content, with the tokens a completions request for the same prompt
ids gives (the tiny model is random, so its text never closes <think>: the template opens it, as
DeepSeek-R1's does, or closes it, as Qwen3's does with enable_thinking false)."""

from __future__ import annotations

import pytest

from kiln.runtime.engine import EngineConfig
from kiln.runtime.server import ServerArgs
from test_server import running_server

pytestmark = [pytest.mark.e2e]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
            "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}")
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def served(tiny_artifacts):
    args = ServerArgs(model_name="tiny", engine=EngineConfig(chat_template=TEMPLATE))
    with running_server(tiny_artifacts["tied"], args) as s:
        yield s


def _completed(server, **variables) -> str:
    """The greedy text of a completions request for the chat's own prompt ids."""
    tok = server.engine.engine.tokenizer
    ids = tok.encode(tok.apply_chat_template(HELLO, **variables), add_special_tokens=False)
    reply = server.client().completions.create(model="tiny", prompt=ids, max_tokens=12, temperature=0)
    return reply.choices[0].text


def test_reasoning_is_apart_from_content(served):
    client, expected = served.client(), _completed(served)
    assert expected
    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=0)
    message = reply.choices[0].message
    assert message.reasoning == message.reasoning_content == expected       # cut off inside <think>
    assert message.content is None
    stream = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=0, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join(getattr(d, "reasoning", None) or "" for d in deltas) == expected
    assert not "".join(d.content or "" for d in deltas)


def test_a_prompt_that_closed_think_answers_in_content(served):
    expected = _completed(served, enable_thinking=False)
    reply = served.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=0,
                                                    extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = reply.choices[0].message
    assert message.content == expected and getattr(message, "reasoning", None) is None


def test_parser_none_leaves_the_text_whole(tiny_artifacts, served):
    expected = _completed(served)
    args = ServerArgs(model_name="tiny", engine=EngineConfig(chat_template=TEMPLATE), reasoning_parser="none")
    with running_server(tiny_artifacts["tied"], args) as s:
        reply = s.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=0)
    message = reply.choices[0].message
    assert message.content == expected and getattr(message, "reasoning", None) is None


def test_responses_give_reasoning_items(served):
    """/v1/responses: the reasoning as a `reasoning` item (reasoning_text) before an (empty) message, in the reply
    and as the SDK's stream events; reasoning items sent back as input reach the template as the assistant
    turn's reasoning; reasoning.summary and an effort the template never reads are refused."""
    import openai
    client, expected = served.client(), _completed(served)
    resp = client.responses.create(model="tiny", input=HELLO, max_output_tokens=12, temperature=0)
    assert [item.type for item in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content[0].text == expected and resp.output_text == ""
    assert resp.usage.output_tokens_details.reasoning_tokens == resp.usage.output_tokens == 12
    events = list(client.responses.create(model="tiny", input=HELLO, max_output_tokens=12, temperature=0,
                                          stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == expected
    assert [e.item.type for e in events if e.type == "response.output_item.done"] == ["reasoning", "message"]
    assert events[-1].response.output[0].content[0].text == expected
    back = [*HELLO, {"type": "reasoning", "id": "rs_1", "summary": [],
                     "content": [{"type": "reasoning_text", "text": "I think"}]},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again."}]
    tok = served.engine.engine.tokenizer
    seen = []
    real = tok.apply_chat_template
    tok.apply_chat_template = lambda messages, **kw: seen.append(messages) or real(messages, **kw)
    try:
        client.responses.create(model="tiny", input=back, max_output_tokens=1)
    finally:
        del tok.apply_chat_template
    assert seen[-1][1]["reasoning"] == seen[-1][1]["reasoning_content"] == "I think"
    with pytest.raises(openai.BadRequestError, match="reasoning"):
        client.responses.create(model="tiny", input=HELLO, reasoning={"summary": "auto"})
    with pytest.raises(openai.BadRequestError, match="reads no variable 'reasoning_effort'"):
        client.responses.create(model="tiny", input=HELLO, reasoning={"effort": "low"})


def test_response_format_shapes_the_answer_not_the_thinking(served):
    """json_object with a reasoning model: while the reply reasons (the template opened <think>) the grammar waits,
    so the text is the unconstrained greedy text, all reasoning; where the prompt closed <think>, the grammar
    shapes the reply from its first token: JSON content."""
    import json
    client, expected = served.client(), _completed(served)
    json_mode = {"type": "json_object"}
    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=0,
                                           response_format=json_mode)
    assert reply.choices[0].message.reasoning == expected and reply.choices[0].message.content is None
    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=64, temperature=0,
                                           response_format=json_mode,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:                                      # cut off by max_tokens: still JSON's start
        assert reply.choices[0].message.content.lstrip().startswith("{")


def test_messages_give_thinking_blocks(served):
    """/v1/messages (the anthropic SDK): the reasoning as a thinking block before an (empty) text block, collected
    or streamed; thinking {"type": "disabled"} is the template's enable_thinking false (<think> closed: the text
    is the completion of that prompt, as content), "omitted" keeps the block without its text; an assistant
    turn's thinking block sent back reaches the template as its reasoning."""
    import anthropic
    client = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
    expected, greedy = _completed(served), {"temperature": 0}
    msg = client.messages.create(model="tiny", max_tokens=12, messages=HELLO, extra_body=greedy)
    assert [(b.type, getattr(b, "thinking", None) or b.text if b.type == "text" else b.thinking)
            for b in msg.content] == [("thinking", expected), ("text", "")]
    with client.messages.stream(model="tiny", max_tokens=12, messages=HELLO, extra_body=greedy) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == expected
    plain = client.messages.create(model="tiny", max_tokens=12, messages=HELLO, extra_body=greedy,
                                   thinking={"type": "disabled"})
    assert [b.type for b in plain.content] == ["text"]
    assert plain.content[0].text == _completed(served, enable_thinking=False)
    hidden = client.messages.create(model="tiny", max_tokens=12, messages=HELLO, extra_body=greedy,
                                    thinking={"type": "adaptive", "display": "omitted"})
    assert hidden.content[0].type == "thinking" and hidden.content[0].thinking == ""
    tok = served.engine.engine.tokenizer
    seen = []
    real = tok.apply_chat_template
    tok.apply_chat_template = lambda messages, **kw: seen.append(messages) or real(messages, **kw)
    try:
        client.messages.create(model="tiny", max_tokens=1, messages=[
            *HELLO, {"role": "assistant", "content": [{"type": "thinking", "thinking": "I think", "signature": ""},
                                                      {"type": "text", "text": "Hello."}]},
            {"role": "user", "content": "Again."}])
    finally:
        del tok.apply_chat_template
    assert seen[-1][1]["reasoning"] == "I think" and seen[-1][1]["content"] == "Hello."
