"""A new JSON schema compiles off the engine thread: a running stream keeps its pace meanwhile.

The gaps are timed on the engine thread itself (between the steps that give the running stream a
token), where a compile would stall. The model is widened so that a step costs a few milliseconds,
above Python's thread switch interval, and the engine runs one TVM worker, so that on a small
machine the compile's own core is not counted as a stall (CPU sharing is not blocking). The schema is large and unseen (fresh property names per
run), so its xgrammar compile costs far more than a step.
"""

from __future__ import annotations

import secrets
import statistics
import threading
import time

import pytest
import tvm

from test_tools import serving
from tiny_models import write_tiny_llama

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import kiln
    tmp = tmp_path_factory.mktemp("stall")
    write_tiny_llama(tmp / "model", tied=True, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                     max_position_embeddings=1024)
    with serving(kiln.compile(str(tmp / "model"), target="cpu", quant="q0f32", output=tmp / "art")) as s:
        yield s


def large_schema() -> dict:
    tag = secrets.token_hex(4)
    leaf = {"type": "object", "properties": {f"f{j}_{tag}": {"type": t} for j, t in
                                             enumerate(["string", "integer", "number", "boolean"] * 4)}}
    return {"type": "object", "properties": {f"p{i}_{tag}": {"anyOf": [leaf, {"type": "array", "items": leaf}]}
                                             for i in range(40)}}


def test_a_new_schema_does_not_stall_a_running_stream(served):
    server, engine = served
    client = server.client()
    hi = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(model=server.model, messages=hi, max_tokens=2,
                                   response_format={"type": "json_object"})        # xgrammar loaded and warm
    stamps: list[float] = []
    configured: list[bool] = []
    step = engine.step

    def timed_step():
        if not configured:  # one TVM worker (thread-local pool): the compile's core is not taken from the step
            tvm.get_global_func("runtime.config_threadpool")(0, 1)
            configured.append(True)
        out = step()
        if any(r.index == 0 and r.params.max_tokens == 400 for r, _ in out):
            stamps.append(time.monotonic())
        return out

    started, span = threading.Event(), {}

    def compile_new_schema() -> None:
        started.wait()
        t0 = time.monotonic()
        client.chat.completions.create(
            model=server.model, messages=hi, max_tokens=1,
            response_format={"type": "json_schema", "json_schema": {"name": "big", "schema": large_schema()}})
        span["t"] = (t0, time.monotonic())

    engine.step = timed_step
    thread = threading.Thread(target=compile_new_schema)
    thread.start()
    try:
        for chunk in client.chat.completions.create(model=server.model, messages=hi, max_tokens=400, stream=True,
                                                    temperature=0, extra_body={"ignore_eos": True}):
            if len(stamps) == 20:
                started.set()
    finally:
        started.set()
        thread.join()
        engine.step = step
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    t0, t1 = span["t"]
    during = [b - a for a, b in zip(stamps, stamps[1:]) if a < t1 and b > t0]
    before = [b - a for a, b in zip(stamps, stamps[1:]) if b <= t0]
    median = statistics.median(gaps)
    assert t1 - t0 > 10 * median, "the schema compiled too fast to show a stall; make it larger"
    assert during and before, ("the stream did not run across the schema request", len(stamps), stamps[0] - t0, stamps[-1] - t0, t1 - t0)
    # 3 x the median step; on a loaded shared machine the steps before the request already jitter
    # that much, so the bound is the larger of the two (a blocked engine would gap for t1 - t0).
    bound = max(3 * median, 2 * max(before))
    assert max(during) < bound < (t1 - t0) / 3, (max(during), median, max(before), t1 - t0)
