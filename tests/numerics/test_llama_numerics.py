"""Tiny random-init Llamas compiled q0f32 for the CPU vs transformers (PyTorch) logits and tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kiln import Engine, SamplingParams
from kiln.runtime.model_runner import ModelRunner
from kiln.runtime import Artifact
from tiny_models import assert_prefill_and_decode_match, reference_logits

pytestmark = pytest.mark.numerics
TOL = 1e-4


@pytest.fixture(scope="module")
def references(tiny_dirs):
    import transformers
    return {k: transformers.LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
            for k, d in tiny_dirs.items()}


_ref_logits = reference_logits                                   # [seq, vocab]


@pytest.mark.parametrize("kind", ["tied", "untied"])
def test_prefill_and_decode_logits_match_transformers(kind, tiny_artifacts, references):
    ids = np.random.default_rng(7).integers(0, 512, size=23).tolist()
    assert_prefill_and_decode_match(tiny_artifacts[kind], references[kind], ids, TOL)


def test_ragged_batch_prefill_and_decode_match_per_sequence(tiny_artifacts, references):
    runner = ModelRunner(Artifact.load(tiny_artifacts["untied"]))
    ref = references["untied"]
    prompts = [[5, 6, 7], list(range(30, 61)), [400, 3, 9, 77, 12]]
    for i in range(3):
        runner.add_sequence(10 + i)
    last = runner.prefill([10, 11, 12], prompts)
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(last[i], _ref_logits(ref, p)[-1], atol=TOL, rtol=0)
    nxt = [int(np.argmax(r)) for r in last]
    step = runner.decode([10, 11, 12], nxt)
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(step[i], _ref_logits(ref, p + [nxt[i]])[-1], atol=TOL, rtol=0)
    # A smaller batch next: its ids go through the front of the same device buffer (allocated once).
    ids_buffer = runner._buffers["ids"]
    after = [int(np.argmax(r)) for r in step]
    step2 = runner.decode([10, 12], [after[0], after[2]])
    assert runner._buffers["ids"] is ids_buffer
    for row, i in enumerate((0, 2)):
        want = _ref_logits(ref, prompts[i] + [nxt[i], after[i]])[-1]
        np.testing.assert_allclose(step2[row], want, atol=TOL, rtol=0)


def test_batch_of_three_prompts_gives_same_tokens_as_one_at_a_time(tiny_artifacts):
    engine = Engine(tiny_artifacts["tied"])
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [[1, 2, 3], list(range(100, 137)), [9, 8, 7, 6, 5, 4, 3]]
    batched = engine.generate(prompts, params)
    singles = [engine.generate(p, params) for p in prompts]
    assert [o.token_ids for o in batched] == [o.token_ids for o in singles]
    assert all(len(o.token_ids) == 12 and o.finish_reason == "length" for o in batched)


def test_greedy_generation_matches_transformers_generate(tiny_dirs, tiny_artifacts, references):
    engine = Engine(tiny_artifacts["untied"])
    prompt = [11, 22, 33, 44, 55]
    out = engine.generate(prompt, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    with torch.no_grad():
        ref = references["untied"].generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                                             eos_token_id=None, pad_token_id=0)
    assert out.token_ids == ref[0, len(prompt):].tolist()


def test_chunked_prefill_matches_single_call(tiny_dirs, tiny_artifacts, tmp_path, references):
    import kiln
    art = kiln.compile(str(tiny_dirs["tied"]), quant="q0f32", output=tmp_path / "chunk16", prefill_chunk=16)
    runner = ModelRunner(Artifact.load(art))
    ids = list(range(1, 41))                                   # 40 tokens: three chunks of <= 16
    runner.add_sequence(0)
    last = runner.prefill([0], [ids])[0]
    np.testing.assert_allclose(last, _ref_logits(references["tied"], ids)[-1], atol=TOL, rtol=0)


def test_q0f16_logits_close_to_transformers(tiny_dirs, tmp_path, references):
    import kiln
    art = kiln.compile(str(tiny_dirs["tied"]), quant="q0f16", output=tmp_path / "f16")
    runner = ModelRunner(Artifact.load(art))
    ids = list(range(3, 20))
    runner.add_sequence(0)
    got = runner.verify(0, ids)
    expected = _ref_logits(references["tied"], ids)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=3e-2 * np.abs(expected).max(), rtol=0)
    assert (got.argmax(-1) == expected.argmax(-1)).mean() > 0.9


def test_llama3_rope_scaling_from_transformers5_rope_parameters(tmp_path):
    """transformers 5 saves rope_theta and rope_scaling inside `rope_parameters`; both must be read."""
    import json

    import kiln
    import transformers
    from tiny_models import write_tiny_llama
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    d = write_tiny_llama(tmp_path / "hf", tied=False, seed=2, rope_theta=500000.0, rope_scaling=scaling)
    assert "rope_parameters" in json.loads((d / "config.json").read_text())
    art = kiln.compile(str(d), quant="q0f32", output=tmp_path / "art")
    assert kiln.Artifact.load(art).config.model.config["rope_theta"] == 500000.0
    ref = transformers.LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    assert_prefill_and_decode_match(art, ref, list(range(5, 45)), TOL, steps=3)

