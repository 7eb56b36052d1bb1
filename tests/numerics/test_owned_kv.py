"""The KV cache kiln owns (--kv-cache kiln: models/owned_kv.py, targets/owned_kv.py, runtime/kv_caches.py)
against TVM's, on the same tiny Llama: every call the runner makes gives the same logits, and the engine
(continuous batching, chunked prefill, n > 1 without forks, speculation's pops) the same tokens. The
families that need it (sinks) are checked against transformers in test_families.py."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import Engine, EngineConfig, SamplingParams
from kiln.runtime.artifact import Artifact
from kiln.runtime.model_runner import ModelRunner
from test_families import write_family

pytestmark = pytest.mark.numerics
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def owned(tiny_dirs, tmp_path_factory):
    from conftest import built_once
    return built_once(tmp_path_factory, "tiny-artifacts/tied-owned-kv", lambda out: kiln.compile(
        str(tiny_dirs["tied"]), target="cpu", quant="q0f32", output=out, kv_cache="kiln"))


def _calls(artifact, **runner_options):
    """The runner's calls in turn: a ragged prefill across pages, decode steps, a mixed forward, a
    verify, pops then decode again, a last hidden state; every array they return."""
    r = ModelRunner(Artifact.load(artifact), **runner_options)
    rng = np.random.default_rng(0)
    long, short = rng.integers(3, 500, 40).tolist(), rng.integers(3, 500, 3).tolist()
    for s in (0, 1, 2):
        r.add_sequence(s)
    out = [r.prefill([0, 1], [long, short])]
    for i in range(4):
        out.append(r.decode([0, 1], [7 + i, 9 + i]))
    out.append(r.run([0, 1], [[5, 6, 7], [8]]))
    out.append(r.verify(2, long[:20]))
    r.pop_tokens(0, 5)
    r.pop_tokens(2, 19)
    out.append(r.decode([0, 2], [11, 12]))
    r.remove_sequence(1)
    out.append(r.decode([0, 2], [13, 14]))
    r.add_sequence(3)                                       # an embedding's hidden state, a chunk at a time
    out.append(r.last_hidden(3, long[:30]))
    return out, r


def test_runner_calls_match_tvms_cache(tiny_artifacts, owned):
    theirs, _ = _calls(tiny_artifacts["tied"])
    ours, runner = _calls(owned)
    assert runner.artifact.config.kv_cache.owner == "kiln" and runner.shares_kv
    for a, b in zip(theirs, ours):
        np.testing.assert_allclose(b, a, atol=2e-5, rtol=0)


def test_engine_gives_tvms_cache_tokens(tiny_artifacts, owned):
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 500, size=int(rng.integers(2, 70))).tolist() for _ in range(5)]
    theirs = Engine(tiny_artifacts["tied"], EngineConfig(max_tokens_per_step=24)).generate(prompts, GREEDY)
    engine = Engine(owned, EngineConfig(max_tokens_per_step=24))
    ours = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in ours] == [o.token_ids for o in theirs]
    n = engine.generate(prompts[0], SamplingParams(max_tokens=6, temperature=0.0, n=3, ignore_eos=True))
    assert [o.token_ids for o in n] == [theirs[0].token_ids[:6]] * 3          # n > 1: forks of the prompt
    shared = list(range(10, 90))                                               # an 80-token shared prefix
    first = engine.generate(shared + [5, 6], GREEDY)
    hits = engine.scheduler.prefix_cache.hit_tokens
    second = engine.generate(shared + [7, 8, 9], GREEDY)
    assert engine.scheduler.prefix_cache.hit_tokens - hits >= 64               # the prefix's pages reused
    plain = Engine(tiny_artifacts["tied"], EngineConfig(enable_prefix_cache=False))
    assert first.token_ids == plain.generate(shared + [5, 6], GREEDY).token_ids
    assert second.token_ids == plain.generate(shared + [7, 8, 9], GREEDY).token_ids


def test_speculative_decoding_pops_the_rejected_drafts(owned):
    prompt = [5, 6, 7, 8] * 12
    plain = Engine(owned).generate(prompt, GREEDY).token_ids
    spec = Engine(owned, EngineConfig(speculative_tokens=4)).generate(prompt, GREEDY).token_ids
    assert spec == plain


def test_a_full_cache_says_so_and_changes_nothing(owned):
    runner = ModelRunner(Artifact.load(owned), max_total_tokens=32)            # 2 pages of 16
    runner.add_sequence(0)
    runner.prefill([0], [list(range(3, 30))])
    with pytest.raises(RuntimeError, match="the KV cache is full: this forward needs 1 more pages, 0 are free"):
        runner.prefill([0], [list(range(3, 10))])
    assert runner.sequence_length(0) == 27 and runner.free_pages() == 0
    with pytest.raises(RuntimeError, match="a fork needs 1 more page, 0 are free"):
        runner.fork_sequence(0, 1)


def test_forks_share_whole_pages_copy_the_partial_one_and_copy_on_write(owned):
    """A child forked mid-page and its parent diverge without touching each other's keys; a pop into a
    shared page, then an append, copies that page first; every page comes back."""
    fresh = ModelRunner(Artifact.load(owned))
    runner = ModelRunner(Artifact.load(owned))
    prompt = list(range(3, 43))                                                # 40 tokens: 2.5 pages
    runner.add_sequence(0)
    runner.prefill([0], [prompt])
    runner.fork_sequence(0, 1, 36)
    runner.fork_sequence(0, 2, 32)                                             # at a page boundary
    assert runner.cache._refs[runner.cache._held[0][0]] == 3
    got = runner.decode([0, 1, 2], [50, 51, 52])
    fresh.add_sequence(9)
    for seq, (pos, token) in enumerate(((40, 50), (36, 51), (32, 52))):
        fresh.add_sequence(seq)
        fresh.prefill([seq], [prompt[:pos]])
        np.testing.assert_allclose(got[seq], fresh.decode([seq], [token])[0], atol=2e-5, rtol=0)
    runner.pop_tokens(2, 10)                                                   # 23 tokens: into shared page 1
    assert runner.cache._shared_tail(2)
    again = runner.decode([2], [60])[0]
    fresh.add_sequence(5)
    fresh.prefill([5], [prompt[:23]])
    np.testing.assert_allclose(again, fresh.decode([5], [60])[0], atol=2e-5, rtol=0)
    np.testing.assert_allclose(runner.decode([0], [61])[0], fresh.decode([0], [61])[0], atol=2e-5, rtol=0)
    for seq in (0, 1, 2):
        runner.remove_sequence(seq)
    assert runner.free_pages() == runner.cache.num_pages


def test_gemma2_soft_capped_attention_over_the_owned_cache_matches_transformers(tmp_path):
    """Gemma 2's attention soft-capping (2.0: it bites), sliding and global layers, through kiln's CPU kernels
    over the owned cache; a GPU target, whose owned-cache kernel has no cap, is refused."""
    from test_families import IDS, TOL
    from tiny_models import assert_prefill_and_decode_match
    ref = write_family("gemma2", tmp_path / "hf", sliding_window=8)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", kv_cache="kiln")
    assert_prefill_and_decode_match(art, ref, IDS, TOL)
    with pytest.raises(ValueError, match="soft-capped attention .* runs on CPUs only"):
        kiln.compile(str(tmp_path / "hf"), target="cuda", quant="q0f16", output=tmp_path / "gpu", kv_cache="kiln")


def test_sinks_need_the_kv_cache_kiln_owns(tmp_path):
    write_family("gpt-oss", tmp_path / "hf")
    with pytest.raises(ValueError, match="attention has sinks .* use --kv-cache kiln"):
        kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", kv_cache="tvm")
    assert not (tmp_path / "art").exists()

