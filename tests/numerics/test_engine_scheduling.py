"""The scheduler's decisions (continuous batching, chunked prefill, prefix reuse, preemption, n > 1,
abort) run on the real compiled model and never change what a request generates."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import Engine, EngineConfig, SamplingParams
from kiln import compile as kiln_compile

pytestmark = pytest.mark.numerics
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def baseline(tiny_artifacts):
    """Each prompt generated alone, with no prefix cache: the reference outputs."""
    engine = Engine(tiny_artifacts["tied"], EngineConfig(enable_prefix_cache=False))
    return lambda prompt, params=GREEDY: engine.generate(prompt, params).token_ids


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 500, size=int(rng.integers(2, 60))).tolist() for _ in range(n)]


def test_continuous_batching_with_small_step_budget(tiny_artifacts, baseline):
    engine = Engine(tiny_artifacts["tied"], EngineConfig(max_tokens_per_step=16))
    prompts = _prompts(6)
    outs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == [baseline(p) for p in prompts]


def test_prefix_cache_hit_reuses_kv_and_gives_same_tokens(tiny_artifacts, baseline):
    engine = Engine(tiny_artifacts["tied"])
    shared = list(range(10, 90))                                  # 80-token shared prefix
    first = engine.generate(shared + [5, 6], GREEDY)
    hits_before = engine.scheduler.prefix_cache.hit_tokens
    second = engine.generate(shared + [7, 8, 9], GREEDY)
    assert engine.scheduler.prefix_cache.hit_tokens - hits_before >= 64
    assert first.token_ids == baseline(shared + [5, 6])
    assert second.token_ids == baseline(shared + [7, 8, 9])


def test_preemption_under_tiny_kv_budget_gives_same_tokens(tiny_artifacts, baseline):
    # 10 pages of 16 tokens: four ~60-token requests cannot all stay resident while decoding.
    engine = Engine(tiny_artifacts["tied"], EngineConfig(max_total_tokens=160, enable_prefix_cache=False))
    prompts = [p[:50] + [1] * max(0, 40 - len(p)) for p in _prompts(4, seed=3)]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == [baseline(p, params) for p in prompts]
    assert engine.scheduler.pages.used_pages == 0


def test_n_completions_fork_from_the_prompt(tiny_artifacts, baseline):
    engine = Engine(tiny_artifacts["tied"])
    prompt = list(range(40, 70))
    outs = engine.generate(prompt, SamplingParams(max_tokens=8, temperature=0.0, n=3, ignore_eos=True))
    assert len(outs) == 3 and all(o.token_ids == baseline(prompt, SamplingParams(
        max_tokens=8, temperature=0.0, ignore_eos=True)) for o in outs)
    sampled = engine.generate(prompt, SamplingParams(max_tokens=8, temperature=1.5, n=3, seed=1, ignore_eos=True))
    assert len({tuple(o.token_ids) for o in sampled}) > 1         # different streams, same seed
    again = engine.generate(prompt, SamplingParams(max_tokens=8, temperature=1.5, n=3, seed=1, ignore_eos=True))
    assert [o.token_ids for o in again] == [o.token_ids for o in sampled]


def test_closing_a_stream_aborts_and_frees_pages(tiny_artifacts):
    engine = Engine(tiny_artifacts["tied"], EngineConfig(enable_prefix_cache=False))
    free = engine.runner.free_pages()
    stream = engine.generate_stream([list(range(5, 50)), [3, 4, 5]], SamplingParams(max_tokens=50))
    for _, _delta in zip(range(3), stream):
        pass
    stream.close()
    assert not engine.has_work
    assert engine.scheduler.pages.used_pages == 0 and engine.runner.free_pages() == free


def test_engine_stats_follow_the_scheduler(tiny_artifacts):
    engine = Engine(tiny_artifacts["tied"], EngineConfig(max_num_seqs=2))
    sched, shared = engine.scheduler, list(range(10, 60))
    engine.generate(shared + [1], GREEDY)                 # finished: its KV stays in the prefix cache
    s = engine.stats()
    assert (s.running, s.waiting, s.kv_pages_used, s.prefix_cache_seqs) == (0, 0, 0, 1)
    assert s.kv_pages_cached == sched.pages.used_pages > 0 and s.kv_page_size == engine.runner.page_size
    assert s.kv_pages_free == engine.runner.free_pages() == s.kv_pages_total - s.kv_pages_cached   # TVM agrees

    for prompt in (shared + [2], [3] * 40, [4] * 40):
        engine.add_request(prompt, GREEDY)
    engine.step()                                         # two admitted (max_num_seqs), one waits
    s = engine.stats()
    live = {p for q in sched.running for p in sched.pages.pages_of(q.seq_id)}
    assert (s.running, s.waiting, s.kv_pages_used) == (2, 1, len(live))
    assert s.kv_pages_cached == sched.pages.used_pages - len(live) and s.kv_pages_free == sched.pages.free_pages
    assert s.prefix_cache_hit_tokens == sched.prefix_cache.hit_tokens == len(shared)   # the first fork
    while engine.has_work:
        engine.step()
    s = engine.stats()
    assert (s.running, s.waiting, s.kv_pages_used) == (0, 0, 0)
    assert s.kv_pages_cached + s.kv_pages_free == s.kv_pages_total == sched.pages.total_pages


def test_greedy_tokens_picked_on_the_device_equal_the_samplers(tiny_artifacts, baseline):
    """Plain greedy decode steps take their tokens from the artifact's greedy_tokens (only the
    tokens come back); asking for logprobs keeps the logits on the host path: same tokens."""
    engine = Engine(tiny_artifacts["tied"], EngineConfig(enable_prefix_cache=False))
    assert engine.runner.greedy_on_device
    calls = []
    launch = engine.runner.launch_next_tokens
    engine.runner.launch_next_tokens = lambda *a, **k: calls.append(len(a[0])) or launch(*a, **k)
    prompts = _prompts(5, seed=7)
    on_device = [o.token_ids for o in engine.generate(prompts, GREEDY)]
    assert calls and max(calls) == 5                              # batched decode steps went through it
    calls.clear()
    host = engine.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=True))
    assert not calls and [o.token_ids for o in host] == on_device


def test_generation_config_eos_ids_stop_generation(tiny_dirs, tiny_artifacts, tmp_path):
    """gpt-oss stops at <|call|> as well as <|return|>: generation_config.json's eos ids (the checkpoint's,
    carried into the artifact) join config.json's."""
    import json
    import shutil
    plain = Engine(tiny_artifacts["tied"]).generate([5, 6, 7], GREEDY).token_ids
    shutil.copytree(tiny_dirs["tied"], tmp_path / "hf")
    stops = [2, plain[3]]
    (tmp_path / "hf" / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}))
    engine = Engine(kiln_compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art",
                                 golden=False))
    assert plain[3] in engine.eos_token_ids
    out = engine.generate([5, 6, 7], SamplingParams(max_tokens=10, temperature=0.0))
    first = next(i for i, t in enumerate(plain) if t in stops)
    assert out.token_ids == plain[:first + 1] and out.finish_reason == "stop"
