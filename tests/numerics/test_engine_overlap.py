"""The engine's overlapped step (EngineConfig.overlap): the next decode is launched before a step's
tokens are detokenized, stop-matched and shown. On a CPU the forward runs inside the launch, so these
tests switch it on to check that it never changes what a request generates, and that requests ending
or leaving while a lookahead forward is queued give back every KV page (TVM's count agreeing)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import Engine, EngineConfig, SamplingParams

pytestmark = pytest.mark.numerics
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 500, size=int(rng.integers(2, 60))).tolist() for _ in range(n)]


def _engines(artifact, **config):
    return {overlap: Engine(artifact, EngineConfig(overlap=overlap, **config)) for overlap in (False, True)}


def _pages_back(engine: Engine) -> None:
    """Every page is free or held by the prefix cache, and TVM's cache agrees with the accounting."""
    sched = engine.scheduler
    cached = set(sched.prefix_cache.seq_ids()) if sched.prefix_cache is not None else set()
    assert set(sched.pages.seq_ids()) <= cached
    assert engine.runner.free_pages() == sched.pages.free_pages


def test_overlap_is_off_on_a_cpu_unless_asked(tiny_artifacts):
    assert not Engine(tiny_artifacts["tied"]).overlap
    assert Engine(tiny_artifacts["tied"], EngineConfig(overlap=True)).overlap


@pytest.mark.parametrize("config", [dict(), dict(max_tokens_per_step=16), dict(max_num_seqs=2),
                                    dict(max_total_tokens=160, enable_prefix_cache=False)],
                         ids=["plain", "chunked-prefill", "queued", "preempting"])
def test_same_tokens_with_and_without_overlap(tiny_artifacts, config):
    """Continuous batching with chunked prefill, admissions waiting for a slot and preemption under a
    10-page KV cache: the overlapped engine's lookahead forwards give the same greedy tokens."""
    prompts = [p[:50] for p in _prompts(5, seed=3)]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    outs, stats = {}, {}
    for overlap, engine in _engines(tiny_artifacts["tied"], **config).items():
        outs[overlap] = [o.token_ids for o in engine.generate(prompts, params)]
        stats[overlap] = engine.stats()
        _pages_back(engine)
    assert outs[True] == outs[False]
    assert stats[False].lookahead_forwards == 0 < stats[True].lookahead_forwards
    assert stats[True].forwards <= stats[False].forwards + len(prompts)


@pytest.mark.parametrize("logprobs", [False, True], ids=["launched", "on-the-host"])
def test_stop_strings_and_stop_tokens_end_the_same_way(tiny_artifacts, logprobs):
    """A stop string is found only when the text is made, after the next step was decided (and
    launched, where the device picks the tokens; with logprobs the batch waits for the next step):
    the request still ends where it would have (its row of that step is dropped), and one that ends on
    a stop token or its last token gives back its slot before the next step is decided."""
    base = Engine(tiny_artifacts["tied"], EngineConfig(enable_prefix_cache=False))
    prompts = _prompts(4, seed=11)
    free_run = base.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    stop = free_run[0].text[4:7]                              # a piece of the first request's text
    stop_id = free_run[1].token_ids[5]
    common = dict(temperature=0.0, ignore_eos=True, logprobs=logprobs)
    params = [SamplingParams(max_tokens=16, stop=[stop], **common),
              SamplingParams(max_tokens=16, stop_token_ids=[stop_id], **common),
              SamplingParams(max_tokens=3, **common),
              SamplingParams(max_tokens=16, **common)]
    results = {}
    for overlap, engine in _engines(tiny_artifacts["tied"]).items():
        requests = [engine.add_request(p, sp)[0] for p, sp in zip(prompts, params)]
        while engine.has_work:
            engine.step()
        results[overlap] = [(r.output_ids, r.text, r.finish_reason) for r in requests]
        _pages_back(engine)
    assert results[True] == results[False]
    assert [reason for _, _, reason in results[True]] == ["stop", "stop", "length", "length"]
    assert stop not in results[True][0][1] and len(results[True][0][0]) < 16


@pytest.mark.parametrize("logprobs", [False, True], ids=["launched", "on-the-host"])
def test_abort_while_the_next_step_is_decided(tiny_artifacts, logprobs):
    engine = Engine(tiny_artifacts["tied"], EngineConfig(overlap=True, enable_prefix_cache=False))
    free = engine.runner.free_pages()
    prompts = _prompts(3, seed=5)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=logprobs)
    requests = [engine.add_request(p, params)[0] for p in prompts]
    while engine._ahead is None:
        engine.step()
    engine.abort(requests[1])                                  # its row of the step decided ahead is dropped
    while engine.has_work:
        engine.step()
    alone = Engine(tiny_artifacts["tied"], EngineConfig(enable_prefix_cache=False))
    assert [requests[i].output_ids for i in (0, 2)] == [alone.generate(prompts[i], GREEDY).token_ids for i in (0, 2)]
    assert requests[1].finish_reason == "abort" and len(requests[1].output_ids) < GREEDY.max_tokens
    engine.step()                                              # nothing left: nothing is decided ahead
    assert engine._ahead is None
    assert engine.scheduler.pages.used_pages == 0 and engine.runner.free_pages() == free


def test_an_embedding_between_steps_waits_for_the_queued_forward(tiny_artifacts):
    engine = Engine(tiny_artifacts["tied"], EngineConfig(overlap=True))
    idle = Engine(tiny_artifacts["tied"])
    text_ids = list(range(20, 60))
    request = engine.add_request(list(range(100, 130)), GREEDY)[0]
    while engine._ahead is None:
        engine.step()
    [(vec, n)] = engine.embed([text_ids])
    [(ref, _)] = idle.embed([text_ids])
    while engine.has_work:
        engine.step()
    assert n == len(text_ids) and np.abs(vec - ref).max() < 1e-5
    assert request.output_ids == idle.generate(list(range(100, 130)), GREEDY).token_ids


def test_an_embedding_while_every_sequence_runs_is_refused_as_busy(tiny_artifacts):
    """With max_num_seqs sequences running, an embedding (a sequence of its own for a moment) is EngineBusy (the
    server retries it after a step, or when idle after clearing the prefix cache, whose entries are sequences too),
    not the KV cache's error; after the batch it runs."""
    from kiln.runtime.engine import EngineBusy
    engine = Engine(tiny_artifacts["tied"], EngineConfig(max_num_seqs=2, enable_prefix_cache=False))
    for prompt in _prompts(2, seed=5):
        engine.add_request(prompt, GREEDY)
    engine.step()
    assert engine.runner.full
    with pytest.raises(EngineBusy, match="all 2 sequences"):
        engine.embed([list(range(20, 30))])
    while engine.has_work:
        engine.step()
    [(vec, n)] = engine.embed([list(range(20, 30))])
    assert n == 10 and abs(float(np.linalg.norm(vec)) - 1.0) < 1e-5 and not engine.runner.full


def test_seeded_sampling_on_the_device_draws_the_same_stream(tiny_artifacts):
    prompts = _prompts(4, seed=2)
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, top_k=40, seed=7, ignore_eos=True)
    outs = {}
    for overlap, engine in _engines(tiny_artifacts["tied"], device_sampling=True).items():
        outs[overlap] = [o.token_ids for o in engine.generate(prompts, params)]
        assert (engine.stats().lookahead_forwards > 0) == overlap
    assert outs[True] == outs[False] and len({tuple(o) for o in outs[True]}) == len(prompts)


def test_host_gap_is_counted_only_while_work_remains(tiny_artifacts):
    engine = Engine(tiny_artifacts["tied"], EngineConfig(overlap=True))
    engine.generate(_prompts(2, seed=4), GREEDY)
    first = engine.stats()
    assert engine._ahead is None                            # both ended on their last token: nothing ahead
    assert first.prefix_cache_seqs == 2                        # so their KV, no token past it, was cached
    assert first.forwards >= GREEDY.max_tokens and 0 < first.lookahead_forwards < first.forwards
    assert 0 <= first.host_gap_seconds < 5
    engine.generate(_prompts(1, seed=9), GREEDY)               # the idle time between the calls is no gap
    assert engine.stats().host_gap_seconds - first.host_gap_seconds < 5


def test_calls_that_only_keep_books_hold_the_gil(tiny_artifacts):
    """The KV cache's bookkeeping, copies and views keep the GIL through TVM's call (a release would
    make its return wait for a busy event loop, up to the switch interval); a CPU's forwards, which
    compute on the calling thread, let it go, but the embedding's gather."""
    from kiln.runtime import model_runner
    engine = Engine(tiny_artifacts["tied"])
    assert not engine.runner.queues_work
    from kiln.runtime import kv_caches
    assert not any(f.release_gil for f in kv_caches._KV.values())
    assert not any(f.release_gil for f in (model_runner._COPY_IN, model_runner._COPY_OUT, model_runner._VIEW))
    released = {name for name, f in engine.runner._fn.items() if f.release_gil}
    assert "embed" not in released and {"batch_decode", "batch_prefill", "greedy_tokens"} <= released
    ids = np.arange(7, dtype=np.int32)
    staged = engine.runner._staged("ids", ids)
    assert model_runner._to_host(staged, wait=False).tolist() == ids.tolist() == staged.numpy().tolist()
