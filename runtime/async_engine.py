"""AsyncEngine: one background thread runs Engine.step(); callers await their deltas.

The engine's state is touched only by the loop thread: add and abort arrive
through a command queue and are applied between steps. Each request's deltas
go to an asyncio.Queue on the caller's event loop. A caller that stops
iterating (a client disconnect cancels the task) aborts its request, which
frees its KV pages.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from .engine import Engine, Prompt
from .protocol import SamplingParams, StreamDelta
from .request import Request


@dataclass
class _Handle:
    """The caller's side of one add_request: its output streams and where their deltas go."""

    loop: asyncio.AbstractEventLoop
    deltas: asyncio.Queue
    requests: list[Request] = field(default_factory=list)
    arrival: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None


class AsyncEngine:
    def __init__(self, engine: Engine, on_step: Callable[["AsyncEngine", list], None] | None = None):
        self.engine = engine
        self.on_step = on_step                 # metrics hook: (self, [(request, delta)]) after each step
        self._commands: queue.Queue = queue.Queue()
        self._handles: dict[int, _Handle] = {}  # id(request) -> handle
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="kiln-engine", daemon=True)
        self._thread.start()

    async def generate(self, prompt: Prompt, params: SamplingParams | None = None,
                       priority: int = 0) -> AsyncIterator[StreamDelta]:
        """Yield this prompt's deltas (params.n streams interleaved, told apart by delta.index)."""
        handle = _Handle(asyncio.get_running_loop(), asyncio.Queue())
        done = asyncio.get_running_loop().create_future()
        self._submit(("add", prompt, params, priority, handle, done))
        await done                            # raises InvalidRequestError for bad input
        remaining = len(handle.requests)
        try:
            while remaining:
                delta = await handle.deltas.get()
                if delta.finish_reason is not None:
                    remaining -= 1
                yield delta
        finally:
            if remaining:
                self._submit(("abort", handle))

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=10)

    # -- the loop thread ----------------------------------------------------------------
    def _submit(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    def _loop(self) -> None:
        while not self._stopped:
            self._apply_commands()
            if not self.engine.has_work:
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                out = self.engine.step()
            except Exception as e:  # a failed step must not kill the server: fail the live requests
                self._fail_all(e)
                continue
            for request, delta in out:
                self._deliver(request, delta)
            if self.on_step:
                self.on_step(self, out)

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _, prompt, params, priority, handle, done = command
                try:
                    handle.requests = self.engine.add_request(prompt, params, priority=priority)
                    for r in handle.requests:
                        self._handles[id(r)] = handle
                    handle.loop.call_soon_threadsafe(_resolve, done, None)
                except Exception as e:
                    handle.loop.call_soon_threadsafe(_resolve, done, e)
            else:
                handle = command[1]
                for r in handle.requests:
                    self._handles.pop(id(r), None)
                    self.engine.abort(r)

    def _deliver(self, request: Request, delta: StreamDelta) -> None:
        handle = self._handles.get(id(request))
        if handle is None:
            return
        if handle.first_token_at is None:
            handle.first_token_at = time.monotonic()
        if request.finished:
            self._handles.pop(id(request), None)
        handle.loop.call_soon_threadsafe(handle.deltas.put_nowait, delta)

    def _fail_all(self, error: Exception) -> None:
        for handle in {id(h): h for h in self._handles.values()}.values():
            for r in handle.requests:
                self.engine.abort(r)
                handle.loop.call_soon_threadsafe(handle.deltas.put_nowait,
                                                 StreamDelta(r.index, "", [], "error"))
        self._handles.clear()

    @property
    def num_live(self) -> int:
        return len(self._handles)


def _resolve(future: asyncio.Future, error: Exception | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
