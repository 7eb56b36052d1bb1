"""AsyncEngine: one background thread runs Engine.step(); callers await their deltas.

Two halves, so that the engine can also run in a process of its own (engine_process.py):
  Calls       the callers' side: generate() / embed() / cancel_all() on their event loops;
  EngineLoop  the engine's side: commands applied between steps, each step's deltas handed back.
The engine's state is touched only by the loop: callers submit typed commands
(protocol.AddRequest / AbortRequest / EmbedRequest), applied between steps. Each call's
deltas go to an asyncio.Queue on the caller's event loop (its RequestHandle). A caller
that stops iterating (a client disconnect cancels the task) aborts its request, which
frees its KV pages.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import AsyncIterator

from .engine import Engine, EngineBusy, Prompt
from .protocol import (AbortRequest, AddRequest, EmbedRequest, EngineCommand, EngineStats, InvalidRequestError,
                       SamplingParams, ShuttingDown, StreamDelta, merge_ready)
from .request import Request


@dataclass(eq=False)
class RequestHandle:
    """The caller's side of one AddRequest: where the engine thread answers and sends deltas.

    Created on the caller's event loop; the engine thread reaches it only through
    loop.call_soon_threadsafe (and sets ``requests`` before resolving ``accepted``).
    """

    loop: asyncio.AbstractEventLoop
    accepted: asyncio.Future                 # None once queued; the InvalidRequestError that refused it
    deltas: asyncio.Queue                    # StreamDeltas of every output stream, in order
    requests: list[Request] = field(default_factory=list)   # the engine's side (in this process)
    streams: int = 0                         # output streams, set before ``accepted`` resolves
    call_id: int = -1                        # its number on the wire to an engine process
    left: int = 0                            # streams not finished yet (EngineClient's count)

    @classmethod
    def on_running_loop(cls) -> "RequestHandle":
        loop = asyncio.get_running_loop()
        return cls(loop, loop.create_future(), asyncio.Queue())

    def resolve(self, error: Exception | None) -> bool:
        """From the engine thread: the AddRequest was applied (None) or refused (error).
        False when the caller's event loop is closed: nobody is listening any more."""
        return self._call(_resolve, self.accepted, error)

    def _call(self, fn, *args) -> bool:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
            return True
        except RuntimeError:                  # the loop is closed; the engine thread must go on
            return False


_log = logging.getLogger("kiln.engine")


class Calls:
    """The callers' side of an engine: generate() and embed() on the caller's event loop, over commands
    that _submit hands to the engine (a thread here: AsyncEngine; a process: engine_process.EngineClient)."""

    def __init__(self, stream_interval: int = 1):
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be at least 1 token, got {stream_interval}")
        self.stream_interval = stream_interval   # tokens a call's deltas gather before they are yielded
        self._live: set[RequestHandle] = set()         # calls not yet finished (cancel_all ends them)
        self._live_embeds: set[asyncio.Future] = set()  # embed calls not yet answered (likewise)
        self._live_lock = threading.Lock()

    def _submit(self, command: EngineCommand) -> None:
        raise NotImplementedError

    async def generate(self, prompt: Prompt, params: SamplingParams | None = None,
                       priority: int = 0) -> AsyncIterator[StreamDelta]:
        """Yield this prompt's deltas (params.n streams interleaved, told apart by delta.index)."""
        handle = RequestHandle.on_running_loop()
        with self._live_lock:
            self._live.add(handle)
        remaining = -1                        # unknown until the engine has queued it
        try:
            self._submit(AddRequest(prompt, params, priority, handle))
            await handle.accepted             # raises InvalidRequestError for bad input, ShuttingDown
            remaining = handle.streams
            first = True
            while remaining:
                ready = await self._gather(handle, 1 if first else self.stream_interval)
                first = False
                for delta in merge_ready(ready):
                    yield delta
                    if delta.finish_reason == "shutdown":
                        return                # cancel_all: the whole call ends here
                    if delta.finish_reason is not None:
                        remaining -= 1
        finally:
            with self._live_lock:
                self._live.discard(handle)
            if remaining:                     # the caller left early (even before the add was applied)
                self._submit_quietly(AbortRequest(handle))

    def _submit_quietly(self, command: EngineCommand) -> None:
        """An abort on the way out of a call: an engine that is gone has nothing left to free."""
        try:
            self._submit(command)
        except ShuttingDown:
            pass

    @staticmethod
    async def _gather(handle: RequestHandle, tokens: int) -> list[StreamDelta]:
        """The deltas that came for a call: at least one, everything already waiting (a caller that fell
        behind the engine), and more until they carry `tokens` tokens or one ends a stream."""
        ready = [await handle.deltas.get()]
        while True:
            while not handle.deltas.empty():
                ready.append(handle.deltas.get_nowait())
            if sum(len(d.token_ids) for d in ready) >= tokens or any(d.finish_reason for d in ready):
                return ready
            ready.append(await handle.deltas.get())

    async def embed(self, inputs: list[Prompt]) -> list:
        """Engine.embed between steps: [(embedding, token count)] per input."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._live_lock:
            self._live_embeds.add(future)
        try:
            self._submit(EmbedRequest(list(inputs), loop, future))
            return await future               # raises ShuttingDown after cancel_all
        finally:
            with self._live_lock:
                self._live_embeds.discard(future)

    def cancel_all(self) -> None:
        """End every live call now, from any thread (a server draining past its grace period): one
        waiting for the engine (an embed call too) raises ShuttingDown, a running one gets a "shutdown"
        delta. Their requests are then aborted (KV pages freed) between steps, without waiting for the
        engine; an embed call's inputs are then skipped."""
        with self._live_lock:
            live, embeds = list(self._live), list(self._live_embeds)
        for handle in live:
            handle._call(_shut_down, handle)
        for future in embeds:
            try:
                future.get_loop().call_soon_threadsafe(_settle, future, None, ShuttingDown())
            except RuntimeError:              # the caller's loop is closed
                pass


class EngineLoop:
    """The engine's side: between steps it applies the callers' commands (AddRequest, AbortRequest,
    EmbedRequest), then steps and hands each delta to its call. Where the commands come from and how
    answers travel back are the subclass's: _incoming, _idle, _resolve, _send, _answer_embed."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._handles: dict[int, RequestHandle] = {}  # id(request) -> its call's handle; this loop's alone
        self._deferred: list[EmbedRequest] = []        # waiting for KV pages; retried after each step
        self._stopped = False

    # -- what a subclass provides ---------------------------------------------------------
    def _incoming(self) -> list[EngineCommand]:
        """The commands that arrived since the last call (never blocks)."""
        raise NotImplementedError

    def _idle(self) -> None:
        """No work: wait for a command (or half a second)."""
        raise NotImplementedError

    def _resolve(self, handle, error: Exception | None) -> bool:
        """Answer an AddRequest: applied (None) or refused. False when nobody is listening any more."""
        raise NotImplementedError

    def _send(self, items: list[tuple[RequestHandle, StreamDelta]]) -> None:
        raise NotImplementedError

    def _answer_embed(self, command: EmbedRequest, result, error: Exception | None) -> None:
        raise NotImplementedError

    def _flush(self) -> None:
        """The end of one turn of the loop: answers gathered since the last turn may go out at once."""

    # -- the loop ------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopped:
            self._apply_commands()
            if not self.engine.has_work:
                self._flush()
                if not self._stopped:
                    self._idle()
                continue
            try:
                out = self.engine.step()
            except Exception:  # a failed step must not kill the server: fail the live requests
                _log.exception("an engine step failed; its requests are answered with an error")
                self._fail_all("error")
                self._flush()
                continue
            self._deliver(out)
            self._flush()

    def _apply_commands(self) -> None:
        commands, self._deferred = self._deferred + self._incoming(), []
        for command in commands:
            if isinstance(command, AddRequest):
                self._add(command)
            elif isinstance(command, AbortRequest):
                self._abort(command.handle)
            elif isinstance(command, EmbedRequest):
                self._embed(command)
            else:
                raise TypeError(f"unknown engine command {command!r}")

    def _add(self, command: AddRequest) -> None:
        handle = command.handle
        try:
            handle.requests = self.engine.add_request(command.prompt, command.params, priority=command.priority)
        except Exception as e:
            self._resolve(handle, e)
            return
        for r in handle.requests:
            self._handles[id(r)] = handle
        if not self._resolve(handle, None):
            self._abort(handle)

    def _embed(self, command: EmbedRequest) -> None:
        if self._embed_gone(command):         # answered by cancel_all, or the caller went away
            return
        try:
            result, error = self.engine.embed(command.inputs), None
        except EngineBusy as e:
            if self.engine.has_work:
                self._deferred.append(command)      # pages come back as requests finish
                return
            for seq_id in self.engine.scheduler.clear_prefix_cache():   # idle: the cache is all that holds pages
                self.engine.runner.remove_sequence(seq_id)
            try:
                result, error = self.engine.embed(command.inputs), None
            except EngineBusy:
                result, error = None, InvalidRequestError(
                    f"{e}: the input needs more KV pages than the engine holds; shorten it", "input")
            except Exception as again:  # noqa: BLE001 - answered to the caller
                result, error = None, again
        except Exception as e:  # noqa: BLE001 - answered to the caller
            result, error = None, e
        self._answer_embed(command, result, error)

    def _embed_gone(self, command: EmbedRequest) -> bool:
        return False

    def _abort(self, handle) -> None:
        for r in handle.requests:
            self._handles.pop(id(r), None)
            self.engine.abort(r)

    def _deliver(self, out: list[tuple[Request, StreamDelta]]) -> None:
        """A step's deltas to their callers."""
        sent = []
        for request, delta in out:
            handle = self._handles.get(id(request))
            if handle is None:
                continue
            if request.finished:
                self._handles.pop(id(request), None)
            sent.append((handle, delta))
        self._send(sent)

    def _fail_all(self, reason: str) -> None:
        handles = {id(h): h for h in self._handles.values()}.values()
        for handle in handles:
            for r in handle.requests:
                self.engine.abort(r)
        self._send([(h, StreamDelta(r.index, "", [], reason)) for h in handles for r in h.requests])
        self._handles.clear()

    @property
    def num_live(self) -> int:
        return len(self._handles)


class AsyncEngine(Calls, EngineLoop):
    """The engine stepped by a thread of this process; callers await their deltas on their event loops."""

    def __init__(self, engine: Engine, stream_interval: int = 1):
        Calls.__init__(self, stream_interval)
        EngineLoop.__init__(self, engine)
        self._commands: queue.Queue[EngineCommand] = queue.Queue()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kiln-engine", daemon=True)
        self._thread.start()

    def stats(self) -> EngineStats:
        return self.engine.stats()        # safe while the engine thread steps

    async def refresh_stats(self) -> None:
        """stats() is read live here; a process engine (EngineClient) fetches it first."""

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=10)

    # -- the callers' commands to the loop thread --------------------------------------------
    def _submit(self, command: EngineCommand) -> None:
        self._commands.put(command)
        self._wake.set()

    def _incoming(self) -> list[EngineCommand]:
        commands = []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _idle(self) -> None:
        self._wake.wait(timeout=0.5)
        self._wake.clear()

    # -- the loop thread's answers, into each caller's event loop ------------------------------
    def _resolve(self, handle: RequestHandle, error: Exception | None) -> bool:
        handle.streams = len(handle.requests)
        return handle.resolve(error)

    def _embed_gone(self, command: EmbedRequest) -> bool:
        return command.future.done()

    def _answer_embed(self, command: EmbedRequest, result, error: Exception | None) -> None:
        try:
            command.loop.call_soon_threadsafe(_settle, command.future, result, error)
        except RuntimeError:                       # the caller's loop is closed
            pass

    def _send(self, items: list[tuple[RequestHandle, StreamDelta]]) -> None:
        """Deltas to their calls' queues: one call into each caller's event loop for all of its
        deltas (a wake-up a step, not one a token). A call whose loop is closed is aborted."""
        for loop, mine in by_loop(items).items():
            try:
                loop.call_soon_threadsafe(_put_all, mine)
            except RuntimeError:                # that loop is closed: nobody is listening there
                for handle in {id(h): h for h, _ in mine}.values():
                    self._abort(handle)


def by_loop(items: list[tuple[RequestHandle, StreamDelta]]) -> dict:
    """Deltas grouped by their callers' event loops (one wake-up each)."""
    grouped: dict[asyncio.AbstractEventLoop, list[tuple[RequestHandle, StreamDelta]]] = {}
    for handle, delta in items:
        grouped.setdefault(handle.loop, []).append((handle, delta))
    return grouped


def _shut_down(handle: RequestHandle) -> None:
    """On the caller's loop: end one call (see AsyncEngine.cancel_all)."""
    if not handle.accepted.done():
        handle.accepted.set_exception(ShuttingDown())
    else:
        handle.deltas.put_nowait(StreamDelta(0, "", [], "shutdown"))


def _put_all(items: list[tuple[RequestHandle, StreamDelta]]) -> None:
    """On the callers' loop: each delta into its call's queue."""
    for handle, delta in items:
        handle.deltas.put_nowait(delta)


def _settle(future: asyncio.Future, result, error: Exception | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _resolve(future: asyncio.Future, error: Exception | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
