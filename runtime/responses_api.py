"""POST /v1/responses: OpenAI's Responses API for text, on the same generation path as chat.

    client.responses.create(model="smollm2", input="Hi", instructions="Be brief.")
    client.responses.create(model="smollm2", input=[{"role": "user", "content": "Hi"}], stream=True)

`input` is text or message items (role + text or input_text/output_text parts); `instructions`
becomes a system message. Streaming sends the SDK's event sequence (response.created ...
response.output_text.delta ... response.completed). Tools, previous_response_id, stored responses,
reasoning and non-text input are refused with a 400 naming the field.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator, Literal

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from . import reply_models, tools
from .openai_api import APIError
from .protocol import GrowingText, SamplingParams

_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text")


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


def messages_of(req: ResponsesRequest) -> list[dict[str, str]]:
    """Chat messages from instructions + input (text, or message items with text parts)."""
    out = [{"role": "system", "content": req.instructions}] if req.instructions else []
    if isinstance(req.input, str):
        return out + [{"role": "user", "content": req.input}]
    if not req.input:
        raise APIError(400, "input is an empty list; pass text or message items", "input")
    for i, item in enumerate(req.input):
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
    return out


class _Response:
    """The Response object as it grows: one assistant message with one output_text part."""

    def __init__(self, req: ResponsesRequest, model: str, input_tokens: int):
        self.id, self.item_id = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
        self.req, self.model, self.created = req, model, int(time.time())
        self.input_tokens, self.output_tokens, self.status = input_tokens, 0, "in_progress"
        self.shown = GrowingText()
        self.incomplete: str | None = None

    @property
    def text(self) -> str:
        return str(self.shown)

    def item(self, status: str) -> dict:
        content = [{"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}]
        return {"type": "message", "id": self.item_id, "role": "assistant", "status": status,
                "content": content if status == "completed" else []}

    def body(self) -> dict:
        done = self.status != "in_progress"
        return {"id": self.id, "object": "response", "created_at": self.created, "model": self.model,
                "status": self.status, "error": None,
                "incomplete_details": {"reason": self.incomplete} if self.incomplete else None,
                "instructions": self.req.instructions, "max_output_tokens": self.req.max_output_tokens,
                "metadata": self.req.metadata or {}, "output": [self.item("completed")] if done else [],
                "parallel_tool_calls": False, "tool_choice": "none", "tools": [], "store": False,
                "temperature": self.req.temperature, "top_p": self.req.top_p, "text": {"format": {"type": "text"}},
                "usage": {"input_tokens": self.input_tokens, "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens": self.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
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
        ids = await asyncio.to_thread(tools.render, state.engine.engine, messages_of(body), None)
        room = state.context_window - len(ids)
        params = SamplingParams(max_tokens=body.max_output_tokens or max(1, room),
                                temperature=1.0 if body.temperature is None else body.temperature,
                                top_p=1.0 if body.top_p is None else body.top_p)
        resp = _Response(body, state.model_name, len(ids))
        deltas = state.engine.generate(ids, params)
        first = await anext(deltas)           # bad input raises here, before anything is sent
        if not body.stream:
            async for delta in _chain(first, deltas):
                _add(resp, delta)
            return JSONResponse(resp.body())
        return StreamingResponse(_events(resp, first, deltas), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _chain(first, rest: AsyncIterator) -> AsyncIterator:
    yield first
    async for delta in rest:
        yield delta


def _add(resp: _Response, delta) -> None:
    if delta.finish_reason in ("error", "shutdown"):
        raise APIError(503 if delta.finish_reason == "shutdown" else 500, "generation was cut off: "
                       + ("the server is shutting down" if delta.finish_reason == "shutdown" else "see the server log"),
                       type="server_error")
    resp.shown.add(delta.text)
    resp.output_tokens += len(delta.token_ids)
    if delta.finish_reason is not None:
        resp.finish(delta.finish_reason)


async def _events(resp: _Response, first, deltas: AsyncIterator) -> AsyncIterator[str]:
    seq = iter(range(1 << 30))

    def event(kind: str, **data: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(seq), **data})}\n\n"
    where = {"item_id": resp.item_id, "output_index": 0, "content_index": 0}
    yield event("response.created", response=resp.body())
    yield event("response.in_progress", response=resp.body())
    yield event("response.output_item.added", output_index=0, item=resp.item("in_progress"))
    yield event("response.content_part.added", **where,
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
    try:
        async for delta in _chain(first, deltas):
            _add(resp, delta)
            if delta.text:
                yield event("response.output_text.delta", **where, delta=delta.text, logprobs=[])
    except APIError as e:
        resp.status = "failed"
        yield event("error", code="server_error", message=e.message, param=None)
        return
    yield event("response.output_text.done", **where, text=resp.text, logprobs=[])
    yield event("response.content_part.done", **where,
                part={"type": "output_text", "text": resp.text, "annotations": [], "logprobs": []})
    yield event("response.output_item.done", output_index=0, item=resp.item("completed"))
    yield event("response.completed" if resp.status == "completed" else "response.incomplete", response=resp.body())
