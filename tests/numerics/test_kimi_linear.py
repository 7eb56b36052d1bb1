"""Kimi Linear (models/kimi_linear.py) against transformers: a tiny random-init model of KDA layers (the delta rule
with a decay a key channel) among latent-attention layers without RoPE, DeepSeek-V3's experts after a dense layer,
saved under Moonshot's names, compiled q0f32 for the CPU, gives transformers' logits (every prefill position, the
last-token prefill, greedy decode steps); the engine batches, chunks and continues cached turns over its state
slots and the latent attention's pages in the cache kiln owns."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.runtime.artifact import Artifact
from tiny_models import assert_prefill_and_decode_match, assert_recurrent_engine, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
LINEAR = {"full_attn_layers": [2, 4], "kda_layers": [1, 3], "head_dim": 16, "num_heads": 4,
          "short_conv_kernel_size": 4}
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8,
              qk_nope_head_dim=24, v_head_dim=16, num_local_experts=8, num_experts_per_tok=2, n_shared_experts=1,
              n_group=2, topk_group=1, routed_scaling_factor=2.5, first_k_dense_replace=1, linear_attn_config=LINEAR,
              max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
IDS = np.random.default_rng(9).integers(3, 500, size=30).tolist()
CHUNKED = 2e-4          # transformers' chunked delta rule against kiln's token-serial one (test_qwen3_5.py)


def _moonshot_names(d) -> None:
    """transformers writes a dense layer's MLP back under block_sparse_moe; Moonshot's checkpoints say mlp."""
    from safetensors.numpy import load_file, save_file
    path = d / "model.safetensors"
    tensors = load_file(path)
    renamed = {k.replace(".block_sparse_moe.", ".mlp.") if k.endswith(("gate_proj.weight", "up_proj.weight",
                                                                        "down_proj.weight")) and ".shared_experts."
               not in k else k: v for k, v in tensors.items()}
    assert "model.layers.0.mlp.gate_proj.weight" in renamed
    save_file(renamed, path, metadata={"format": "pt"})


def test_kimi_linear_matches_transformers(tmp_path):
    ref = write_widened("KimiLinearForCausalLM", "KimiLinearConfig", CONFIG, tmp_path / "hf", seed=3)
    assert ref.config.layer_types == ["linear_attention", "full_attention"] * 2
    _moonshot_names(tmp_path / "hf")
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    config = Artifact.load(art).config
    assert config.model.arch == "kimi_linear"
    assert config.kv_cache.owners == [1, 3] and config.kv_cache.states == [(192, 3), (4, 16, 16)] * 2
    assert_prefill_and_decode_match(art, ref, IDS, CHUNKED)
    assert_recurrent_engine(art)


def test_kimi_linear_gguf_matches_transformers(tmp_path):
    """llama.cpp's kimi-linear layout (tests/gguf_writer.py: KimiLinearModel's keys and tensors: KDA's kinds by
    head_count_kv, its convs 4-D, A as -exp(A_log), kv_b_proj split by heads) read back as the model it came from.
    One expert group, as released: the converter writes Moonshot's num_expert_group nowhere."""
    from gguf_writer import write_gguf
    ref = write_widened("KimiLinearForCausalLM", "KimiLinearConfig", dict(CONFIG, n_group=1), tmp_path / "hf", seed=5)
    _moonshot_names(tmp_path / "hf")
    path = write_gguf(tmp_path / "hf", tmp_path / "kimi.gguf")
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert Artifact.load(art).config.model.arch == "kimi_linear"
    assert_prefill_and_decode_match(art, ref, IDS, CHUNKED, steps=2)


def test_kimi_linear_reads_moonshots_config():
    """Moonshot's config.json (its own key names, the layer lists 1-based, no layer_types) reads as transformers
    reads it; what transformers does not run is refused by name."""
    from kiln.models.kimi_linear import KimiLinearConfig
    moonshot = {k: v for k, v in CONFIG.items() if k not in ("num_local_experts", "num_experts_per_tok", "n_group",
                                                             "max_position_embeddings")}
    moonshot.update(num_experts=8, num_experts_per_token=2, num_expert_group=2, moe_renormalize=False,
                    model_max_length=256, mla_use_nope=True, moe_router_activation_func="sigmoid",
                    linear_attn_config=dict(LINEAR, kda_layers=[1, 2, 3], full_attn_layers=[4]))
    c = KimiLinearConfig.from_hf(moonshot)
    assert c.kda_layers == (0, 1, 2) and (c.kda_heads, c.kda_head_dim, c.conv_taps) == (4, 16, 4)
    assert (c.num_experts, c.top_k, c.groups, c.norm_topk_prob, c.context_window_size) == (8, 2, 2, False, 256)
    assert [c.layer_moe(i) is None for i in range(4)] == [True, False, False, False]
    assert not any(a.rope for a in c.layer_attention()) and c.head_dim == 32
    for key, value in (("mla_use_nope", False), ("moe_router_activation_func", "softmax")):
        with pytest.raises(ValueError, match=key):
            KimiLinearConfig.from_hf(dict(moonshot, **{key: value}))
