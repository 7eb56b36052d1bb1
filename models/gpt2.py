"""GPT-2: learned absolute positions (no RoPE), LayerNorm, a plain tanh-GELU MLP, biases on every
projection, a tied head, and Conv1D weights stored [in, out] (transposed to kiln's [out, in]).
GPT-BigCode (StarCoder 1, SantaCoder, WizardCoder): GPT-2's layers as plain Linear weights, with one
key/value head for every query head (`multi_query`: c_attn rows are every q, then k, then v; without
it each head's q, k, v in turn, reordered to kiln's every q, k, v)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, WeightMap, WeightSpec, \
    decoder_weight_map
from .config import ConfigField, fields_with, one_of
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
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("intermediate_size", ("n_inner",), default=None),
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


@dataclass(frozen=True)
class GPTBigCodeConfig(GPT2Config):
    ARCH: ClassVar[str] = "gpt_bigcode"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        GPT2Config.FIELDS, ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("activation", ("activation_function",), default="gelu_pytorch_tanh"))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("add_cross_attention"):
            raise ValueError("gpt_bigcode with add_cross_attention is not a causal LM kiln builds; load a decoder-only "
                             "checkpoint")
        tie = values["tie_word_embeddings"]
        values = super().adapt(values, hf, notes)
        kv_heads = 1 if hf.get("multi_query", True) else values["num_attention_heads"]
        return dict(values, tie_word_embeddings=tie, num_key_value_heads=kv_heads)


GPT2LMHeadModel = GPTBigCodeForCausalLM = CausalLM


def _transposed(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.T)


def weight_map(c: GPT2Config) -> WeightMap:
    m = decoder_weight_map(c, NAMES)
    if isinstance(c, GPTBigCodeConfig):
        return _bigcode_weights(c, m)
    for i in range(c.num_hidden_layers):
        for param, conv in CONV1D.items():
            m[f"model.layers.{i}.{param}.weight"] = WeightSpec((f"transformer.h.{i}.{conv}.weight",), _transposed)
            m[f"model.layers.{i}.{param}.bias"] = [f"transformer.h.{i}.{conv}.bias"]
    return m


def _bigcode_weights(c: GPTBigCodeConfig, m: WeightMap) -> WeightMap:
    """GPT-2's names, the weights as they are (Linear, not Conv1D); c_attn regrouped by kind without MQA."""
    from .gpt_neox import _by_kind
    reorder = None if c.num_key_value_heads == 1 else _by_kind(c.num_attention_heads)
    for i in range(c.num_hidden_layers):
        for param, linear in CONV1D.items():
            for p in ("weight", "bias"):
                name = f"transformer.h.{i}.{linear}.{p}"
                m[f"model.layers.{i}.{param}.{p}"] = WeightSpec((name,), reorder if "qkv" in param else None)
    return m
