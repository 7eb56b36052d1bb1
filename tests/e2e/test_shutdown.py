"""`kiln serve` start-up says what it is doing, and SIGTERM drains: no new requests, in-flight streams
finish or end within the grace period, exit code 0."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.e2e


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
