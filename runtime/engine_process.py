"""The engine in a process of its own, so that the HTTP side's Python never waits for the engine's GIL.

    kiln serve MODEL --engine-process on          # auto: on for GPU artifacts

    HTTP process (uvicorn, FastAPI)                       engine process
      EngineClient: Calls (generate / embed)   --pipe-->   _RemoteLoop: EngineLoop over one Engine
      ModelFront: tokenizer, chat template,    <--pipe--   one message a turn of its loop: the accepted
                  grammar compiles                          calls, every delta of the step, answers

In one process the event loop's per-token work (JSON, SSE writes) and the engine thread share the GIL:
past ~100 streams of a small model the HTTP side's Python bounds the served rate and lengthens the host's
gap between a GPU's forwards. Here each side has a core (vLLM's API server / engine core split).

The wire (protocol.py): AddRequest, AbortRequest and EmbedRequest with a call's number for its handle,
StatsRequest and StopEngine; back, EngineLoaded once, then an EngineReply a turn of the engine's loop
that has anything for that pipe (what it accepted, every delta of the step, answers). A compiled grammar travels serialized (grammar.PreparedFormat) and is deserialized
once per schema on the engine's side. The engine process ignores SIGINT and SIGTERM (the server drains,
then stops it) and exits when its pipes close (the server is gone). If it dies, live calls end with an
"error" finish, new ones are answered 503, /health says so, and on_death tells the server. One engine
process may serve several HTTP processes, a pipe each (runtime/api_processes.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from .artifact import Artifact
from .async_engine import Calls, EngineLoop, RequestHandle, _settle, _resolve
from .engine import Engine, EngineConfig
from .front import ModelFront
from .host_memory import freeze_startup_objects
from .protocol import (AbortRequest, Accepted, AddRequest, Answer, EmbedRequest, EngineCommand, EngineLoaded,
                       EngineReply, EngineStats, ShuttingDown, StatsRequest, StopEngine, StreamDelta)

_log = logging.getLogger("kiln.engine")


class EngineDied(ShuttingDown):
    """The engine process is gone: no call can run (answered 503; the server exits)."""


class EngineClient(Calls):
    """The HTTP process's engine: an Engine stepped in a spawned process, driven over a pipe.

    ``engine`` is the ModelFront the routes use (tokenizer, prompt checks, grammars); ``info`` what the
    engine process reported once loaded (KV capacity, sequences, where tokens are drawn)."""

    def __init__(self, artifact: str | Path, config: EngineConfig | None = None, stream_interval: int = 1,
                 *, conn=None):
        """Spawn an engine process for ``artifact`` and wait until it has loaded; or, given ``conn``, drive
        one that another process started (`kiln serve --api-processes`: one pipe per HTTP process)."""
        super().__init__(stream_interval)
        config = config or EngineConfig()
        self._process = None
        if conn is None:
            (conn,), self._process = spawn_engine(artifact, config, links=1)
        self._conn = conn
        try:
            self.engine = ModelFront(Artifact.load(artifact, verify=False), config.chat_template)
            loaded: EngineLoaded = self._conn.recv()       # the engine process loads (and verifies) meanwhile
        except EOFError:
            raise EngineDied(f"{self._died()} while loading {artifact}") from None
        except BaseException:
            if self._process is not None:
                self._process.kill()
            raise
        if loaded.error is not None:
            if self._process is not None:
                self._process.join(5)
            raise loaded.error
        self.info: dict = loaded.info
        self.on_death: Callable[[], None] = lambda: None   # the server's: stop serving
        self._calls: dict[int, RequestHandle | tuple] = {}  # call id -> its handle, or (loop, future) of a one-shot
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._stats: EngineStats = loaded.info["stats"]     # refreshed by each /metrics scrape
        self._dead = self._closing = False
        self._death = ""                               # how the engine process ended, once it has
        self._reader = threading.Thread(target=self._read, name="kiln-engine-pipe", daemon=True)
        self._reader.start()

    # -- what the server reads ---------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return not self._dead

    def stats(self) -> EngineStats:
        """The EngineStats of the last refresh_stats()."""
        return self._stats

    async def refresh_stats(self) -> None:
        """Fetch the engine's EngineStats (answered between its steps); stats() then returns it."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        call_id = next(self._ids)
        self._calls[call_id] = (loop, future)
        self._send(StatsRequest(call_id))
        self._stats = await future

    def stop(self) -> None:
        """Stop the engine process this client spawned (its live requests are dropped) and wait for it; a
        client of another's engine only hangs up (the engine drops this pipe's requests)."""
        self._closing = True
        if self._process is not None:
            try:
                self._send(StopEngine())
            except ShuttingDown:
                pass
            stop_engine(self._process)
        self._conn.close()

    # -- commands out ----------------------------------------------------------------------
    def _submit(self, command: EngineCommand) -> None:
        if isinstance(command, AddRequest):
            handle = command.handle
            handle.call_id = next(self._ids)
            self._calls[handle.call_id] = handle
            self._send(replace(command, handle=handle.call_id))      # a prepared grammar pickles serialized
        elif isinstance(command, AbortRequest):
            if self._calls.pop(command.handle.call_id, None) is not None:
                self._send(AbortRequest(command.handle.call_id))
        elif isinstance(command, EmbedRequest):
            call_id = next(self._ids)
            self._calls[call_id] = (command.loop, command.future)
            self._send(EmbedRequest(command.inputs, None, call_id))
        else:
            raise TypeError(f"unknown engine command {command!r}")

    def _send(self, message) -> None:
        if self._dead:
            raise EngineDied(self._death)
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, EOFError):
            raise EngineDied("the engine process closed its pipe; restart kiln serve") from None

    # -- answers in (the reader thread) ---------------------------------------------------------
    def _read(self) -> None:
        while True:
            try:
                reply: EngineReply = self._conn.recv()
            except (EOFError, OSError):
                break
            self._dispatch(reply)
        self._death = "the engine process has stopped" if self._closing else self._died()
        self._dead = True
        if self._closing or sys.is_finalizing():
            return
        _log.error("%s; the server stops", self._death)
        self._fail_everything()
        self.on_death()

    def _dispatch(self, reply: EngineReply) -> None:
        """One turn's answers to their calls: one wake-up of each caller's event loop."""
        work: dict[asyncio.AbstractEventLoop, list] = {}
        for a in reply.accepted:
            handle = self._calls.get(a.call_id)
            if handle is None:
                continue
            if a.error is not None:
                self._calls.pop(a.call_id, None)
            handle.streams = handle.left = a.streams
            work.setdefault(handle.loop, []).append((_resolve, handle.accepted, a.error))
        for call_id, delta in reply.deltas:
            handle = self._calls.get(call_id)
            if handle is None:
                continue
            if delta.finish_reason is not None:
                handle.left -= 1
                if not handle.left:
                    self._calls.pop(call_id, None)
            work.setdefault(handle.loop, []).append((handle.deltas.put_nowait, delta))
        for a in reply.answers:
            entry = self._calls.pop(a.call_id, None)
            if entry is not None:
                loop, future = entry
                work.setdefault(loop, []).append((_settle, future, a.result, a.error))
        for loop, calls in work.items():
            try:
                loop.call_soon_threadsafe(_run_all, calls)
            except RuntimeError:                # that loop is closed: its calls are aborted when they unwind
                pass

    def _died(self) -> str:
        if self._process is None:
            return "the engine process closed its pipe; restart kiln serve (its log above says why)"
        self._process.join(1)                  # reap it, so the message can say how it ended
        code = self._process.exitcode
        how = "is still running but its pipe closed" if code is None else \
            f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return f"the engine process {how}; restart kiln serve (its log above says why)"

    def _fail_everything(self) -> None:
        calls, self._calls = self._calls, {}
        error = EngineDied(self._death)
        work: dict[asyncio.AbstractEventLoop, list] = {}
        for entry in calls.values():
            if isinstance(entry, tuple):
                loop, future = entry
                work.setdefault(loop, []).append((_settle, future, None, error))
            else:
                work.setdefault(entry.loop, []).append((_refuse_or_fail, entry, error))
        for loop, items in work.items():
            try:
                loop.call_soon_threadsafe(_run_all, items)
            except RuntimeError:
                pass


def _refuse_or_fail(handle: RequestHandle, error: Exception) -> None:
    """On the caller's loop, once the engine is gone: a call still waiting for its answer is refused; one
    answered meanwhile (the answer was queued first) ends its streams with an error."""
    if not handle.accepted.done():
        handle.accepted.set_exception(error)
        return
    for index in range(max(1, handle.streams)):
        handle.deltas.put_nowait(StreamDelta(index, "", [], "error"))


def _run_all(calls: list[tuple]) -> None:
    for fn, *args in calls:
        fn(*args)


# -- the engine process ---------------------------------------------------------------------------
def spawn_engine(artifact: str | Path, config: EngineConfig, links: int) -> tuple[list, Any]:
    """Start an engine process for ``artifact`` with ``links`` pipes to it: ([our ends], the process).
    Each pipe gets EngineLoaded once it has loaded (or failed to)."""
    ctx = multiprocessing.get_context("spawn")       # never fork a process that holds TVM or threads
    pairs = [ctx.Pipe() for _ in range(links)]
    process = ctx.Process(target=_engine_main, args=([child for _, child in pairs], str(artifact), config),
                          name="kiln-engine", daemon=True)
    process.start()
    for _, child in pairs:
        child.close()
    return [ours for ours, _ in pairs], process


def loaded_info(engine: Engine) -> dict:
    """What `kiln serve` says it loaded: KV capacity, sequences, where sampled tokens are drawn, the BLAS note."""
    runner = engine.runner
    return {"max_total_tokens": runner.max_total_tokens, "max_num_seqs": runner.max_num_seqs,
            "samples_on_device": engine.samples_on_device, "library_gemm_note": runner.library_gemm_note()}


def stop_engine(process) -> None:
    """Wait for an engine process told to stop; kill it if it does not."""
    process.join(10)
    if process.is_alive():
        process.kill()
        process.join(5)


def _engine_main(conns: list, artifact: str, config: EngineConfig) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):       # the server's (a whole process group gets them): it
        signal.signal(sig, signal.SIG_IGN)             # drains, then stops us; closed pipes stop us too
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    try:
        engine = Engine(artifact, config)
    except BaseException as e:  # noqa: BLE001 - reported to the server, which raises it
        for conn in conns:
            conn.send(EngineLoaded(None, _portable(e)))
        return
    ready = EngineLoaded({**loaded_info(engine), "pid": os.getpid(), "stats": engine.stats()})
    freeze_startup_objects()
    for conn in conns:
        conn.send(ready)
    _RemoteLoop(engine, conns)._loop()


class _Link:
    """One HTTP process's pipe, its live calls, and what goes back to it at the end of the turn."""

    def __init__(self, conn):
        self.conn = conn
        self.calls: dict[int, _RemoteCall] = {}
        self.reply = EngineReply()


class _RemoteCall:
    """The engine process's view of one call: its pipe, its number there, its requests."""

    __slots__ = ("link", "call_id", "requests")

    def __init__(self, link: _Link, call_id: int):
        self.link = link
        self.call_id = call_id
        self.requests: list = []


class _RemoteLoop(EngineLoop):
    def __init__(self, engine: Engine, conns: list):
        super().__init__(engine)
        self._links = [_Link(c) for c in conns]

    def _incoming(self) -> list[EngineCommand]:
        commands: list[EngineCommand] = []
        for link in list(self._links):
            try:
                while link.conn.poll(0):
                    self._take(link, link.conn.recv(), commands)
            except (EOFError, OSError):       # that HTTP process is gone: nothing listens to its calls
                self._hang_up(link, commands)
        return commands

    def _hang_up(self, link: _Link, commands: list[EngineCommand]) -> None:
        self._links.remove(link)
        commands += [AbortRequest(call) for call in link.calls.values()]
        link.calls.clear()
        if not self._links:
            self._stopped = True

    def _take(self, link: _Link, message, commands: list[EngineCommand]) -> None:
        if isinstance(message, AddRequest):
            call = link.calls[message.handle] = _RemoteCall(link, message.handle)
            commands.append(replace(message, handle=call))
        elif isinstance(message, AbortRequest):
            call = link.calls.pop(message.handle, None)
            if call is not None:
                commands.append(AbortRequest(call))
        elif isinstance(message, EmbedRequest):
            commands.append(replace(message, future=(link, message.future)))   # where to answer
        elif isinstance(message, StatsRequest):
            link.reply.answers.append(Answer(message.call_id, self.engine.stats()))
        elif isinstance(message, StopEngine):
            self._stopped = True
        else:
            raise TypeError(f"unknown message from the server {message!r}")

    def _idle(self) -> None:
        multiprocessing.connection.wait([link.conn for link in self._links], 0.5)

    def _resolve(self, call: _RemoteCall, error: Exception | None) -> bool:
        if error is not None:
            call.link.calls.pop(call.call_id, None)
        call.link.reply.accepted.append(Accepted(call.call_id, len(call.requests),
                                                 None if error is None else _portable(error)))
        return True

    def _send(self, items: list[tuple[_RemoteCall, StreamDelta]]) -> None:
        for call, delta in items:
            if delta.finish_reason is not None and all(r.finished for r in call.requests):
                call.link.calls.pop(call.call_id, None)
            call.link.reply.deltas.append((call.call_id, delta))

    def _answer_embed(self, command: EmbedRequest, result, error: Exception | None) -> None:
        link, call_id = command.future
        link.reply.answers.append(Answer(call_id, result, None if error is None else _portable(error)))

    def _flush(self) -> None:
        for link in self._links:
            if not link.reply:
                continue
            reply, link.reply = link.reply, EngineReply()
            try:
                link.conn.send(reply)
            except (OSError, EOFError):       # gone: the next turn's poll hangs it up
                pass


def _portable(error: BaseException) -> BaseException:
    """``error`` as it can cross the pipe: itself when it pickles back whole, else a RuntimeError
    with its type and message."""
    try:
        back = pickle.loads(pickle.dumps(error))
        if type(back) is type(error) and str(back) == str(error):
            return error
    except Exception:  # noqa: BLE001 - any failure to round-trip means: send its text
        pass
    return RuntimeError(f"{type(error).__name__}: {error}")
