"""OrionStar's Orion (its own code, not in transformers): transformers' Llama with each RMSNorm a LayerNorm with a bias,
as modeling_orion.py builds it, is the reference; also XVERSE, a Llama under its own name."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln

from tiny_models import assert_prefill_and_decode_match, widen, write_tokenizer

pytestmark = pytest.mark.numerics

QUICK_LLVM = True
TOL = 1e-4
IDS = np.random.default_rng(14).integers(0, 512, size=15).tolist()
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
              bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)


def write_orion(dest, tokenizer=write_tokenizer):
    """A Llama whose norms are LayerNorms (weights and biases widened), saved with Orion's config.json."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG, attn_implementation="eager"))
    norm = lambda: torch.nn.LayerNorm(CONFIG["hidden_size"], eps=CONFIG["rms_norm_eps"])  # noqa: E731
    for layer in model.model.layers:
        layer.input_layernorm, layer.post_attention_layernorm = norm(), norm()
    model.model.norm = norm()
    widen(model)
    dest.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(dest / "model.safetensors"))
    (dest / "config.json").write_text(json.dumps(dict(
        {k: v for k, v in CONFIG.items() if k != "max_position_embeddings"}, model_type="orion",
        architectures=["OrionForCausalLM"], max_sequence_length=CONFIG["max_position_embeddings"], hidden_act="silu")))
    if tokenizer is not None:
        tokenizer(dest, CONFIG["vocab_size"])
    return model.eval()


def test_orion_matches_its_reference(tmp_path):
    ref = write_orion(tmp_path / "hf")
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, TOL)


def test_xverse_reads_as_the_llama_it_is():
    from kiln.models.llama import LlamaConfig
    from kiln.models.registry import find_architecture
    arch = find_architecture({"architectures": ["XverseForCausalLM"], "model_type": "xverse"})
    assert arch.name == "llama" and arch.config_cls is LlamaConfig
