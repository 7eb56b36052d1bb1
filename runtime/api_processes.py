"""`kiln serve --api-processes N`: N HTTP processes in front of one engine process (vLLM's
`--api-server-count`).

    kiln serve (this process: binds the port, starts the others, waits, relays signals)
      engine process      one Engine, one pipe to each HTTP process (engine_process._RemoteLoop)
      HTTP process 0..N-1 uvicorn on the one listening socket, an EngineClient on its own pipe

One HTTP process's Python (JSON, SSE, socket writes: ~30-40 us a token on a 2-vCPU EPYC) bounds what a
server streams, whatever the device can do: SmolLM2 on a GPU at 256 streams computes more tokens a second
than one process can send. The kernel hands each new connection to one of the processes accepting on the
shared socket. The request metrics (/metrics) are kept in a directory all of them write
(PROMETHEUS_MULTIPROC_DIR, set here before they import prometheus_client), so any process's /metrics
reports the whole server; the engine's gauges come from the engine itself.

A signal (SIGINT, SIGTERM) is passed on to the HTTP processes, which drain as one server does; then the
engine is stopped. If the engine or an HTTP process dies, the rest are stopped and kiln serve exits 1.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path

from .engine_process import EngineDied, spawn_engine, stop_engine
from .protocol import StopEngine


def serve_many(artifact: str | Path, args, start: float) -> None:
    """Serve ``artifact`` from args.api_processes HTTP processes over one engine process (blocking)."""
    metrics_dir = tempfile.mkdtemp(prefix="kiln-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir      # inherited by the processes spawned below
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    listener = socket.create_server((args.host, args.port), family=family, backlog=2048)
    ctx = multiprocessing.get_context("spawn")
    links, engine = spawn_engine(artifact, args.engine, links=args.api_processes + 1)
    mine = links.pop()                                        # ours: the engine's readiness, then StopEngine
    workers = [ctx.Process(target=_http_process, args=(link, str(artifact), args, listener, i, start),
                           name=f"kiln-http-{i}") for i, link in enumerate(links)]
    stopping = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stopping.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for w in workers:
            w.start()
        for link in links:
            link.close()
        listener.close()                                      # the HTTP processes hold it now
        while not mine.poll(0.2):                             # the engine loads; a signal stops us meanwhile
            if stopping.is_set():
                return
            if not engine.is_alive():
                raise EngineDied(f"the engine process exited (code {engine.exitcode}) while loading {artifact}")
        loaded = mine.recv()
        if loaded.error is not None:
            raise loaded.error
        failed = _wait(workers, engine, stopping)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for w in workers:
            if w.is_alive():
                w.terminate()
        for w in workers:
            w.join(15)
            if w.is_alive():
                w.kill()
        try:
            mine.send(StopEngine())
        except OSError:
            pass
        stop_engine(engine)
        shutil.rmtree(metrics_dir, ignore_errors=True)
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if failed:
        raise EngineDied(failed)


def _wait(workers: list, engine, stopping: threading.Event) -> str | None:
    """Until a signal (passed on to the HTTP processes, which drain) or a death; what died, if anything."""
    sentinels = {w.sentinel: w for w in workers}
    sentinels[engine.sentinel] = engine
    while True:
        ready = multiprocessing.connection.wait(list(sentinels), timeout=0.2)
        if stopping.is_set():
            for w in workers:
                if w.is_alive():
                    os.kill(w.pid, signal.SIGTERM)            # drain: no new requests, GRACE for the rest
            for w in workers:
                w.join()
            return None
        for sentinel in ready:
            gone = sentinels[sentinel]
            if gone is engine:
                return f"the engine process exited (code {engine.exitcode}); restart kiln serve"
            return f"HTTP process {gone.name} exited (code {gone.exitcode}); restart kiln serve"


def _http_process(link, artifact: str, args, listener: socket.socket, index: int, start: float) -> None:
    """One HTTP process: an EngineClient on its own pipe, uvicorn on the shared socket."""
    from .engine_process import EngineClient
    from .server import serve_http
    try:
        client = EngineClient(artifact, args.engine, args.stream_interval, conn=link)
    except BaseException:          # the engine could not load: kiln serve, told the same, says why
        sys.exit(1)
    try:
        serve_http(client, client.info, artifact, args, start, sockets=[listener], announce=index == 0)
    except Exception as e:  # noqa: BLE001 - one line; kiln serve then stops the others
        print(f"error: HTTP process {index}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
