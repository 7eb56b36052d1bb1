"""`kiln serve --engine-process on`: what only a separate engine process can do wrong. (Every route's
behaviour through the pipe is test_server.py's, whose server fixture runs both ways.)

- a dead engine process: the stream in flight ends with an error event, /health says 503, a new request
  is a 503, and the server is told (kiln serve then exits 1 with one line);
- SIGTERM to the whole process group (what systemd and docker send) still drains and exits 0, and no
  engine process is left behind;
- an artifact that fails to load in the engine process is refused in one line, as without it;
- a compiled grammar crosses the pipe once per schema and is used there, not recompiled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import httpx
import openai
import pytest

from kiln.runtime import EngineConfig
from kiln.runtime.server import ServerArgs
from test_server import running_server, wait_for
from test_shutdown import _free_port

pytestmark = pytest.mark.e2e


def _children(pid: int) -> list[int]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def test_a_dead_engine_process_fails_calls_cleanly(tiny_artifacts):
    with running_server(tiny_artifacts["tied"], ServerArgs(model_name="m"), engine_process=True) as server:
        told = threading.Event()
        server.engine.on_death = told.set
        client = server.client()
        events, errors = [], []

        def stream() -> None:
            try:
                for chunk in client.completions.create(model="m", prompt="hello", max_tokens=200, stream=True,
                                                       temperature=0, extra_body={"ignore_eos": True}):
                    events.append(chunk)
                    if len(events) == 1:    # killed here, not by a thread polling for the chunk: the tiny
                        server.engine._process.kill()   # model's 200 tokens once all came first under load
            except openai.APIError as e:
                errors.append(e)
        t = threading.Thread(target=stream)
        t.start()
        t.join(timeout=30)
        assert errors and "engine failed" in str(errors[0]), (len(events), errors)
        assert len(events) < 200
        wait_for(told.is_set, what="the server to be told")
        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503 and "engine" in health.json()["status"]
        with pytest.raises(openai.APIStatusError) as e:
            client.completions.create(model="m", prompt="hello", max_tokens=4)
        assert e.value.status_code == 503


def test_group_sigterm_drains_exits_zero_and_leaves_no_engine(tiny_artifacts):
    proc, url = _start([str(tiny_artifacts["tied"]), "--engine-process", "on"])
    try:
        engines = _spawned(proc.pid)
        assert len(engines) == 1
        body = {"prompt": "hello", "max_tokens": 40, "temperature": 0, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        lines: list[str] = []
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if not lines:
                    os.killpg(proc.pid, signal.SIGTERM)      # the server and its engine, as systemd does
                lines.append(line)
        assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]", lines[-3:]
        usage = [json.loads(x[6:])["usage"] for x in lines if x.startswith("data: {")][-1]
        assert usage["completion_tokens"] == 40        # the stream in flight finished
        assert proc.wait(timeout=30) == 0
        out = proc.stdout.read()
        assert "in engine process" in out and "ready" in out, out
        wait_for(lambda: not os.path.exists(f"/proc/{engines[0]}") or _zombie(engines[0]),
                 what="the engine process to exit")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("flags", [("--engine-process", "on"), ("--api-processes", "2")])
def test_an_artifact_the_engine_process_refuses_is_one_line(tiny_artifacts, tmp_path, flags):
    import shutil
    bad = tmp_path / "corrupt"
    shutil.copytree(tiny_artifacts["tied"], bad)
    lib = bad / "lib.so"
    lib.write_bytes(lib.read_bytes()[:-16] + b"\0" * 16)           # the hash no longer matches
    proc = subprocess.run([sys.executable, "-m", "kiln.cli", "serve", str(bad), "--port", str(_free_port()), *flags],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "lib.so" in errors[0], proc.stderr      # one line, not one a process


def test_a_schema_compiles_once_and_crosses_the_pipe(tiny_artifacts):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    args = ServerArgs(model_name="m", engine=EngineConfig(max_num_seqs=4))
    with running_server(tiny_artifacts["tied"], args, engine_process=True) as server:
        client = server.client()
        for seed in (5, 6):
            out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "ok?"}],
                                                 max_tokens=200, temperature=1.0, seed=seed, response_format=fmt)
            assert out.choices[0].finish_reason == "stop"
            value = json.loads(out.choices[0].message.content)
            assert set(value) == {"ok"} and isinstance(value["ok"], bool)     # this schema, not any object
        front = server.engine.engine.grammar_compiler()
        assert front.cached_grammars == 1 and len(front._wire) == 1     # compiled and serialized once


def _start(args: list[str]) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kiln.cli", "serve", *args, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _healthy(url) or proc.poll() is not None, timeout=120, what="the server to start")
    assert proc.poll() is None, proc.stdout.read()
    return proc, url


def _spawned(pid: int) -> list[int]:
    """Its children multiprocessing spawned (not its resource tracker)."""
    return [c for c in _children(pid) if b"spawn_main" in _cmdline(c)]


def test_two_http_processes_share_the_port_and_their_metrics(tiny_artifacts):
    proc, url = _start([str(tiny_artifacts["tied"]), "--api-processes", "2", "--model-name", "m"])
    try:
        assert len(_spawned(proc.pid)) == 3                  # the engine and two HTTP processes
        prompts = [[5, 6, 7, i] for i in range(24)]

        def one(prompt: list[int]) -> int:
            with httpx.Client() as c:                        # a connection each: the kernel picks a process
                r = c.post(f"{url}/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 3,
                                                          "temperature": 0}, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["usage"]["completion_tokens"]
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(12) as pool:
            generated = sum(pool.map(one, prompts))
        for _ in range(6):                                   # whichever process answers: the whole server
            with httpx.Client() as c:
                text = c.get(f"{url}/metrics").text
            values = dict(line.split(" ", 1) for line in text.splitlines() if line.startswith("kiln_"))
            assert float(values["kiln_prompt_tokens_total"]) == 4 * len(prompts)
            assert float(values["kiln_generation_tokens_total"]) == generated
            assert float(values["kiln_time_to_first_token_seconds_count"]) == len(prompts)
            assert float(values["kiln_requests_running"]) == 0
        children = _spawned(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        out = proc.stdout.read()
        assert "(2 HTTP processes)" in out and "Traceback" not in out, out
        assert "GiB, float32), up to" in out, out                    # the startup line names the KV cache's dtype
        wait_for(lambda: all(_zombie(c) or not os.path.exists(f"/proc/{c}") for c in children),
                 what="every child to exit")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_http_processes_end_with_their_engine(tiny_artifacts):
    proc, url = _start([str(tiny_artifacts["tied"]), "--api-processes", "2"])
    try:
        engine = _spawned(proc.pid)[0]                        # started first
        os.kill(engine, signal.SIGKILL)
        assert proc.wait(timeout=60) == 1
        out = proc.stdout.read()
        assert out.strip().splitlines()[-1].startswith("error: ") and "engine process" in out, out
        assert "Traceback" not in out, out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_several_http_processes_need_the_engine_process(tiny_artifacts):
    proc = subprocess.run([sys.executable, "-m", "kiln.cli", "serve", str(tiny_artifacts["tied"]), "--api-processes",
                           "2", "--engine-process", "off", "--port", str(_free_port())],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: several HTTP processes"), proc.stderr
