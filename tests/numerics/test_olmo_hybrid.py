"""OLMo Hybrid (models/olmo_hybrid.py) against transformers: a tiny random-init model of gated DeltaNet layers
(Qwen3.5's, projections apart, beta doubled for negative eigenvalues) among OLMo 2-style attention layers, compiled
q0f32 for the CPU, gives transformers' logits (every prefill position, the last-token prefill, greedy decode steps);
without RoPE as released and with it; the engine batches, chunks and continues cached turns over its state slots."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.runtime.artifact import Artifact
from tiny_models import assert_prefill_and_decode_match, assert_recurrent_engine, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
              linear_value_head_dim=16, max_position_embeddings=256, eos_token_id=2, bos_token_id=None,
              pad_token_id=0, rms_norm_eps=1e-6, tie_word_embeddings=False,
              layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])
IDS = np.random.default_rng(9).integers(3, 500, size=30).tolist()
CHUNKED = 2e-4          # transformers' chunked delta rule against kiln's token-serial one (test_qwen3_5.py)


@pytest.mark.parametrize("variant", ["released", "rope"])
def test_olmo_hybrid_matches_transformers(variant, tmp_path):
    cfg = dict(CONFIG, rope_parameters={"rope_type": "default", "rope_theta": None}) if variant == "released" else \
        dict(CONFIG, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, linear_allow_neg_eigval=False)
    ref = write_widened("OlmoHybridForCausalLM", "OlmoHybridConfig", cfg, tmp_path / "hf", seed=3)
    assert (ref.model.rotary_emb is None) == (variant == "released")
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    config = Artifact.load(art).config
    assert config.model.arch == "olmo_hybrid"
    assert config.kv_cache.owners == [1, 3] and config.kv_cache.states == [(96, 3), (4, 8, 16)] * 2
    assert_prefill_and_decode_match(art, ref, IDS, CHUNKED)
    if variant == "released":
        assert_recurrent_engine(art)


def test_olmo_hybrid_defaults_follow_transformers():
    from kiln.models.olmo_hybrid import OlmoHybridConfig
    c = OlmoHybridConfig.from_hf(dict(CONFIG, linear_num_key_heads=None, linear_num_value_heads=None,
                                      linear_key_head_dim=None, linear_value_head_dim=None, layer_types=None,
                                      rope_parameters={"rope_type": "default", "rope_theta": None}))
    assert (c.linear_key_heads, c.linear_value_heads, c.linear_key_dim, c.linear_value_dim) == (4, 4, 12, 24)
    assert c.layer_types == ("linear_attention",) * 3 + ("full_attention",) and c.mamba_layers == (0, 1, 2)
    assert not c.rope and c.delta_beta_scale == 2.0 and c.rotary_dim == c.head_dim


LARA = dict(vocab_size=512, hidden_size=64, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, sliding_window=8, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
            linear_value_head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, max_position_embeddings=256, eos_token_id=2, bos_token_id=None,
            pad_token_id=0)


def test_lara_mini_matches_transformers(tmp_path):
    """Lara 4 Mini (lara_mini; olmo_hybrid.py): its default pattern of DeltaNet, sliding (RoPE, a window of 8 the
    30-token prompt passes) and full (no RoPE) layers, Qwen3 attention, softmax experts beside an ungated shared
    expert, the DeltaNet's projections read from the fused in_proj; `kiln check` against transformers."""
    ref = write_widened("LaraMiniForCausalLM", "LaraMiniConfig", LARA, tmp_path / "hf", seed=4)
    assert ref.config.layer_types[:4] == ["linear_attention", "sliding_attention", "linear_attention",
                                          "full_attention"]
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    config = Artifact.load(art).config
    assert config.model.arch == "lara_mini" and config.kv_cache.owners == [1, 3, 4]
    assert_prefill_and_decode_match(art, ref, IDS, CHUNKED)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
