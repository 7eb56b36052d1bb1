"""POST /v1/messages: Anthropic's Messages API, on the same generation path as chat (as llama.cpp's and vLLM's
servers offer it), so the anthropic SDK and the tools built on it can point at kiln.

    client = anthropic.Anthropic(base_url="http://127.0.0.1:8000", api_key="unused")
    client.messages.create(model="smollm2", max_tokens=64, system="Be brief.",
                           messages=[{"role": "user", "content": "Hi"}])

`system` (text or text blocks) becomes a system message; `messages` hold text, or blocks: text, `tool_use`
(an assistant's call, its `input` as the call's JSON arguments), `tool_result` (a user's answer to one: a tool
message) and `thinking` (an assistant's earlier reasoning, as the chat template reads it); a `system` message among
them is a system message there. `tools` (name, description, input_schema) and `tool_choice` (auto, any, tool,
none; disable_parallel_tool_use) go through the chat path's tool calling (runtime/tools.py); calls come back as
`tool_use` blocks with stop_reason "tool_use". A reasoning model's thinking (the server's reasoning parser) is a
`thinking` block before the text. `thinking` {"type": "adaptive"} (the model decides) or {"type": "disabled"} is
the template's enable_thinking where it has one (display "omitted": thinking blocks without their text);
"enabled" with a budget_tokens is refused (kiln cannot hold the reasoning to a budget), and so is "disabled" for a
model that reasons without such a switch. `output_config.effort` is the template's reasoning_effort (xhigh and max
as high) where it reads one, else unapplied and named in the reply's `kiln-unapplied` header; `output_config.format`
(a JSON schema) shapes the text as chat's response_format does. `max_tokens` (required) is cut to the room the
context leaves (Claude Code asks 32000 of any model; a reply that fills it ends with stop_reason
"model_context_window_exceeded"); `stop_sequences`, `temperature`, `top_p` and `top_k` (which newer SDKs send in
extra_body) are chat's. `metadata.user_id` is a tag that changes no output; `cache_control` marks are accepted
where Anthropic takes them, since kiln caches every prompt's prefix anyway (usage.cache_read_input_tokens counts
the tokens it found, input_tokens the rest); `context_management` is accepted with edits that clear nothing
(clear_thinking keeping all, as Claude Code sends). Streaming sends the SDK's events (message_start,
content_block_start / _delta / _stop, message_delta, message_stop). Errors come in Anthropic's shape
({"type": "error", "error": {"type", "message"}}: http_errors). POST /v1/messages/count_tokens answers the
prompt's length. Images, documents, server tools (web_search, ...) and redacted thinking are refused with a 400
naming the field.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator, Literal

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from . import reasoning as reasoning_parsers
from . import reply_models, tools
from .openai_api import APIError, with_reasoning
from .protocol import SamplingParams
from .responses_api import _add, _chain, _Response, shaped

log = logging.getLogger("kiln.server")
_PLAIN_BLOCK = {"type", "text", "cache_control", "citations"}     # a text block's keys
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def error_body(status: int, message: str) -> dict:
    """Anthropic's error body."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


class Thinking(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None
    display: Literal["summarized", "omitted"] | None = None     # omitted: thinking blocks without their text


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None   # the template's reasoning_effort
    format: OutputFormat | None = None                           # structured output: the text fits the schema


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ContextManagement(BaseModel):
    model_config = ConfigDict(extra="forbid")

    edits: list[dict[str, Any]] = []


class Metadata(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: str | None = None                   # a tag: accepted; it changes no output


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    messages: list[dict[str, Any]]
    max_tokens: int | None = Field(default=None, ge=1)     # required by /v1/messages, not by count_tokens
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    metadata: Metadata | None = None
    cache_control: dict[str, Any] | None = None  # accepted: kiln caches every prompt's prefix anyway
    context_management: ContextManagement | None = None   # only edits that keep everything (Claude Code's)


def _text(blocks: Any, where: str) -> str:
    """Text, or text blocks joined."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list) or not all(isinstance(b, dict) and b.get("type") == "text"
                                               and isinstance(b.get("text"), str) and set(b) <= _PLAIN_BLOCK
                                               for b in blocks):
        kinds = [b.get("type") if isinstance(b, dict) else type(b).__name__ for b in blocks] \
            if isinstance(blocks, list) else type(blocks).__name__
        raise APIError(400, f"{where} must be text or text blocks (got {kinds}); images and documents are not "
                            "supported", where.split("[")[0].split(".")[0])
    return "".join(b["text"] for b in blocks)


def messages_of(req: MessagesRequest) -> list[dict]:
    """Chat messages from system + messages (text, tool_use, tool_result and thinking blocks)."""
    out = [{"role": "system", "content": _text(req.system, "system")}] if req.system else []
    if not req.messages:
        raise APIError(400, "messages is an empty list; pass at least one user message", "messages")
    if req.messages[-1].get("role") == "assistant":
        raise APIError(400, "the last message is the assistant's: kiln does not continue a prefilled assistant "
                            "turn; end with a user message", "messages")
    for i, m in enumerate(req.messages):
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant", "system") or set(m) - {"role", "content"}:
            raise APIError(400, f"messages[{i}] must be {{role: user | assistant | system, content}} (got role "
                                f"{role!r}, keys {sorted(m)})", "messages")
        if role == "system":                  # mid-conversation system text (as the template takes it)
            out.append({"role": "system", "content": _text(content, f"messages[{i}].content")})
            continue
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise APIError(400, f"messages[{i}].content must be text or a list of content blocks", "messages")
        message: dict[str, Any] = {"role": role, "content": ""}
        for j, block in enumerate(content):
            _add_block(out, message, block, f"messages[{i}].content[{j}]")
        if message["content"] or message.get("tool_calls") or message.get("reasoning") or role == "user" \
                and not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            out.append(with_reasoning(message))
    return out


def _add_block(out: list[dict], message: dict, block: Any, where: str) -> None:
    """One content block into `message` (the chat message being built); a tool_result as a tool message of its
    own, before it."""
    kind = block.get("type") if isinstance(block, dict) else None
    role = message["role"]
    if kind == "text":
        message["content"] += _text([block], where)
    elif kind == "tool_use" and role == "assistant":
        if not (isinstance(block.get("id"), str) and isinstance(block.get("name"), str)
                and isinstance(block.get("input"), dict)):
            raise APIError(400, f"{where}: a tool_use block needs its id, name and input (an object)", "messages")
        message.setdefault("tool_calls", []).append(
            {"id": block["id"], "type": "function",
             "function": {"name": block["name"], "arguments": json.dumps(block["input"])}})
    elif kind == "tool_result" and role == "user":
        if not isinstance(block.get("tool_use_id"), str):
            raise APIError(400, f"{where}: a tool_result block needs its tool_use_id", "messages")
        result = _text(block.get("content", ""), f"{where}.content")
        if block.get("is_error"):
            result = f"Error: {result}"
        out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
    elif kind == "thinking" and role == "assistant":
        if not isinstance(block.get("thinking"), str):
            raise APIError(400, f"{where}: a thinking block needs its thinking text", "messages")
        message["reasoning"] = message.get("reasoning", "") + block["thinking"]
    else:
        raise APIError(400, f"{where}: a {kind!r} block in a {role} message is not supported (kiln reads text, "
                            "tool_use and thinking from the assistant, text and tool_result from the user)",
                       "messages")


def tool_request(req: MessagesRequest) -> tools.ToolRequest | None:
    """The request's tools and choice, as the chat path takes them (Anthropic's server tools refused)."""
    chat_tools = []
    for i, t in enumerate(req.tools or []):
        if not isinstance(t, dict) or t.get("type", "custom") != "custom" or "input_schema" not in t:
            kind = t.get("type") if isinstance(t, dict) else type(t).__name__
            raise APIError(400, f"tools[{i}] ({kind!r}) is not a custom tool with an input_schema; kiln runs "
                                "client tools only (server tools such as web_search are Anthropic's)", "tools")
        extra = set(t) - {"type", "name", "description", "input_schema", "cache_control"}
        if extra:
            raise APIError(400, f"tools[{i}]: {sorted(extra)} not supported; leave them out", "tools")
        fn = {"name": t.get("name"), "parameters": t["input_schema"]}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        chat_tools.append({"type": "function", "function": fn})
    c = req.tool_choice
    choice: Any = None
    if c is not None:
        if (c.type == "tool") != (c.name is not None):
            raise APIError(400, 'tool_choice names a tool exactly when its type is "tool"', "tool_choice")
        choice = {"auto": "auto", "any": "required", "none": "none"}.get(c.type) or \
            {"type": "function", "function": {"name": c.name}}
    parallel = None if c is None or c.disable_parallel_tool_use is None else not c.disable_parallel_tool_use
    return tools.ToolRequest.parse(chat_tools, choice, parallel)


def template_variables(req: MessagesRequest, template: str | None, reasons: bool) -> tuple[dict[str, Any], list[str]]:
    """(the template's variables, what of the request it could not apply). thinking's type is the template's
    enable_thinking: adaptive (the model decides) needs no switch; disabled one where the model reasons.
    output_config.effort is its reasoning_effort (xhigh and max as high), where it reads one; where it does not,
    the effort goes unapplied (a behavioural hint, as Anthropic's own models take it: refusing it would refuse
    every Claude Code request) and the reply's `kiln-unapplied` header says so."""
    out: dict[str, Any] = {}
    unapplied = []
    effort = req.output_config.effort if req.output_config is not None else None
    if effort is not None:
        if tools.reads_variable(template, "reasoning_effort"):
            out["reasoning_effort"] = {"xhigh": "high", "max": "high"}.get(effort, effort)
        else:
            unapplied.append("output_config.effort (the chat template reads no reasoning_effort)")
    for i, edit in enumerate(req.context_management.edits if req.context_management else ()):
        if not (str(edit.get("type", "")).startswith("clear_thinking_") and edit.get("keep") == "all"):
            raise APIError(400, f"context_management.edits[{i}] ({edit.get('type')!r}) would clear context kiln "
                                "keeps; only clear_thinking with keep 'all' (which clears nothing) is accepted",
                           "context_management")
    t = req.thinking
    if t is None:
        return out, unapplied
    if t.type == "enabled":
        raise APIError(400, "thinking {type: enabled} asks for a budget_tokens kiln cannot hold the reasoning to; "
                            'send thinking {"type": "adaptive"} (the model reasons as its chat template lets it) '
                            "or leave thinking out", "thinking")
    if t.budget_tokens is not None:
        raise APIError(400, f"thinking.budget_tokens goes with type enabled only, not {t.type!r}", "thinking")
    if tools.reads_variable(template, "enable_thinking"):
        out["enable_thinking"] = t.type == "adaptive"
    elif t.type == "disabled" and reasons:
        raise APIError(400, "thinking is disabled, but this model reasons and its chat template has no "
                            "enable_thinking switch to stop it; leave thinking out", "thinking")
    return out, unapplied


def response_format(req: MessagesRequest) -> dict | None:
    """output_config.format as chat's response_format."""
    fmt = req.output_config.format if req.output_config is not None else None
    return None if fmt is None else {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.schema_}}


class _Message(_Response):
    """The Message as it grows: _Response's reasoning, text and calls, read as Anthropic's content blocks."""

    def __init__(self, req: MessagesRequest, model: str, input_tokens: int,
                 parser: reasoning_parsers.ReasoningParser | None, tool_req: tools.ToolRequest | None):
        super().__init__(req, model, input_tokens, parser, tool_req)
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self.stop_string: str | None = None    # the stop string that ended it
        self.cut_short = False                 # max_tokens was lowered to the room the context leaves

    @property
    def shown_thinking(self) -> bool:
        """Whether thinking blocks carry their text (not thinking.display "omitted")."""
        t = self.req.thinking
        return t is None or t.display != "omitted"

    def blocks(self) -> list[dict]:
        thought = str(self.thought) if self.shown_thinking else ""
        out = [{"type": "thinking", "thinking": thought, "signature": ""}] if str(self.thought) else []
        if self.message or not self.calls:         # (an empty reply: one empty text block)
            out.append({"type": "text", "text": self.message or ""})
        return out + [_tool_use(call) for call in self.calls]

    def stop(self) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence)."""
        if self.calls:
            return "tool_use", None
        if self.incomplete:                    # (_Response.finish: it ran out of tokens)
            return ("model_context_window_exceeded" if self.cut_short else "max_tokens"), None
        return ("stop_sequence", self.stop_string) if self.stop_string is not None else ("end_turn", None)

    def usage(self) -> dict:
        return {"input_tokens": self.input_tokens - self.cached_tokens, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": self.cached_tokens, "output_tokens": self.output_tokens}

    def message_body(self, done: bool = True) -> dict:
        reason, sequence = self.stop() if done else (None, None)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": self.blocks() if done else [], "stop_reason": reason, "stop_sequence": sequence,
                "usage": self.usage()}


def _tool_use(call: dict) -> dict:
    try:
        arguments = json.loads(call["function"]["arguments"] or "{}")
    except json.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict):          # Anthropic's input is an object: wrap anything else
        arguments = {"arguments": call["function"]["arguments"]}
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": call["function"]["name"],
            "input": arguments}


def install(app: FastAPI, state, auth: list[Depends]) -> None:
    """Add the routes; `state` is the server's _ServerState."""

    async def prompt(body: MessagesRequest) -> tuple[str, list[int], tools.ToolRequest | None, list[str]]:
        state.check_model(body.model)
        tool_req = tool_request(body)
        tok = state.engine.engine.tokenizer
        variables, unapplied = template_variables(body, tok.chat_template if tok is not None else None,
                                                  state.reasoning is not None)
        text, ids = await asyncio.to_thread(tools.render_text, state.engine.engine, messages_of(body), tool_req,
                                            variables)
        return text, ids, tool_req, unapplied

    @app.post("/v1/messages/count_tokens", dependencies=auth, response_model=reply_models.TokenCount,
              responses=reply_models.ANTHROPIC_ERRORS)
    async def count_tokens(body: MessagesRequest) -> dict:
        _, ids, _, _ = await prompt(body)
        return {"input_tokens": len(ids)}

    @app.post("/v1/messages", dependencies=auth, response_model=reply_models.Message,
              responses={**reply_models.with_stream("A message, or its events as a stream"),
                         **reply_models.ANTHROPIC_ERRORS})
    async def messages(body: MessagesRequest):
        arrival = time.monotonic()
        if body.max_tokens is None:
            raise APIError(400, "max_tokens is required", "max_tokens")
        text, ids, tool_req, unapplied = await prompt(body)
        room = state.context_window - len(ids)
        if room < 1:
            raise APIError(400, f"the prompt is {len(ids)} tokens, which fills this model's context of "
                                f"{state.context_window}; shorten the conversation", "messages")
        params = SamplingParams(max_tokens=min(body.max_tokens, room),     # Claude Code asks 32000 every time
                                temperature=1.0 if body.temperature is None else body.temperature,
                                top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
                                stop=tuple(body.stop_sequences or ()))
        params = await shaped(state, params, response_format(body), tool_req, "output_config.format", "output_config")
        parser = reasoning_parsers.start(state.reasoning, text) if state.reasoning else None
        msg = _Message(body, state.model_name, len(ids), parser, tool_req)
        msg.cut_short = params.max_tokens < body.max_tokens
        headers = {"kiln-unapplied": "; ".join(unapplied)} if unapplied else None
        if unapplied:
            log.info("/v1/messages: unapplied %s", "; ".join(unapplied))
        deltas = state.metrics.track(state.engine.generate(ids, params), len(ids), arrival)
        first = await anext(deltas)           # bad input raises here, before anything is sent
        if not body.stream:
            async for delta in _chain(first, deltas):
                _record(msg, delta)
            msg.end()
            return JSONResponse(msg.message_body(), headers=headers)
        return StreamingResponse(_events(msg, first, deltas), media_type="text/event-stream",
                                 headers={**reply_models.SSE_HEADERS, **(headers or {})})


def _record(msg: _Message, delta) -> tuple[str, str]:
    """_add's, and the stop string that ended the reply."""
    thought, text = _add(msg, delta)
    msg.stop_string = delta.stop_string or msg.stop_string
    return thought, text


async def _events(msg: _Message, first, deltas: AsyncIterator) -> AsyncIterator[str]:
    def event(kind: str, **data: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

    blocks: list[str] = []                      # the kind of each block opened, in order

    def switch(kind: str, start: dict) -> list[str]:
        """Events that close the open block and open one of `kind`, unless it is the one open."""
        if blocks and blocks[-1] == kind:
            return []
        out = [event("content_block_stop", index=len(blocks) - 1)] if blocks else []
        blocks.append(kind)
        return out + [event("content_block_start", index=len(blocks) - 1, content_block=start)]

    def text_events(text: str) -> list[str]:
        if not text:
            return []
        msg.sent += text
        return [*switch("text", {"type": "text", "text": ""}),
                event("content_block_delta", index=len(blocks) - 1, delta={"type": "text_delta", "text": text})]

    yield event("message_start", message=msg.message_body(done=False))
    try:
        async for delta in _chain(first, deltas):
            thought, text = _record(msg, delta)
            if thought:
                for e in switch("thinking", {"type": "thinking", "thinking": "", "signature": ""}):
                    yield e
                if msg.shown_thinking:
                    yield event("content_block_delta", index=len(blocks) - 1,
                                delta={"type": "thinking_delta", "thinking": thought})
            for e in text_events(msg.sendable(text)):
                yield e
    except APIError as e:
        yield f"event: error\ndata: {json.dumps(error_body(e.status, e.message))}\n\n"
        return
    for e in text_events(msg.end()):
        yield e
    for call in msg.calls:
        block = _tool_use(call)
        for e in switch(f"tool {block['id']}", {**block, "input": {}}):
            yield e
        yield event("content_block_delta", index=len(blocks) - 1,
                    delta={"type": "input_json_delta", "partial_json": json.dumps(block["input"])})
    if blocks:
        yield event("content_block_stop", index=len(blocks) - 1)
    reason, sequence = msg.stop()
    yield event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                usage={"output_tokens": msg.output_tokens})
    yield event("message_stop")
