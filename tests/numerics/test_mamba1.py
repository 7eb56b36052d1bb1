"""Mamba-1 families (models/mamba1.py) against transformers: tiny random-init models compiled q0f32 for the CPU give
transformers' logits within 1e-4 (every prefill position, the last-token prefill, greedy decode steps, each layer's
conv and selective-scan state in its slot of the KV cache kiln owns): Mamba, Falcon Mamba (dt, B and C RMS-normed
without weights) and Jamba (Mamba-1 layers with weighted norms among attention layers without RoPE, experts every
other layer, their softmax top-k weights unnormalised); Jamba in the engine (chunked prefill, batches, n > 1); Mamba,
Falcon Mamba (llama.cpp's mamba) and Jamba GGUFs read back into the models they came from."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.runtime.artifact import Artifact
from tiny_models import assert_prefill_and_decode_match, assert_recurrent_engine, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
IDS = np.random.default_rng(9).integers(3, 500, size=24).tolist()
SMALL = dict(vocab_size=512, hidden_size=64, eos_token_id=2, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False)
FAMILIES = {
    "mamba": ("MambaForCausalLM", "MambaConfig", dict(
        SMALL, num_hidden_layers=3, state_size=8, expand=2, conv_kernel=4, time_step_rank=6)),
    "falcon-mamba": ("FalconMambaForCausalLM", "FalconMambaConfig", dict(
        SMALL, num_hidden_layers=3, state_size=8, expand=2, conv_kernel=3, tie_word_embeddings=True)),
}
JAMBA = dict(SMALL, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, num_experts=4, num_experts_per_tok=2, expert_layer_period=2,
             expert_layer_offset=1, attn_layer_period=4, attn_layer_offset=2, mamba_d_state=8, mamba_dt_rank=6)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_mamba1_matches_transformers(family, tmp_path):
    model_cls, config_cls, cfg = FAMILIES[family]
    ref = write_widened(model_cls, config_cls, cfg, tmp_path / "hf", seed=3)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    layout = Artifact.load(art).config.kv_cache
    assert layout.owners == [] and layout.states == [(128, cfg["conv_kernel"] - 1), (128, 8)] * 3
    from gguf_writer import write_gguf            # as llama.cpp's MambaModel writes both (ssm.dt_b_c_rms: Falcon's)
    path = write_gguf(tmp_path / "hf", tmp_path / f"{family}.gguf")
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "gguf")
    assert Artifact.load(art).config.model.arch == family.replace("-", "_")
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)


def test_jamba_matches_transformers_and_runs_in_the_engine(tmp_path):
    ref = write_widened("JambaForCausalLM", "JambaConfig", JAMBA, tmp_path / "hf", seed=4)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    assert Artifact.load(art).config.kv_cache.owners == [2]
    assert_recurrent_engine(art)
    from gguf_writer import write_gguf            # llama.cpp's jamba: the layer kinds read back as periods, offsets
    path = write_gguf(tmp_path / "hf", tmp_path / "jamba.gguf")
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "gguf")
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)


def test_a_float16_kv_cache_is_taken_by_a_model_without_attention(tmp_path):
    """--kv-cache-dtype float16 on Mamba (its layers' one mixer takes the setting; no layer holds keys and values, so
    the logits are the float32 ones)."""
    model_cls, config_cls, cfg = FAMILIES["mamba"]
    ref = write_widened(model_cls, config_cls, cfg, tmp_path / "hf", seed=3)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art",
                       kv_cache_dtype="float16")
    assert Artifact.load(art).config.kv_cache.dtype == "float16"
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
