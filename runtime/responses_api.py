"""POST /v1/responses: OpenAI's Responses API for text, on the same generation path as chat.

    client.responses.create(model="smollm2", input="Hi", instructions="Be brief.")
    client.responses.create(model="smollm2", input=[{"role": "user", "content": "Hi"}], stream=True)

`input` is text or message items (role + text or input_text/output_text parts); `instructions`
becomes a system message. Streaming sends the SDK's event sequence (response.created ...
response.output_text.delta ... response.completed). A reasoning model's thinking (the server's reasoning
parser, runtime/reasoning.py) is a `reasoning` output item before the message, its text as
`reasoning_text` content (response.reasoning_text.delta events), and `reasoning.effort` is the chat
template's reasoning_effort; reasoning items sent back as input go to the next assistant message's
reasoning (or the next function call's turn's). Function tools (`tools`, `tool_choice`,
`parallel_tool_calls`) go through the chat path's tool calling (runtime/tools.py): calls come back as
`function_call` items (streamed as response.function_call_arguments.* events; text is held back from where a
call may start), and
`function_call` / `function_call_output` input items become the conversation's calls and results.
`text.format` (json_object, or json_schema with its name and schema: structured output, as the Agents SDK's
output types send it) is chat's response_format; `text.verbosity` is refused (kiln cannot steer it).
Hosted tools (web_search, file_search, ...), previous_response_id, stored responses, reasoning summaries
and non-text input are refused with a 400 naming the field.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import replace
from typing import Any, AsyncIterator, Literal

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from . import reasoning as reasoning_parsers
from . import reply_models, tools
from .openai_api import APIError, with_reasoning
from .protocol import GrowingText, SamplingParams

_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text")


class Reasoning(BaseModel):
    model_config = ConfigDict(extra="forbid")

    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None   # the template's reasoning_effort
    summary: None = None                         # kiln returns the reasoning itself, never a summary


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: dict[str, Any] | None = None         # {"type": "text" | "json_object" | "json_schema", ...}
    verbosity: None = None                       # gpt-5's knob: nothing in kiln would honour it


def response_format(req: ResponsesRequest) -> dict | None:
    """text.format as chat's response_format: json_schema's name, schema and strict inside a json_schema
    object, as the chat API nests them (runtime/grammar.py reads that)."""
    fmt = (req.text.format if req.text else None) or {"type": "text"}
    kind = fmt.get("type")
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise APIError(400, "text.format json_schema needs its schema (a JSON schema object)", "text")
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    if kind in ("text", "json_object"):
        return None if kind == "text" else {"type": "json_object"}
    raise APIError(400, f"text.format.type must be text, json_object or json_schema, got {kind!r}", "text")


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    user: str | None = None                      # a tag: accepted; it changes no output
    metadata: dict[str, str] | None = None       # tags, returned on the response
    store: Literal[False] | None = None          # kiln keeps no responses: store=true is refused
    reasoning: Reasoning | None = None
    text: TextConfig | None = None               # text.format: structured output (chat's response_format)
    tools: list[dict[str, Any]] | None = None    # function tools: {"type": "function", "name", "parameters", ...}
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


def messages_of(req: ResponsesRequest) -> list[dict[str, str]]:
    """Chat messages from instructions + input (text, or message items with text parts; a reasoning item's
    text becomes the next assistant message's reasoning, or one of its own)."""
    out = [{"role": "system", "content": req.instructions}] if req.instructions else []
    if isinstance(req.input, str):
        return out + [{"role": "user", "content": req.input}]
    if not req.input:
        raise APIError(400, "input is an empty list; pass text or message items", "input")
    thought: list[str] = []
    for i, item in enumerate(req.input):
        if item.get("type") == "reasoning":
            thought.append(_reasoning_text(i, item))
            continue
        if item.get("type") in ("function_call", "function_call_output"):
            if item["type"] == "function_call" and thought:   # the call's turn reasoned (Codex: reasoning, call)
                last = out[-1] if out else {}
                if last.get("role") != "assistant" or last.get("reasoning") or last.get("tool_calls"):
                    out.append({"role": "assistant", "content": ""})
                out[-1]["reasoning"], thought = "".join(thought), []
            _add_call_item(out, i, item)
            continue
        if thought and item.get("role") != "assistant":
            out.append({"role": "assistant", "content": "", "reasoning": "".join(thought)})
            thought = []
        if item.get("type", "message") != "message" or item.get("role") not in _ROLES:
            raise APIError(400, f"input[{i}]: only message items with role {', '.join(_ROLES)} are supported "
                                f"(got type {item.get('type', 'message')!r}, role {item.get('role')!r})", "input")
        content = item.get("content")
        if isinstance(content, list):
            kinds = [p.get("type") if isinstance(p, dict) else type(p).__name__ for p in content]
            if any(k not in _TEXT_PARTS for k in kinds):
                raise APIError(400, f"input[{i}].content: only text parts are supported (got {kinds})", "input")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(400, f"input[{i}].content must be text or a list of text parts", "input")
        out.append({"role": item["role"], "content": content})
        if thought and item["role"] == "assistant":
            out[-1]["reasoning"], thought = "".join(thought), []
    if thought:
        out.append({"role": "assistant", "content": "", "reasoning": "".join(thought)})
    return [with_reasoning(m) for m in out]


def _add_call_item(out: list[dict], i: int, item: dict) -> None:
    """A function_call input item as a call of an assistant message (the one before it, where that made calls
    or said something, else a new one); a function_call_output item as a tool message answering it."""
    if not isinstance(item.get("call_id"), str):
        raise APIError(400, f"input[{i}]: a {item['type']} item needs its call_id", "input")
    if item["type"] == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str):
            raise APIError(400, f"input[{i}]: a function_call_output's output must be text", "input")
        out.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        return
    name, arguments = item.get("name"), item.get("arguments", "{}")
    if not isinstance(name, str) or not isinstance(arguments, str):
        raise APIError(400, f"input[{i}]: a function_call item needs a name and its arguments as JSON text", "input")
    call = {"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": arguments}}
    if not (out and out[-1]["role"] == "assistant"):
        out.append({"role": "assistant", "content": ""})
    out[-1].setdefault("tool_calls", []).append(call)


def tool_request(req: ResponsesRequest) -> tools.ToolRequest | None:
    """The request's function tools and choice, as the chat path takes them (hosted tools refused)."""
    chat_tools = []
    for i, t in enumerate(req.tools or []):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else type(t).__name__
            raise APIError(400, f"tools[{i}] is a {kind!r} tool; kiln runs function tools only (hosted tools such as "
                                "web_search or file_search are OpenAI's)", "tools")
        chat_tools.append({"type": "function", "function": {k: v for k, v in t.items() if k != "type"}})
    choice = req.tool_choice
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return tools.ToolRequest.parse(chat_tools, choice, req.parallel_tool_calls)


def _reasoning_text(i: int, item: dict) -> str:
    """A reasoning input item's text (its reasoning_text content, else its summary's text)."""
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in parts):
        raise APIError(400, f"input[{i}]: a reasoning item's content must be a list of reasoning_text parts "
                            "(encrypted reasoning is not read)", "input")
    return "".join(p["text"] for p in parts)


class _Response:
    """The Response object as it grows: a reasoning item where the model reasons (its reasoning_text), one
    assistant message with one output_text part, and a function_call item per call; items numbered in the
    order they first have text (the calls last: they are read when the reply ends)."""

    def __init__(self, req: ResponsesRequest, model: str, input_tokens: int,
                 parser: reasoning_parsers.ReasoningParser | None = None, tool_req: tools.ToolRequest | None = None):
        self.id, self.item_id = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
        self.reasoning_id = f"rs_{uuid.uuid4().hex}"
        self.req, self.model, self.created = req, model, int(time.time())
        self.input_tokens, self.output_tokens, self.status = input_tokens, 0, "in_progress"
        self.cached_tokens = 0                 # input tokens the prefix cache held
        self.reasoning_tokens = 0              # tokens whose text went to the reasoning alone
        self.shown, self.thought = GrowingText(), GrowingText()
        self.parser = parser
        self.tools = tool_req if tool_req is not None and tool_req.active else None
        self.calls: list[dict] = []            # the reply's function calls (chat form), read when it ends
        self.message: str | None = None        # the message's text once the calls are taken out
        self.sent = ""                         # the message text a stream has sent
        self.hold = tools.CallHold(self.tools.forced) if self.tools is not None else None
        self.order: list[str] = []             # "reasoning" / "message" / "call N", as they first had text
        self.incomplete: str | None = None

    @property
    def text(self) -> str:
        return str(self.shown)

    def split(self, text: str, last: bool) -> tuple[str, str]:
        """(reasoning, content) of a delta's text, by the parser where there is one."""
        return ("", text) if self.parser is None else self.parser.read(text, last)

    def sendable(self, new: str) -> str:
        """What of the new text a stream may send now (with tools: tools.CallHold's answer)."""
        return new if self.hold is None else self.hold.sendable(new)

    def end(self) -> str:
        """At the end of the reply: its calls taken out; the message text still to send (a stream's held-back
        text where there was no call, or what follows the calls)."""
        self.message = self.text
        if self.tools is not None:
            content, self.calls = tools.parse_tool_calls(self.text, self.tools.forced, self.tools.parallel)
            if self.calls:
                self.message = content or "" if self.tools.forced else tools.without_calls(self.text)
        if self.message.strip() or not self.calls:       # a reply of calls alone has no message item
            self.index("message")
        for n in range(len(self.calls)):
            self.index(f"call {n}")
        return self.message[len(self.sent):] if self.message.startswith(self.sent) else ""

    def index(self, kind: str) -> int:
        if kind not in self.order:
            self.order.append(kind)
        return self.order.index(kind)

    def item(self, kind: str, status: str) -> dict:
        done = status != "in_progress"
        if kind == "reasoning":
            content = [{"type": "reasoning_text", "text": str(self.thought)}]
            return {"type": "reasoning", "id": self.reasoning_id, "summary": [], "status": status,
                    "content": content if done else []}
        if kind.startswith("call "):
            call = self.calls[int(kind.split()[1])]
            return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"), "call_id": call["id"],
                    "name": call["function"]["name"], "arguments": call["function"]["arguments"] if done else "",
                    "status": status}
        text = self.text if self.message is None else self.message
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"type": "message", "id": self.item_id, "role": "assistant", "status": status,
                "content": content if done else []}

    def items(self) -> list[str]:
        """Every item of the finished response."""
        return list(self.order)

    def body(self) -> dict:
        done = self.status != "in_progress"
        return {"id": self.id, "object": "response", "created_at": self.created, "model": self.model,
                "status": self.status, "error": None,
                "incomplete_details": {"reason": self.incomplete} if self.incomplete else None,
                "instructions": self.req.instructions, "max_output_tokens": self.req.max_output_tokens,
                "metadata": self.req.metadata or {},
                "output": [self.item(kind, "completed") for kind in self.items()] if done else [],
                "parallel_tool_calls": self.req.parallel_tool_calls is not False,
                "tool_choice": self.req.tool_choice or ("auto" if self.req.tools else "none"),
                "tools": self.req.tools or [], "store": False,
                "temperature": self.req.temperature, "top_p": self.req.top_p,
                "text": {"format": (self.req.text.format if self.req.text else None) or {"type": "text"}},
                "reasoning": {"effort": self.req.reasoning.effort if self.req.reasoning else None, "summary": None},
                "usage": {"input_tokens": self.input_tokens,
                          "input_tokens_details": {"cached_tokens": self.cached_tokens},
                          "output_tokens": self.output_tokens,
                          "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                          "total_tokens": self.input_tokens + self.output_tokens} if done else None}

    def finish(self, reason: str | None) -> None:
        self.status = "incomplete" if reason == "length" else "completed"
        self.incomplete = "max_output_tokens" if reason == "length" else None


def install(app: FastAPI, state, auth: list[Depends]) -> None:
    """Add the route; `state` is the server's _ServerState."""

    @app.post("/v1/responses", dependencies=auth, response_model=reply_models.Response,
              responses=reply_models.with_stream("A response, or its events as a stream"))
    async def responses(body: ResponsesRequest):
        state.check_model(body.model)
        effort = body.reasoning.effort if body.reasoning else None
        tool_req = tool_request(body)
        try:
            text, ids = await asyncio.to_thread(tools.render_text, state.engine.engine, messages_of(body), tool_req,
                                                {"reasoning_effort": effort} if effort else None)
        except APIError as e:
            if e.param == "reasoning_effort":         # the chat field's name; here it is reasoning.effort
                e.param = "reasoning"
            raise
        room = state.context_window - len(ids)
        params = SamplingParams(max_tokens=body.max_output_tokens or max(1, room),
                                temperature=1.0 if body.temperature is None else body.temperature,
                                top_p=1.0 if body.top_p is None else body.top_p)
        params = await shaped(state, params, response_format(body), tool_req, "text.format", "text")
        parser = reasoning_parsers.start(state.reasoning, text) if state.reasoning else None
        resp = _Response(body, state.model_name, len(ids), parser, tool_req)
        deltas = state.engine.generate(ids, params)
        first = await anext(deltas)           # bad input raises here, before anything is sent
        if not body.stream:
            async for delta in _chain(first, deltas):
                _add(resp, delta)
            resp.end()
            return JSONResponse(resp.body())
        return StreamingResponse(_events(resp, first, deltas), media_type="text/event-stream",
                                 headers=reply_models.SSE_HEADERS)


async def shaped(state, params: SamplingParams, shape: dict | None, tool_req: tools.ToolRequest | None, name: str,
                 field: str) -> SamplingParams:
    """params with the reply's shape and its grammar compiled: the forced tool call's JSON, else the request's own
    format (`name`, the request's `field`: chat's response_format form); both at once refused."""
    if tool_req is not None and tool_req.forced:
        if shape is not None:
            raise APIError(400, f"{name} cannot be combined with a tool_choice that forces a call: the reply is the "
                                "tool call's JSON", field)
        shape = tool_req.forced_format(None)
    if shape is None:
        return params
    return await state.compile_grammar(replace(params, response_format=shape, reasoning_parser=state.reasoning))


async def _chain(first, rest: AsyncIterator) -> AsyncIterator:
    yield first
    async for delta in rest:
        yield delta


def _add(resp: _Response, delta) -> tuple[str, str]:
    """Record a delta; its (reasoning, content) text."""
    if delta.finish_reason in ("error", "shutdown"):
        raise APIError(503 if delta.finish_reason == "shutdown" else 500, "generation was cut off: "
                       + ("the server is shutting down" if delta.finish_reason == "shutdown" else "see the server log"),
                       type="server_error")
    thought, text = resp.split(delta.text, delta.finish_reason is not None)
    if thought:
        resp.index("reasoning")               # numbered as it first has text
    resp.thought.add(thought)
    resp.shown.add(text)
    resp.output_tokens += len(delta.token_ids)
    resp.cached_tokens = delta.cached_tokens or resp.cached_tokens
    if thought and not text:
        resp.reasoning_tokens += len(delta.token_ids)
    if delta.finish_reason is not None:
        resp.finish(delta.finish_reason)
    return thought, text


async def _events(resp: _Response, first, deltas: AsyncIterator) -> AsyncIterator[str]:
    seq = iter(range(1 << 30))

    def event(kind: str, **data: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(seq), **data})}\n\n"

    def where(kind: str) -> dict:
        return {"item_id": resp.item_id if kind == "message" else resp.reasoning_id,
                "output_index": resp.index(kind), "content_index": 0}

    announced: set[str] = set()

    def opened(kind: str) -> list[str]:
        """The events that start an item (its first text is on its way)."""
        if kind in announced:
            return []
        announced.add(kind)
        out = [event("response.output_item.added", output_index=resp.index(kind), item=resp.item(kind, "in_progress"))]
        if kind == "message":
            out.append(event("response.content_part.added", **where(kind),
                             part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
        return out

    def text_events(text: str) -> list[str]:
        if not text:
            return []
        resp.sent += text
        return [*opened("message"), event("response.output_text.delta", **where("message"), delta=text, logprobs=[])]

    yield event("response.created", response=resp.body())
    yield event("response.in_progress", response=resp.body())
    if resp.parser is None and resp.tools is None:        # plain text: the message starts at once, as before
        for e in opened("message"):
            yield e
    try:
        async for delta in _chain(first, deltas):
            thought, text = _add(resp, delta)
            if thought:
                for e in opened("reasoning"):
                    yield e
                yield event("response.reasoning_text.delta", **where("reasoning"), delta=thought)
            for e in text_events(resp.sendable(text)):
                yield e
    except APIError as e:
        resp.status = "failed"
        yield event("error", code="server_error", message=e.message, param=None)
        return
    for e in text_events(resp.end()):
        yield e
    for kind in resp.items():
        if kind == "reasoning":
            yield event("response.reasoning_text.done", **where(kind), text=str(resp.thought))
        elif kind == "message":
            for e in opened(kind):
                yield e
            yield event("response.output_text.done", **where(kind), text=resp.message, logprobs=[])
            yield event("response.content_part.done", **where(kind),
                        part={"type": "output_text", "text": resp.message, "annotations": [], "logprobs": []})
        else:
            item = resp.item(kind, "completed")
            for e in opened(kind):
                yield e
            at = {"item_id": item["id"], "output_index": resp.index(kind)}
            yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **at, arguments=item["arguments"])
        yield event("response.output_item.done", output_index=resp.index(kind), item=resp.item(kind, "completed"))
    yield event("response.completed" if resp.status == "completed" else "response.incomplete", response=resp.body())
