"""A new JSON schema compiles off the engine thread: a running stream keeps its pace meanwhile.

The gaps are timed on the engine thread itself (between the steps that give the running stream a
token), where a compile would stall. The model is widened so that a step costs ~10 ms, above
Python's thread switch interval and a loaded machine's scheduling jitter, and the engine runs one
TVM worker, so that on a small machine the compile's own core is not counted as a stall (CPU
sharing is not blocking). The schema is large and unseen (fresh property names per run), so its
xgrammar compile costs far more than a step. The schema request comes from another process, as
a real client's would: a client inside the server's process would take the GIL from the engine.

The engine's token budget is 4 a step (`kiln serve --max-tokens-per-step 4`, what a server tuned for
inter-token latency sets): the new request's own prompt then prefills in small chunks beside the
stream. With the default budget (the artifact's prefill chunk) that prompt goes in one step, which on
this model costs 2.6-3.3 x a decode step with no schema at all (measured: 4 streams of 102 steps,
a plain request at step 100), so the gaps would measure the prefill, not the compile; with 4 the
same runs stay under 1.45 x.

Checked both ways (this host, stop 50): passes at 1.54 x the median, 95% of the pace; with the
server's compile_grammar made to hand the schema to the engine thread unprepared, both runs fail,
the longest gaps 694 and 768 ms of 717 and 795 ms compiles, 3 steps (4-5% of the pace) across them.
"""

from __future__ import annotations

import json
import secrets
import statistics
import subprocess
import sys
import threading
import time

import pytest
import tvm

from test_tools import serving
from tiny_models import write_tiny_llama

pytestmark = [pytest.mark.e2e, pytest.mark.alone]     # timed: see tests/conftest.py _test_lock

STREAM_TOKENS, REQUEST_AT, WARMUP, AFTER = 900, 100, 20, 20    # the stream stops AFTER tokens past the request

CLIENT = """
import sys, urllib.request
url, body = sys.argv[1], sys.stdin.readline().encode()
sys.stdin.readline()                                    # "go"
request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
print(urllib.request.urlopen(request, timeout=300).status, flush=True)
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import kiln
    tmp = tmp_path_factory.mktemp("stall")
    write_tiny_llama(tmp / "model", tied=True, hidden_size=1024, intermediate_size=2048, num_hidden_layers=4,
                     max_position_embeddings=1024)
    artifact = kiln.compile(str(tmp / "model"), target="cpu", quant="q0f32", output=tmp / "art")
    with serving(artifact, kiln.EngineConfig(max_num_seqs=8, max_tokens_per_step=4)) as s:
        yield s


def large_schema() -> dict:
    tag = secrets.token_hex(4)
    leaf = {"type": "object", "properties": {f"f{j}_{tag}": {"type": t} for j, t in
                                             enumerate(["string", "integer", "number", "boolean"] * 4)}}
    return {"type": "object", "properties": {f"p{i}_{tag}": {"anyOf": [leaf, {"type": "array", "items": leaf}]}
                                             for i in range(40)}}


def stream_gaps(served, request: dict) -> tuple[list[float], list[float], float]:
    """Run a greedy stream; at its REQUEST_AT-th token another process sends ``request``; the stream is
    closed soon after the answer. Returns (every gap after warm-up, the gaps overlapping the
    request, the request's wall time)."""
    server, engine = served
    hi = [{"role": "user", "content": "hi"}]
    stamps: list[float] = []
    configured: list[bool] = []
    step = engine.step

    def timed_step():
        if not configured:      # one TVM worker (a thread-local pool): the compile gets the other core
            tvm.get_global_func("runtime.config_threadpool")(0, 1)
            configured.append(True)
        out = step()
        if any(r.params.max_tokens == STREAM_TOKENS for r, _ in out):
            stamps.append(time.monotonic())
        return out

    client = subprocess.Popen([sys.executable, "-c", CLIENT, f"{server.url}/v1/chat/completions"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    client.stdin.write(json.dumps(request) + "\n")
    client.stdin.flush()
    span: dict[str, float] = {}

    def send_when_due() -> None:
        while len(stamps) < REQUEST_AT and "end" not in span:
            time.sleep(0.001)
        span["t0"] = time.monotonic()
        client.stdin.write("go\n")
        client.stdin.flush()
        span["status"] = client.stdout.readline().strip()
        span["t1"] = time.monotonic()
        span["answered_at"] = len(stamps)

    engine.step = timed_step
    sender = threading.Thread(target=send_when_due)
    sender.start()
    stream = server.client().chat.completions.create(
        model=server.model, messages=hi, max_tokens=STREAM_TOKENS, stream=True, temperature=0,
        extra_body={"ignore_eos": True})
    try:
        with stream:
            for _ in stream:
                if len(stamps) > span.get("answered_at", STREAM_TOKENS) + AFTER:
                    break
    finally:
        span["end"] = time.monotonic()
        sender.join()
        engine.step = step
        client.kill()
        client.wait()
    assert span["status"] == "200", span
    pairs = list(zip(stamps[WARMUP:], stamps[WARMUP + 1:]))
    t0, t1 = span["t0"], span["t1"]
    assert t1 < stamps[-1], f"the stream ended before the request was answered ({t1 - t0:.1f} s); make it longer"
    return [b - a for a, b in pairs], [b - a for a, b in pairs if a < t1 and b > t0], t1 - t0


def schema_request(model: str) -> dict:
    """A chat request with a large schema never seen before (its xgrammar compile is not cached)."""
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": large_schema()}}}


def stalled(during: list[float], median: float, took: float) -> bool:
    """A stall is the engine waiting on the compile: one gap holding a sizeable part of the compile's
    time (a quarter of it), or the stream's pace across the compile under half its median pace. A gap
    of a few steps is not one: on a 2-core host the compile's Python parts share the GIL and the
    cores with the engine (stop 49's CI: gaps of 3.1 and 4.2 x a median of 11 ms, 48 ms at most,
    while 104 steps ran across a 1.2 s compile, 96% of the stream's pace)."""
    return max(during) > took / 4 or len(during) * median < took / 2


def test_a_new_schema_does_not_stall_a_running_stream(served):
    """A stall recurs with every new schema; a busy host's one-off hiccup does not, so a run that
    looks stalled is repeated once with another new schema and the test fails only when both do."""
    server, _ = served
    server.client().chat.completions.create(        # xgrammar loaded and warm, the server's paths too
        model=server.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        response_format={"type": "json_object"})
    reports = []
    for _ in range(2):
        gaps, during, took = stream_gaps(served, schema_request(server.model))
        median = statistics.median(gaps)
        assert took > 20 * median, "the schema compiled too fast to show a stall; make it larger"
        assert during, "the stream did not run across the schema request"
        reports.append(f"longest gap {max(during) * 1e3:.0f} ms = {max(during) / median:.2f} x the median "
                       f"({median * 1e3:.1f} ms), {len(during)} steps = {len(during) * median / took:.0%} of "
                       f"the median pace while the schema compiled ({took * 1e3:.0f} ms); "
                       f"{max(gaps) / median:.2f} x over all {len(gaps)}")
        print(reports[-1])                       # pytest -rP shows it
        if not stalled(during, median, took):
            return
    pytest.fail("the stream stalled in two runs: " + "; ".join(reports))
