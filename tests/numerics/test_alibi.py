"""ALiBi decoders (models/alibi.py; BLOOM and MPT against transformers: test_families' bloom and mpt cases, six
heads, over the KV cache kiln owns, on a GPU too through test_cuda_variants): chunked, batched prefill gives a
plain run's tokens; the slopes are transformers' for 1-40 heads (within a float32 ulp:
numpy's pow against torch's). The kernel with slopes: tests/numerics/test_owned_kv_kernel.py (numpy),
tests/compiler/test_alibi_kernels.py (CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from kiln import Engine, EngineConfig, SamplingParams
from kiln.models.alibi import BloomConfig, MptConfig

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
IDS = np.random.default_rng(15).integers(3, 500, size=19).tolist()


def test_alibi_over_the_engine_and_its_notes(tmp_path):
    """test_families' bloom and mpt cases match transformers (and on a GPU, test_cuda_variants'); here BLOOM's
    missing context length is noted, the cache is kiln's, and chunked, batched prefill gives a plain run's
    tokens (the bias by position across chunks)."""
    from kiln.runtime import Artifact
    from test_families import write_family
    write_family("bloom", tmp_path / "hf", seed=1)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    config = Artifact.load(art).config
    assert config.kv_cache.owner == "kiln"
    assert any("2048 tokens, BLOOM's training sequence" in n for n in config.notes)
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prompts = [IDS, IDS[:7], list(reversed(IDS))]
    alone = [Engine(art).generate(p, greedy).token_ids for p in prompts]
    chunked = Engine(art, EngineConfig(max_tokens_per_step=8))
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


@pytest.mark.parametrize("case", ["bloom", "mpt"])
def test_gguf_alibi_reads_as_the_model_it_came_from(case, tmp_path):
    """llama.cpp's bloom and mpt layouts (tests/gguf_writer.py: BloomModel's q/k/v rows regrouped by kind and the
    embeddings' norm, MPTModel's clamp_kqv and max_alibi_bias) read back as test_families' models: transformers'
    logits, and `kiln check` against transformers on the config and tensors kiln read."""
    from gguf_writer import write_gguf
    from test_families import write_family
    from tiny_models import assert_prefill_and_decode_match
    ref = write_family(case, tmp_path / "hf", seed=3)
    path = write_gguf(tmp_path / "hf", tmp_path / f"{case}.gguf")
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4, steps=2)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
