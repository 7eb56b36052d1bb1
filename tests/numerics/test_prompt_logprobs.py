"""Prompt logprobs (what echo + logprobs scoring needs): every prompt token's log-probability under the
model, from the logits of every prefill position, equal to transformers' log-softmax within 1e-4 —
through chunked prefill, next to other requests, with max_tokens=0, and never lost to the prefix cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from kiln import EngineConfig, SamplingParams

pytestmark = pytest.mark.numerics
TOL = 1e-4


@pytest.fixture(scope="module")
def reference(tiny_dirs):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_dirs["tied"], torch_dtype=torch.float32).eval()


def _ref_logprobs(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1).numpy()
    return lp


@pytest.mark.parametrize("chunk", [None, 8])
def test_prompt_logprobs_match_transformers(tiny_artifacts, reference, chunk):
    engine = kiln.Engine(tiny_artifacts["tied"], EngineConfig(max_tokens_per_step=chunk))
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 512, size=n).tolist() for n in (29, 5, 17)]
    outs = engine.generate(prompts, SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3))
    for ids, out in zip(prompts, outs):
        ref = _ref_logprobs(reference, ids)
        lps = out.prompt_logprobs
        assert len(lps) == len(ids) and lps[0] is None
        got = np.array([lp.logprob for lp in lps[1:]])
        want = np.array([ref[i - 1, ids[i]] for i in range(1, len(ids))])
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
        for i, lp in enumerate(lps[1:], start=1):
            best = np.argsort(-ref[i - 1], kind="stable")[:3]
            assert [t for t, _ in lp.top] == best.tolist()
            np.testing.assert_allclose([v for _, v in lp.top], ref[i - 1, best], atol=TOL, rtol=0)


def test_max_tokens_zero_scores_only_and_prefix_cache_does_not_lose_them(tiny_artifacts, reference):
    engine = kiln.Engine(tiny_artifacts["tied"])
    ids = np.random.default_rng(4).integers(3, 512, size=24).tolist()
    engine.generate(ids, SamplingParams(max_tokens=4, temperature=0))         # the prompt is now cached
    out = engine.generate(ids, SamplingParams(max_tokens=0, prompt_logprobs=0))
    assert out.token_ids == [] and out.finish_reason == "length"
    ref = _ref_logprobs(reference, ids)
    np.testing.assert_allclose([lp.logprob for lp in out.prompt_logprobs[1:]],
                               [ref[i - 1, ids[i]] for i in range(1, len(ids))], atol=TOL, rtol=0)
    assert all(lp.top == [] for lp in out.prompt_logprobs[1:])
    stats = engine.stats()
    assert stats.running == 0 and stats.kv_pages_used == 0


def test_n_copies_share_the_prompt_logprobs(tiny_artifacts):
    engine = kiln.Engine(tiny_artifacts["tied"])
    outs = engine.generate([[5, 6, 7, 8], [9, 10, 11]], SamplingParams(max_tokens=2, n=2, seed=1, prompt_logprobs=0))
    assert outs[0].prompt_logprobs is outs[1].prompt_logprobs and len(outs[0].prompt_logprobs) == 4
    assert outs[2].prompt_logprobs is outs[3].prompt_logprobs and len(outs[2].prompt_logprobs) == 3


def test_max_tokens_zero_needs_prompt_logprobs():
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 1"):
        SamplingParams(max_tokens=0)
