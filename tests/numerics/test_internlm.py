"""The first InternLM (models/llama.py InternLMConfig; its own code's InternLMForCausalLM, which transformers does not
ship) q0f32 on the CPU: a Llama with biases on q, k, v and o (config.json's `bias`) and its RoPE base as
`rotary.base`, so transformers' Llama with attention_bias over the same weights is the reference."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln.models import ModelLoadError, build, load
from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(18).integers(0, 500, size=17).tolist()
LLAMA = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=256, eos_token_id=2, bos_token_id=1, pad_token_id=0,
             attention_bias=True, rope_parameters=dict(rope_type="default", rope_theta=50000.0))


def write_internlm(dest, rotary: dict):
    """A tiny biased Llama saved as InternLM's checkpoint (its config: architectures, model_type, bias, rotary)."""
    ref = write_widened("LlamaForCausalLM", "LlamaConfig", LLAMA, dest, seed=4)
    config = {k: v for k, v in json.loads((dest / "config.json").read_text()).items()
              if k not in ("attention_bias", "rope_parameters", "rope_theta")}
    (dest / "config.json").write_text(json.dumps(dict(config, architectures=["InternLMForCausalLM"],
                                                      model_type="internlm", bias=True, rotary=rotary)))
    return ref


def test_internlm_is_a_biased_llama_with_its_rotary_base(tmp_path):
    ref = write_internlm(tmp_path / "hf", {"base": 50000, "type": "dynamic", "scaling_factor": 1.0})
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)


def test_internlm_with_another_rotary_type_is_refused(tmp_path):
    write_internlm(tmp_path / "hf", {"base": 10000, "type": "xpos"})
    with pytest.raises(ModelLoadError, match="InternLM's rotary type 'xpos' is not supported"):
        build(load(tmp_path / "hf"))
