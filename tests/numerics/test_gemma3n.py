"""Gemma 3n (models/gemma3n.py) against transformers: tiny random-init models, compiled q0f32 for the CPU, give
transformers' logits within 1e-4 (every prefill position past the 8-token window, the last-token prefill, 5
greedy decode steps) and pass `kiln check`: four AltUp streams, LAuReL, activation sparsity on the first two
layers, a width per layer's MLP, per-layer inputs (ids past their 500-row table read its row 0), the last two
layers sharing earlier layers' keys and values; as Gemma3nForCausalLM and as the multimodal checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
SLIDING, FULL = "sliding_attention", "full_attention"
TEXT = dict(vocab_size=512, hidden_size=64, intermediate_size=[96, 96, 128, 96, 96, 64], num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
            layer_types=[SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL], hidden_size_per_layer_input=16,
            vocab_size_per_layer_input=500, num_kv_shared_layers=2, laurel_rank=8,
            activation_sparsity_pattern=[0.95, 0.9, 0.0, 0.0, 0.0, 0.0], max_position_embeddings=256,
            eos_token_id=2, bos_token_id=None, pad_token_id=0, final_logit_softcapping=30.0)
IDS = np.random.default_rng(8).integers(3, 512, size=30).tolist()       # some past the per-layer table


@pytest.mark.parametrize("multimodal", [False, True])
def test_gemma3n_matches_transformers(multimodal, tmp_path):
    """multimodal: the same weights as Gemma3nForConditionalGeneration's checkpoint lays them out (text model under
    model.language_model, config.json's text_config), which transformers here cannot build without timm: compiled
    without golden logits and checked against the text model directly."""
    ref = write_widened("Gemma3nForCausalLM", "Gemma3nTextConfig", TEXT, tmp_path / "hf", seed=1)
    if multimodal:
        _as_multimodal(tmp_path / "hf")
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art",
                       golden=not multimodal)
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    if not multimodal:
        report = kiln.check(art)
        assert report.ok and report.reference.startswith("transformers"), report.table()


def _as_multimodal(d):
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(d / "model.safetensors"))
    save_file({k.replace("model.", "model.language_model.", 1): v for k, v in tensors.items() if k != "lm_head.weight"},
              str(d / "model.safetensors"), metadata={"format": "pt"})
    text = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n", "text_config": text,
        "transformers_version": text["transformers_version"], "eos_token_id": text["eos_token_id"]}))


@pytest.mark.parametrize("change, message", [
    (dict(altup_active_idx=4), "altup_active_idx 4 must name one of altup_num_inputs"),
    (dict(intermediate_size=[96, 96]), "intermediate_size lists 2 widths for 6 layers"),
    (dict(activation_sparsity_pattern=[1.0] * 6), "activation_sparsity_pattern must give each"),
])
def test_gemma3n_configs_kiln_cannot_run_are_refused_by_name(change, message):
    from kiln.models.gemma3n import Gemma3nConfig
    with pytest.raises(ValueError, match=message):
        Gemma3nConfig.from_hf(dict(TEXT, model_type="gemma3n_text", **change))


def test_gemma3n_gguf_matches_transformers(tmp_path):
    """As llama.cpp's converter writes it (tests/gguf_writer.py: AltUp's projections stacked into altup_proj /
    altup_unembd_proj, the sparsity as its normal quantiles, a width a layer): read back into the model it came
    from. The per-layer table covers the vocabulary here: the converter pads a shorter one with zero rows, where
    transformers reads row 0 for the ids past it."""
    from gguf_writer import write_gguf
    from kiln.models.gguf import load_gguf
    ref = write_widened("Gemma3nForCausalLM", "Gemma3nTextConfig", dict(TEXT, vocab_size_per_layer_input=512),
                        tmp_path / "hf", seed=3)
    path = write_gguf(tmp_path / "hf", tmp_path / "g3n.gguf", default="Q8_0")
    config = load_gguf(path).hf_config
    assert config["model_type"] == "gemma3n_text" and config["intermediate_size"] == TEXT["intermediate_size"]
    np.testing.assert_allclose(config["activation_sparsity_pattern"], TEXT["activation_sparsity_pattern"], atol=1e-9)
    art = kiln.compile(str(path), target="cpu", quant="auto", output=tmp_path / "art")
    report = kiln.check(art)        # golden: transformers on the config and tensors kiln read from the GGUF
    assert report.ok and report.reference.startswith("transformers"), report.table()
    assert max(p.max_logit_error for p in report.prompts) < 1e-3, report.table()
    f32 = write_gguf(tmp_path / "hf", tmp_path / "g3n-f32.gguf")
    art = kiln.compile(str(f32), target="cpu", quant="q0f32", output=tmp_path / "art-f32", golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
