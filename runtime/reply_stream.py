"""A reply's body over the engine's deltas: collected whole (watching for the client leaving), or as
server-sent events (runtime/server.py's chat and text completions)."""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from . import openai_api as api
from .http_errors import FAILED
from .protocol import StreamDelta


async def collect(request: Request, reply: api.Reply, deltas: AsyncIterator[StreamDelta]) -> bool:
    """Feed every delta to ``reply``; False if the client went away meanwhile (its request is aborted)."""
    async def consume() -> None:
        async with aclosing(deltas):
            async for delta in deltas:
                if delta.finish_reason in FAILED:
                    raise api.APIError(*FAILED[delta.finish_reason])
                reply.add(delta)

    async def disconnected() -> None:       # the body is read, so the next message is the disconnect
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, watch = asyncio.create_task(consume()), asyncio.create_task(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            return False
        task.result()                       # raises what consume raised (bad input: InvalidRequestError)
        return True
    finally:                                # the client left, the reply is done, or the handler was cancelled
        for t in (task, watch):
            t.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)


async def sse(reply: api.Reply, first: StreamDelta, deltas: AsyncIterator[StreamDelta]) -> AsyncIterator[str]:
    """Server-sent events: one chunk per delta, the usage chunk if asked for, then [DONE]."""
    async with aclosing(deltas):
        delta: StreamDelta | None = first
        while delta is not None:
            if delta.finish_reason in FAILED:
                _, message, _, type_, code = FAILED[delta.finish_reason]
                yield event(api.error_body(message, type_, code=code))
                return
            chunk = reply.add(delta)
            if chunk is not None:
                if reply.timings:                   # llama-server's timings_per_token
                    chunk["timings"] = reply.timings_of(delta.index)
                yield event(chunk)
            delta = await anext(deltas, None)
    if reply.include_usage:
        yield event(reply.usage_chunk())
    yield "data: [DONE]\n\n"


_JSON = json.JSONEncoder(ensure_ascii=False)    # json.dumps with any option builds an encoder each call


def event(data: dict) -> str:
    return f"data: {_JSON.encode(data)}\n\n"


class EventStream(StreamingResponse):
    """A StreamingResponse that always closes its body iterator, so a disconnect aborts the request
    deterministically (not whenever the abandoned generator is garbage-collected)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
