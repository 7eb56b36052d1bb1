"""AsyncEngine on the tiny model: its typed commands (protocol.AddRequest / AbortRequest) reach the
engine thread, which streams the same tokens as Engine.generate, refuses bad input through the
caller, and frees a request's pages whenever its caller stops listening, even before it was queued."""

from __future__ import annotations

import asyncio
import contextlib
import time
import pytest

from kiln.runtime import Engine, EngineConfig, InvalidRequestError, SamplingParams
from kiln.runtime.async_engine import AsyncEngine

pytestmark = pytest.mark.e2e

PROMPT = list(range(30, 70))
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
LONG = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)


@pytest.fixture()
def aengine(tiny_artifacts, monkeypatch):
    """An AsyncEngine whose engine records every request it makes in `.made`."""
    engine = Engine(tiny_artifacts["tied"], EngineConfig(enable_prefix_cache=False))
    engine.made = []
    add = engine.add_request

    def recording_add(*args, **kwargs):
        requests = add(*args, **kwargs)
        engine.made += requests
        return requests

    monkeypatch.setattr(engine, "add_request", recording_add)
    a = AsyncEngine(engine)
    yield a
    a.stop()


def wait_until_done(aengine: AsyncEngine, timeout: float = 30.0) -> None:
    """Until every request the engine made has finished and its pages are free."""
    engine = aengine.engine

    def done() -> bool:
        return (bool(engine.made) and all(r.finished for r in engine.made) and not engine.has_work
                and engine.stats().kv_pages_used == 0)

    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the engine did not finish its requests"
        time.sleep(0.02)


def test_streams_the_same_tokens_as_engine_generate(aengine, tiny_artifacts):
    expected = Engine(tiny_artifacts["tied"]).generate(PROMPT, GREEDY).token_ids

    async def collect():
        return [d async for d in aengine.generate(PROMPT, GREEDY)]

    deltas = asyncio.run(collect())
    assert [t for d in deltas for t in d.token_ids] == expected
    assert deltas[-1].finish_reason == "length" and all(d.finish_reason is None for d in deltas[:-1])
    wait_until_done(aengine)


def test_a_stream_interval_gathers_tokens_into_fewer_deltas(tiny_artifacts):
    """`kiln serve --stream-interval 4`: deltas of at least 4 tokens but the first and the last; the
    same tokens and text as one delta a token. (The first delta's size depends on when the consumer wakes:
    everything already waiting goes with it; the gathering rule itself is the next test's.)"""
    engine = Engine(tiny_artifacts["tied"], EngineConfig(enable_prefix_cache=False))
    expected = engine.generate(PROMPT, GREEDY)
    a = AsyncEngine(engine, stream_interval=4)

    async def collect():
        return [d async for d in a.generate(PROMPT, GREEDY)]

    try:
        deltas = asyncio.run(collect())
    finally:
        a.stop()
    sizes = [len(d.token_ids) for d in deltas]
    assert all(n >= 4 for n in sizes[1:-1]) and sum(sizes) == GREEDY.max_tokens
    assert len(deltas) <= 1 + -(-(GREEDY.max_tokens - 1) // 4)
    assert [t for d in deltas for t in d.token_ids] == expected.token_ids
    assert "".join(d.text for d in deltas) == expected.text and deltas[-1].finish_reason == "length"
    with pytest.raises(ValueError, match="at least 1"):
        AsyncEngine(engine, stream_interval=0)


def test_gathering_takes_what_waits_and_waits_for_the_rest():
    """Calls._gather: the first delta goes at once (1 token asked); later ones wait until they carry
    the interval's tokens, or one ends its stream; a caller behind the engine takes everything waiting."""
    from kiln.runtime.async_engine import Calls, RequestHandle
    from kiln.runtime.protocol import StreamDelta

    def delta(n, finish=None):
        return StreamDelta(0, "x" * n, [7] * n, finish)

    async def run():
        handle = RequestHandle.on_running_loop()
        handle.deltas.put_nowait(delta(1))
        first = await Calls._gather(handle, 1)
        pending = asyncio.ensure_future(Calls._gather(handle, 4))
        for _ in range(3):
            handle.deltas.put_nowait(delta(1))
            await asyncio.sleep(0)
        waited = pending.done()
        handle.deltas.put_nowait(delta(1))
        second = await pending
        for n in (2, 3, 1):
            handle.deltas.put_nowait(delta(n))
        behind = await Calls._gather(handle, 1)
        handle.deltas.put_nowait(delta(1, "stop"))
        last = await Calls._gather(handle, 4)
        return first, waited, second, behind, last

    first, waited, second, behind, last = asyncio.run(run())
    assert [len(d.token_ids) for d in first] == [1] and not waited
    assert [len(d.token_ids) for d in second] == [1, 1, 1, 1]
    assert [len(d.token_ids) for d in behind] == [2, 3, 1]
    assert len(last) == 1 and last[0].finish_reason == "stop"


def test_bad_input_is_raised_to_the_caller(aengine):
    async def first_delta():
        return await anext(aengine.generate([1, 10 ** 9], GREEDY))

    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        asyncio.run(first_delta())
    assert not aengine.engine.made and not aengine.engine.has_work


def test_closing_the_stream_aborts_and_frees_pages(aengine):
    async def two_deltas_then_close():
        stream = aengine.generate(PROMPT, LONG)
        await anext(stream)
        await anext(stream)
        await stream.aclose()
        await asyncio.to_thread(wait_until_done, aengine)      # the caller's loop stays open meanwhile

    asyncio.run(two_deltas_then_close())
    (request,) = aengine.engine.made
    assert request.finish_reason == "abort" and len(request.output_ids) < LONG.max_tokens


def test_cancelled_before_the_add_was_applied_still_aborts(aengine):
    async def cancel_early():
        task = asyncio.ensure_future(anext(aengine.generate(PROMPT, LONG)))
        await asyncio.sleep(0)             # the AddRequest is queued; the caller awaits its acceptance
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.to_thread(wait_until_done, aengine)

    asyncio.run(cancel_early())
    (request,) = aengine.engine.made
    assert request.finish_reason == "abort" and len(request.output_ids) < LONG.max_tokens


def test_a_caller_whose_event_loop_closed_does_not_stop_the_engine(aengine):
    stream = aengine.generate(PROMPT, LONG)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(anext(stream))
    loop.close()                           # gone mid-stream, its generator never closed
    wait_until_done(aengine)
    assert aengine.engine.made[0].finish_reason == "abort"

    async def collect():
        return [d async for d in aengine.generate(PROMPT, GREEDY)]

    assert sum(len(d.token_ids) for d in asyncio.run(collect())) == GREEDY.max_tokens
    asyncio.run(stream.aclose())


def test_a_caller_that_falls_behind_gets_the_waiting_tokens_in_one_delta(aengine, tiny_artifacts):
    """While the caller's loop is busy the engine goes on stepping; the deltas that piled up come out
    as one (a server then sends one chunk for them): the same tokens, text and logprobs, in order."""
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=True, top_logprobs=2)
    expected = Engine(tiny_artifacts["tied"]).generate(PROMPT, params)

    async def slow_reader():
        got = []
        async for delta in aengine.generate(PROMPT, params):
            got.append(delta)
            if len(got) == 1:                 # block the loop until the engine thread has stepped on
                request, deadline = aengine.engine.made[-1], time.monotonic() + 30
                while len(request.output_ids) < 6 and time.monotonic() < deadline:
                    time.sleep(0.01)
        return got

    deltas = asyncio.run(slow_reader())
    assert len(deltas) < len(expected.token_ids)                     # some came merged
    assert [t for d in deltas for t in d.token_ids] == expected.token_ids
    assert "".join(d.text for d in deltas) == expected.text
    merged_logprobs = [lp for d in deltas for lp in d.logprobs]
    assert [lp.token_id for lp in merged_logprobs] == expected.token_ids
    assert [lp.top for lp in merged_logprobs] == [lp.top for lp in expected.logprobs]
    assert deltas[-1].finish_reason == "length" and all(d.finish_reason is None for d in deltas[:-1])
    wait_until_done(aengine)


def test_a_failed_step_ends_every_live_call_with_an_error_and_frees_its_pages(aengine, monkeypatch):
    """The engine thread survives a step that raises: each call still listening gets an "error" delta
    (both calls here, through one wake-up of their loop), and their requests are aborted."""
    engine, step = aengine.engine, aengine.engine.step
    broken = {"left": 0}

    def failing_step():
        if broken["left"]:
            broken["left"] -= 1
            raise RuntimeError("a device fault, say")
        return step()

    monkeypatch.setattr(engine, "step", failing_step)

    async def two_calls():
        streams = [aengine.generate(PROMPT, LONG), aengine.generate(list(range(80, 100)), LONG)]
        firsts = [await anext(s) for s in streams]
        broken["left"] = 1
        rests = [[d async for d in s] for s in streams]
        return [[f, *rest] for f, rest in zip(firsts, rests)]

    for deltas in asyncio.run(asyncio.wait_for(two_calls(), timeout=60)):
        assert deltas[-1].finish_reason == "error" and len(deltas) < LONG.max_tokens
    wait_until_done(aengine)
