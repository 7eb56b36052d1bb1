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
