"""`kiln serve` start-up says what it is doing, and SIGTERM drains: no new requests, in-flight streams
finish or end within the grace period, exit code 0."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from kiln.runtime import EngineConfig
from kiln.runtime.server import ServerArgs
from test_server import running_server, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.alone]     # timed: see tests/conftest.py _test_lock


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_drains_and_exits_zero(tiny_artifacts):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kiln.cli", "serve", str(tiny_artifacts["tied"]), "--port",
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.time() < deadline, "the server did not start"
            time.sleep(0.2)
        chunks, errors = [], []

        def stream() -> None:
            body = {"prompt": "hello", "max_tokens": 200, "temperature": 0, "stream": True}
            try:
                with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
                    for line in r.iter_lines():
                        chunks.append(line)
            except httpx.HTTPError as e:
                errors.append(e)
        t = threading.Thread(target=stream)
        t.start()
        while not chunks and t.is_alive():
            time.sleep(0.01)
        started = time.time()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        t.join(timeout=30)
        assert time.time() - started < 15, "shutdown took longer than the grace period"
        assert any("[DONE]" in c for c in chunks) or errors, "the in-flight stream neither finished nor ended"
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=2)
        out = proc.stdout.read()
        assert "loading" in out and "ready" in out, out
    finally:
        if proc.poll() is None:
            proc.kill()


def test_requests_cut_by_the_grace_period_answer_503_not_500(tiny_artifacts):
    """What a drain does once the grace period is over (AsyncEngine.cancel_all): a queued request and
    an embeddings call answer 503 shutting_down, a running stream ends with that error event; nothing
    answers 500. The engine thread is held inside the embedding meanwhile: cancel_all never waits
    for it (a slow step)."""
    args = ServerArgs(engine=EngineConfig(max_num_seqs=1))
    with running_server(tiny_artifacts["tied"], args) as server:
        body = {"prompt": "hello", "max_tokens": 200, "temperature": 0, "ignore_eos": True}
        lines, answers = [], []

        def stream() -> None:
            with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True},
                              timeout=60) as r:
                lines.extend(r.iter_lines())

        def queued() -> None:
            answers.append(httpx.post(f"{server.url}/v1/completions", json=body, timeout=60))

        def embedding() -> None:
            embedded.append(httpx.post(f"{server.url}/v1/embeddings", json={"input": "hello"}, timeout=60))
        embedded, inside, release = [], threading.Event(), threading.Event()
        engine = server.engine.engine
        embed, step = engine.embed, engine.step

        def held_embed(inputs):
            inside.set()
            release.wait(timeout=60)
            return embed(inputs)

        def slow_step():              # the stream lasts 2 s, so the second request queues behind it
            time.sleep(0.01)
            return step()
        engine.embed, engine.step = held_embed, slow_step
        threads = [threading.Thread(target=f) for f in (stream, queued, embedding)]
        threads[0].start()
        wait_for(lambda: server.engine.num_live >= 1, what="the stream to start")
        threads[1].start()
        wait_for(lambda: server.engine.num_live >= 2, what="the second request to queue")
        threads[2].start()
        wait_for(inside.is_set, what="the embedding to reach the engine")
        server.engine.cancel_all()
        threads[2].join(timeout=60)
        release.set()
        for t in threads:
            t.join(timeout=60)
        for answer in (answers[0], embedded[0]):
            assert answer.status_code == 503 and answer.json()["error"]["code"] == "shutting_down", answer.text
        events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
        assert events[-1]["error"]["code"] == "shutting_down", events[-1]
        wait_for(lambda: server.metric("kiln_kv_pages_used") == 0, what="the KV pages to be freed")
