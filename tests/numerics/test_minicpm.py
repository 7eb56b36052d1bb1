"""MiniCPM 1 / 2 / 4 (models/llama.py MiniCPMConfig): muP's scales (scale_emb, scale_depth, dim_model_base) are
Granite's multipliers, so a tiny Granite re-saved as MiniCPM's code saves it compiles q0f32 for the CPU to the
Granite's logits within 1e-4 (every prefill position, the last-token prefill, 5 decode steps); MiniCPM 4's
sparse_config caps the context at dense_len with a note; its GGUF (the converter's embedding_scale, residual_scale,
logit_scale) reads as that Granite, transformers' Granite its reference; LongRoPE factors in a GGUF are refused."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import kiln
from kiln.models import ModelLoadError, build, load
from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
LAYERS, HIDDEN, HEADS = 2, 64, 4
SCALE_EMB, SCALE_DEPTH, DIM_BASE = 12.0, 1.4, 16
GRANITE = dict(vocab_size=512, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=LAYERS,
               num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2,
               bos_token_id=1, tie_word_embeddings=True, embedding_multiplier=SCALE_EMB,
               residual_multiplier=SCALE_DEPTH / math.sqrt(LAYERS), logits_scaling=HIDDEN / DIM_BASE,
               attention_multiplier=(HIDDEN // HEADS) ** -0.5)
IDS = np.random.default_rng(14).integers(3, 500, size=19).tolist()


def _as_minicpm(src, **extra) -> None:
    """The Granite at `src` re-described as MiniCPM's config.json (its tensors have MiniCPM's names already)."""
    path = src / "config.json"
    cfg = json.loads(path.read_text())
    cfg = {k: v for k, v in cfg.items() if k not in ("embedding_multiplier", "residual_multiplier", "logits_scaling",
                                                     "attention_multiplier", "rope_parameters")}
    path.write_text(json.dumps(dict(cfg, model_type="minicpm", architectures=["MiniCPMForCausalLM"],
                                    scale_emb=SCALE_EMB, scale_depth=SCALE_DEPTH, dim_model_base=DIM_BASE,
                                    rope_theta=10000.0, **extra)))


def test_minicpm_is_the_granite_of_its_scales(tmp_path):
    ref = write_widened("GraniteForCausalLM", "GraniteConfig", GRANITE, tmp_path / "hf", seed=1)
    _as_minicpm(tmp_path / "hf", sparse_config={"dense_len": 128, "topk": 64, "block_size": 64})
    _, config, _ = build(load(tmp_path / "hf"))
    assert config.context_window_size == 128 and any("dense_len (128 tokens)" in n for n in config.notes)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)


def test_minicpm_gguf_reads_as_granite(tmp_path):
    import gguf

    from gguf_writer import write_gguf
    ref = write_widened("GraniteForCausalLM", "GraniteConfig", GRANITE, tmp_path / "hf", seed=2)
    path = write_gguf(tmp_path / "hf", tmp_path / "minicpm.gguf", arch="minicpm")
    assert gguf.GGUFReader(str(path)).get_field("minicpm.attention.scale") is None      # as MiniCPMModel writes
    assert load(path).hf_config["model_type"] == "granite"
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()



def test_a_minicpm_gguf_with_longrope_factors_is_refused():
    from kiln.models.gguf_arch import GGUF_ARCHS
    with pytest.raises(ModelLoadError, match="LongRoPE factors .* load the Hugging Face checkpoint"):
        GGUF_ARCHS["minicpm"].config(None, "minicpm", {"rope_factors_long.weight": None, "token_embd.weight": None},
                                     {})
