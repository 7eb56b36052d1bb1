"""ALiBi decoders (models/alibi.py): BLOOM and MPT tiny random models, six heads (not a power of two: each
family's interleaved slopes), compiled q0f32 for the CPU over the KV cache kiln owns, give transformers' logits
within 1e-4 (every prefill position, the last-token prefill, 5 decode steps) and pass `kiln check`; chunked,
batched prefill gives a plain run's tokens; the slopes are transformers' for 1-40 heads (within a float32 ulp:
numpy's pow against torch's). The kernel with slopes: tests/numerics/test_owned_kv_kernel.py (numpy),
tests/compiler/test_alibi_kernels.py (CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kiln import Engine, EngineConfig, SamplingParams
from kiln.models.alibi import BloomConfig, MptConfig
from tiny_models import compiles_to_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
IDS = np.random.default_rng(15).integers(3, 500, size=19).tolist()
CASES = {
    "bloom": ("BloomForCausalLM", "BloomConfig", dict(vocab_size=512, hidden_size=96, n_layer=2, n_head=6,
                                                      eos_token_id=2, bos_token_id=1)),
    "mpt": ("MptForCausalLM", "MptConfig", dict(vocab_size=512, d_model=96, n_layers=2, n_heads=6, max_seq_len=256,
                                                eos_token_id=2, bos_token_id=1,
                                                attn_config=dict(alibi=True, alibi_bias_max=8, clip_qkv=6.0))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_alibi_family_matches_transformers(case, tmp_path):
    ref = write_widened(*CASES[case], tmp_path / "hf", seed=1)
    config = compiles_to_match(tmp_path / "hf", ref, tmp_path / "art", IDS, 1e-4)
    assert config.kv_cache.owner == "kiln"
    if case == "bloom":                 # BLOOM's config names no context length
        assert any("2048 tokens, BLOOM's training sequence" in n for n in config.notes)
        greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        prompts = [IDS, IDS[:7], list(reversed(IDS))]
        alone = [Engine(tmp_path / "art").generate(p, greedy).token_ids for p in prompts]
        chunked = Engine(tmp_path / "art", EngineConfig(max_tokens_per_step=8))
        assert [o.token_ids for o in chunked.generate(prompts, greedy)] == alone


@pytest.mark.parametrize("heads", [1, 2, 3, 6, 8, 12, 16, 20, 32, 40])
def test_slopes_are_transformers(heads):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor
    bloom = BloomConfig.from_hf(dict(model_type="bloom", vocab_size=8, hidden_size=8 * heads, n_layer=1,
                                     n_head=heads))
    by_position = build_alibi_tensor(torch.ones(1, 2), heads, torch.float32)[:, 0, 1]     # slope * 1
    np.testing.assert_allclose(bloom.alibi_slopes(), by_position.numpy(), rtol=2e-7, atol=0)      # a float32 ulp
    mpt = MptConfig.from_hf(dict(model_type="mpt", vocab_size=8, d_model=8 * heads, n_layers=1, n_heads=heads,
                                 max_seq_len=16, attn_config=dict(alibi=True, alibi_bias_max=8)))
    np.testing.assert_allclose(mpt.alibi_slopes(), -build_mpt_alibi_tensor(heads, 2)[:, 0, 0].numpy(), rtol=2e-7,
                               atol=0)


def test_mpt_without_alibi_is_refused():
    with pytest.raises(ValueError, match="MPT with alibi False is not supported"):
        MptConfig.from_hf(dict(model_type="mpt", vocab_size=8, d_model=16, n_layers=1, n_heads=2, max_seq_len=16,
                               attn_config=dict(alibi=False)))
