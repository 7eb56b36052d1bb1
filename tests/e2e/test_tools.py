"""Tool calling through the official openai SDK and langchain-openai, against a tiny compiled model.

The tiny model is random, so its free text never holds a call: these tests force calls with
tool_choice (xgrammar keeps the output to the allowed calls' JSON) and check what comes back, and
render prompts through both a template that uses `tools` (Qwen-like, set below) and one that does
not (the tiny tokenizer's ChatML, which gets kiln's default tool block).
"""

from __future__ import annotations

import contextlib
import gc
import json
import socket
import threading
from pathlib import Path
from typing import Literal

import openai
import pytest
import uvicorn
from pydantic import BaseModel

from kiln.runtime import tools
from kiln.runtime.async_engine import AsyncEngine
from kiln.runtime.engine import Engine, EngineConfig
from kiln.runtime.host_memory import freeze_startup_objects
from kiln.runtime.server import ServerArgs, create_app
from test_openapi_replies import documented
from test_server import Server, wait_for
from tiny_models import write_tiny_llama

pytestmark = pytest.mark.e2e
MODEL = "tiny-tools"
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% for c in m.get('tool_calls', []) %}<tool_call>{{ c['function'] | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class Weather(BaseModel):
    city: Literal["Oslo", "Rome", "Lima"]
    celsius: bool


class Clock(BaseModel):
    zone: Literal["UTC", "CET"]


@contextlib.contextmanager
def serving(artifact, config: EngineConfig | None = None):
    """The tiny model served on loopback; yields (Server, its Engine) so a test can swap the template.
    ``config``: the engine's (default: 8 sequences). Like `kiln serve` (runtime/server.py serve_http),
    the objects alive once it has loaded are frozen out of the cyclic collector's sight: here that is
    the whole pytest worker, whose full collections late in a run (every test module's imports
    alive) can hold the GIL, and so the engine thread, for longer than a real server's."""
    engine = Engine(artifact, config or EngineConfig(max_num_seqs=8))
    aengine = AsyncEngine(engine)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(aengine, ServerArgs(model_name=MODEL)), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, what="the server to start")
        freeze_startup_objects()
        yield Server(f"http://127.0.0.1:{sock.getsockname()[1]}", MODEL), engine
    finally:
        gc.unfreeze()                          # the worker's later tests collect as before
        server.should_exit = True
        thread.join(timeout=30)
        aengine.stop()
        sock.close()


def long_context_artifact(tmp: Path) -> Path:
    """The tiny Llama with a 2048-token window: tool schemas take hundreds of its 512-vocab tokens."""
    import kiln
    write_tiny_llama(tmp / "model", tied=True, max_position_embeddings=2048)
    return kiln.compile(str(tmp / "model"), target="cpu", quant="q0f32", output=tmp / "art")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serving(long_context_artifact(tmp_path_factory.mktemp("tools"))) as (server, engine):
        yield server, engine


@pytest.fixture(params=["tools-template", "chatml"])
def client(request, served):
    server, engine = served
    config = engine.tokenizer._config
    original = config["chat_template"]
    if request.param == "tools-template":
        config["chat_template"] = TOOLS_TEMPLATE
    try:
        yield server.client()
    finally:
        config["chat_template"] = original


ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


def test_parse_with_pydantic_function_tool(client):
    tool = openai.pydantic_function_tool(Weather)
    got = client.chat.completions.parse(model=MODEL, messages=ASK, tools=[tool], max_tokens=160, n=8,
                                        tool_choice={"type": "function", "function": {"name": "Weather"}})
    for choice in got.choices:
        check_choice(choice)


def check_choice(choice):
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.function.name == "Weather"
    assert isinstance(call.function.parsed_arguments, Weather)
    assert Weather.model_validate_json(call.function.arguments) == call.function.parsed_arguments


def test_required_picks_one_of_the_tools(client):
    tools = [openai.pydantic_function_tool(Weather), openai.pydantic_function_tool(Clock)]
    got = client.chat.completions.create(model=MODEL, messages=ASK, tools=tools, tool_choice="required",
                                         parallel_tool_calls=False, max_tokens=160, temperature=0.8, seed=3)
    calls = got.choices[0].message.tool_calls
    assert len(calls) == 1 and got.choices[0].finish_reason == "tool_calls"
    model = {"Weather": Weather, "Clock": Clock}[calls[0].function.name]
    model.model_validate_json(calls[0].function.arguments)


def test_two_turn_conversation_and_developer_role(client):
    tools = [openai.pydantic_function_tool(Clock)]
    first = client.chat.completions.create(
        model=MODEL, messages=[{"role": "developer", "content": "Use tools."}, *ASK], tools=tools,
        tool_choice={"type": "function", "function": {"name": "Clock"}}, max_tokens=160)
    call = first.choices[0].message.tool_calls[0]
    history = [{"role": "developer", "content": "Use tools."}, *ASK,
               {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": "12:00"}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=tools, max_tokens=8,
                                            temperature=0)
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_streamed_deltas_reassemble_to_the_same_call(client):
    kwargs = dict(model=MODEL, messages=ASK, tools=[openai.pydantic_function_tool(Weather)], max_tokens=160,
                  tool_choice={"type": "function", "function": {"name": "Weather"}}, temperature=0)
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls[0]
    name, args, finish, ids = "", "", None, set()
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            for d in c.delta.tool_calls or []:
                ids.add(d.id) if d.id else None
                name += d.function.name or ""
                args += d.function.arguments or ""
    assert finish == "tool_calls" and len(ids) == 1
    assert (name, json.loads(args)) == (whole.function.name, json.loads(whole.function.arguments))


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "Weather"}}, "auto"])
def test_logprobs_of_every_token_with_tools(served, client, choice):
    """Held-back text (a call, or what might start one) still has its tokens' logprobs: all of them,
    streamed or not, equal to the same prompt's greedy completion without the tool machinery."""
    _, engine = served
    tool = openai.pydantic_function_tool(Weather)
    kwargs = dict(model=MODEL, messages=ASK, tools=[tool], tool_choice=choice, temperature=0, logprobs=True,
                  top_logprobs=2, max_tokens=12 if choice == "auto" else 160)    # (1 alternative where 1 is allowed)
    whole = client.chat.completions.create(**kwargs)
    lps = whole.choices[0].logprobs.content
    assert len(lps) == whole.usage.completion_tokens and all(1 <= len(lp.top_logprobs) <= 2 for lp in lps)
    streamed = [lp for chunk in client.chat.completions.create(**kwargs, stream=True) for c in chunk.choices
                if c.logprobs for lp in c.logprobs.content]
    assert [lp.token for lp in streamed] == [lp.token for lp in lps]
    assert [lp.logprob for lp in streamed] == pytest.approx([lp.logprob for lp in lps], abs=1e-5)

    request = tools.ToolRequest.parse([tool], choice, None)
    ids = tools.render(engine, ASK, request)
    plain = client.completions.create(model=MODEL, prompt=ids, max_tokens=kwargs["max_tokens"], temperature=0,
                                      logprobs=2, extra_body={"response_format": request.response_format()})
    assert plain.choices[0].logprobs.tokens == [lp.token for lp in lps]
    assert plain.choices[0].logprobs.token_logprobs == pytest.approx([lp.logprob for lp in lps], abs=1e-5)
    assert [v for t in plain.choices[0].logprobs.top_logprobs for v in sorted(t.values())] == pytest.approx(
        [v for lp in lps for v in sorted(t.logprob for t in lp.top_logprobs)], abs=1e-5)


def test_tool_call_replies_are_documented(served):
    server, _ = served
    body = {"model": MODEL, "messages": ASK, "tools": [openai.pydantic_function_tool(Weather)], "logprobs": True,
            "tool_choice": "required", "max_tokens": 160}
    assert documented(server.url, "POST", "/v1/chat/completions", json=body)["choices"][0]["message"]["tool_calls"]


def test_tool_choice_none_and_refusals(client):
    got = client.chat.completions.create(model=MODEL, messages=ASK, tools=[openai.pydantic_function_tool(Weather)],
                                         tool_choice="none", max_tokens=4, temperature=0)
    assert got.choices[0].message.tool_calls is None
    bad = {"type": "function", "function": {"name": "w", "parameters": {"type": "array"}}}
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]\.function\.parameters"):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[bad], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, best_of=3)


def test_no_template_is_refused_for_tools(served):
    server, engine = served
    config = engine.tokenizer._config
    original = config.pop("chat_template")
    try:
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            server.client().chat.completions.create(model=MODEL, messages=ASK, max_tokens=4,
                                                    tools=[openai.pydantic_function_tool(Weather)])
    finally:
        config["chat_template"] = original


def test_continuous_usage_stats(served):
    server, _ = served
    chunks = list(server.client().chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=5, stream=True, temperature=0,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counted = [c.usage.completion_tokens for c in chunks if c.choices]
    assert all(c.usage is not None for c in chunks)
    assert counted == sorted(counted) and chunks[-1].usage.completion_tokens == 5


def test_langchain_structured_output_with_function_calling(served):
    from langchain_openai import ChatOpenAI
    server, _ = served
    llm = ChatOpenAI(model=MODEL, base_url=f"{server.url}/v1", api_key="unused", max_tokens=160, max_retries=0)
    got = llm.with_structured_output(Weather, method="function_calling").invoke("Weather in Rome?")
    assert isinstance(got, Weather)


def test_langchain_anthropic_tools_and_stream(served):
    """langchain-anthropic's ChatAnthropic at /v1/messages: structured output by a forced tool call (what its
    with_structured_output sends) comes back as the schema's object; a plain reply streams as text chunks that
    join to the collected reply's text."""
    from langchain_anthropic import ChatAnthropic
    server, _ = served
    llm = ChatAnthropic(model=MODEL, base_url=server.url, api_key="unused", max_tokens=160, max_retries=0,
                        temperature=0)
    got = llm.with_structured_output(Weather).invoke("Weather in Rome?")
    assert isinstance(got, Weather)
    short = ChatAnthropic(model=MODEL, base_url=server.url, api_key="unused", max_tokens=8, max_retries=0,
                          temperature=0)
    whole = short.invoke("Hello there")
    assert "".join(chunk.text for chunk in short.stream("Hello there")) == whole.text
    assert whole.usage_metadata["output_tokens"] == 8 or whole.response_metadata["stop_reason"] == "end_turn"


WEATHER_TOOL = {"type": "function", "name": "Weather", "description": "The weather in a city",
                "parameters": Weather.model_json_schema()}


def test_responses_function_calls_and_their_results(client):
    """/v1/responses with function tools (its flat tool form): a forced call comes back as a function_call item
    whose arguments fit the schema, the same in the stream's events; the call and its output sent back as input
    items reach the template; hosted tools are refused."""
    kwargs = dict(model=MODEL, input=ASK, tools=[WEATHER_TOOL], tool_choice={"type": "function", "name": "Weather"},
                  max_output_tokens=160, temperature=0)
    resp = client.responses.create(**kwargs)
    (call,) = [item for item in resp.output if item.type == "function_call"]
    assert call.name == "Weather" and call.call_id.startswith("call_") and resp.output_text == ""
    Weather.model_validate_json(call.arguments)
    events = list(client.responses.create(**kwargs, stream=True))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == json.loads(call.arguments)
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.type for item in done] == ["function_call"] and done[0].arguments == args
    assert events[-1].response.output[0].call_id == done[0].call_id
    follow = [*ASK, {"type": "function_call", "call_id": call.call_id, "name": "Weather", "arguments": call.arguments},
              {"type": "function_call_output", "call_id": call.call_id, "output": "12 degrees"}]
    second = client.responses.create(model=MODEL, input=follow, tools=[WEATHER_TOOL], max_output_tokens=4,
                                     temperature=0)
    assert second.usage.input_tokens > resp.usage.input_tokens and second.status in ("completed", "incomplete")
    with pytest.raises(openai.BadRequestError, match="function tools only"):
        client.responses.create(model=MODEL, input=ASK, tools=[{"type": "web_search"}])


def test_responses_text_without_a_call_streams_as_text(client):
    """tool_choice auto with the random model (it writes no call): the message text, streamed or not, is the
    chat completion's content for the same tools, and no function_call item comes back."""
    kwargs = dict(model=MODEL, input=ASK, tools=[WEATHER_TOOL], max_output_tokens=24, temperature=0)
    resp = client.responses.create(**kwargs)
    chat_tool = {"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}
    chat = client.chat.completions.create(model=MODEL, messages=ASK, tools=[chat_tool], max_tokens=24, temperature=0)
    assert [item.type for item in resp.output] == ["message"]
    assert resp.output_text == (chat.choices[0].message.content or "")
    events = list(client.responses.create(**kwargs, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == resp.output_text


def test_messages_tool_use_and_results(served, client):
    """/v1/messages (the anthropic SDK) with a tool: a forced call (tool_choice tool) comes back as a tool_use block
    whose input fits the schema, stop_reason tool_use, the same through the SDK's stream helper (input_json_delta);
    the call and its tool_result sent back reach the template as the conversation's call and tool message;
    tool_choice any picks one of the tools; output_config.format shapes a text reply to its schema."""
    import anthropic
    server, engine = served
    ac = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    tool = {"name": "Weather", "description": "The weather in a city", "input_schema": Weather.model_json_schema()}
    clock = {"name": "Clock", "input_schema": Clock.model_json_schema()}
    kwargs = dict(model=MODEL, max_tokens=160, messages=ASK, tools=[tool],
                  tool_choice={"type": "tool", "name": "Weather"}, extra_body={"temperature": 0})
    msg = ac.messages.create(**kwargs)
    (call,) = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and call.name == "Weather" and call.id.startswith("toolu_")
    Weather.model_validate(call.input)
    with ac.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert [(b.type, b.name, b.input) for b in final.content if b.type == "tool_use"] == [("tool_use", "Weather",
                                                                                          call.input)]
    seen = []
    tok = engine.tokenizer
    real = tok.apply_chat_template
    tok.apply_chat_template = lambda messages, **kw: seen.append(real(messages, **kw)) or seen[-1]
    try:
        second = ac.messages.create(model=MODEL, max_tokens=4, tools=[tool], messages=[
            *ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": "Weather",
                                                     "input": call.input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "12 degrees"}]}])
    finally:
        del tok.apply_chat_template
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens > msg.usage.input_tokens
    prompt = seen[-1]                                   # the call, then its result, in the rendered prompt
    city = json.dumps(call.input["city"])              # quoted: the question's own "Oslo" is not
    assert city in prompt and prompt.index(city) < prompt.index("12 degrees")
    anyone = ac.messages.create(model=MODEL, max_tokens=160, messages=ASK, tools=[tool, clock],
                                tool_choice={"type": "any"}, extra_body={"temperature": 0})
    assert [b.name for b in anyone.content if b.type == "tool_use"][0] in ("Weather", "Clock")
    shaped = ac.messages.create(model=MODEL, max_tokens=160, messages=ASK, extra_body={"temperature": 0},
                                output_config={"format": {"type": "json_schema", "schema": Clock.model_json_schema()}})
    Clock.model_validate_json(shaped.content[0].text)
