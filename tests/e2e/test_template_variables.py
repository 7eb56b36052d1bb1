"""reasoning_effort (OpenAI's chat field), documents and chat_template_kwargs (vLLM's extensions) reach the chat
template as its variables (gpt-oss's template reads reasoning_effort; Qwen3's enable_thinking), through the
real server and the openai client; a variable the template never reads is refused, not ignored."""

from __future__ import annotations

import openai
import pytest

from kiln.runtime.engine import EngineConfig
from kiln.runtime.server import ServerArgs
from test_server import running_server

pytestmark = [pytest.mark.e2e]
TEMPLATE = ("{% if reasoning_effort is defined %}Reasoning: {{ reasoning_effort }}\n{% endif %}"
            "{% if enable_thinking is defined and not enable_thinking %}/no_think\n{% endif %}"
            "{% for d in documents or [] %}<doc title={{ d.title }}>{{ d.text }}</doc>\n{% endfor %}"
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "<|im_start|>assistant\n")
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(tiny_artifacts):
    args = ServerArgs(model_name="tiny", engine=EngineConfig(chat_template=TEMPLATE))
    with running_server(tiny_artifacts["tied"], args) as s:
        yield s.client()


def _prompt_tokens(client, **extra) -> int:
    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=1, temperature=0, **extra)
    return reply.usage.prompt_tokens


def test_reasoning_effort_and_template_kwargs_reach_the_template(client):
    plain = _prompt_tokens(client)
    low = _prompt_tokens(client, reasoning_effort="low")
    high = _prompt_tokens(client, reasoning_effort="high")
    assert low > plain and high > plain                       # "Reasoning: low\n" rendered before the turn
    assert _prompt_tokens(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}}) > plain
    assert _prompt_tokens(client, extra_body={"chat_template_kwargs": {"enable_thinking": True}}) == plain
    docs = [{"title": "kiln", "text": "A compiler."}, {"title": "tvm", "text": "Its compiler."}]
    assert _prompt_tokens(client, extra_body={"documents": docs[:1]}) < _prompt_tokens(client,
                                                                                        extra_body={"documents": docs})


def test_variables_the_template_does_not_read_are_refused(client, tiny_artifacts):
    with pytest.raises(openai.BadRequestError, match="reads no variable 'thinking_budget'"):
        _prompt_tokens(client, extra_body={"chat_template_kwargs": {"thinking_budget": 5}})
    with pytest.raises(openai.BadRequestError, match="may not set 'messages'"):
        _prompt_tokens(client, extra_body={"chat_template_kwargs": {"messages": []}})
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        _prompt_tokens(client, reasoning_effort="extreme")
    args = ServerArgs(model_name="tiny")                        # ChatML's template reads no reasoning_effort
    with running_server(tiny_artifacts["tied"], args) as s:
        with pytest.raises(openai.BadRequestError, match="reads no variable 'reasoning_effort'"):
            s.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=1, reasoning_effort="low")
        with pytest.raises(openai.BadRequestError, match="reads no variable 'documents'"):
            s.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=1,
                                               extra_body={"documents": [{"text": "x"}]})
