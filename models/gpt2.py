"""GPT-2: learned absolute positions (no RoPE), LayerNorm, a plain tanh-GELU MLP, biases on every
projection, a tied head, and Conv1D weights stored [in, out] (transposed to kiln's [out, in])."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, WeightMap, WeightSpec, \
    decoder_weight_map
from .config import ConfigField, one_of
from .layers import Flags

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
NAMES = dict(LLAMA_NAMES, embed_tokens="transformer.wte", embed_positions="transformer.wpe", norm="transformer.ln_f",
             layer="transformer.h.{i}", input_layernorm="ln_1", post_attention_layernorm="ln_2")
CONV1D = {"self_attn.qkv_proj": "attn.c_attn", "self_attn.o_proj": "attn.c_proj",
          "mlp.up_proj": "mlp.c_fc", "mlp.down_proj": "mlp.c_proj"}


@dataclass(frozen=True)
class GPT2Config(DecoderConfig):
    activation: str = "gelu_tanh"

    ARCH: ClassVar[str] = "gpt2"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *(ConfigField("intermediate_size", ("n_inner",), default=None) if f.name == "intermediate_size" else f
          for f in DECODER_FIELDS),
        ConfigField("activation", ("activation_function",), default="gelu_new"))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        activation = one_of(ACTIVATIONS, values["activation"], "activation_function", cls.ARCH)
        for key, default in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                             ("reorder_and_upcast_attn", False)):
            if hf.get(key, default) != default:
                raise ValueError(f"{key}={hf[key]} is not supported for gpt2 (only {default})")
        return dict(values, activation=activation, tie_word_embeddings=True,
                    intermediate_size=values["intermediate_size"] or 4 * values["hidden_size"])

    def flags(self) -> Flags:
        return Flags(norm="layer", activation=self.activation, gated_mlp=False, qkv_bias=True, o_bias=True,
                     mlp_bias=True, learned_positions=True)


GPT2LMHeadModel = CausalLM


def _transposed(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.T)


def weight_map(c: GPT2Config) -> WeightMap:
    m = decoder_weight_map(c, NAMES)
    for i in range(c.num_hidden_layers):
        for param, conv in CONV1D.items():
            m[f"model.layers.{i}.{param}.weight"] = WeightSpec((f"transformer.h.{i}.{conv}.weight",), _transposed)
            m[f"model.layers.{i}.{param}.bias"] = [f"transformer.h.{i}.{conv}.bias"]
    return m
