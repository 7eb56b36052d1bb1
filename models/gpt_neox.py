"""GPT-NeoX / Pythia (EleutherAI): attention and MLP side by side, each behind its own LayerNorm
(x + attn(n1(x)) + mlp(n2(x)); `use_parallel_residual`, else one after the other), biases on every
projection, a plain GELU MLP, RoPE on the first `rotary_pct` of each head, and q/k/v fused per head
(`query_key_value` rows: head 0's q, k, v, then head 1's; reordered to kiln's all-q, all-k, all-v; a
GGUF holds them regrouped already, which its reader undoes, models/gguf_arch.py). Adept's Persimmon (and Fuyu's
language model) is the same one after the other under Llama's layer names, with q and k LayerNormed a head
(`qk_layernorm`), a relu^2 MLP and RoPE on half of each head by default."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, WeightMap, WeightSpec, \
    decoder_weight_map
from .config import ConfigField, fields_with, one_of
from .gpt2 import ACTIVATIONS
from .layers import Flags

NAMES = dict(LLAMA_NAMES, embed_tokens="gpt_neox.embed_in", norm="gpt_neox.final_layer_norm", lm_head="embed_out",
             layer="gpt_neox.layers.{i}", o_proj="attention.dense", up_proj="mlp.dense_h_to_4h",
             down_proj="mlp.dense_4h_to_h")


@dataclass(frozen=True)
class GPTNeoXConfig(DecoderConfig):
    activation: str = "gelu"
    parallel_residual: bool = True
    attention_bias: bool = True

    ARCH: ClassVar[str] = "gpt_neox"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("norm_eps", ("layer_norm_eps",), default=1e-5),
        ConfigField("rope_theta", ("rope_theta", "rotary_emb_base"), default=10000.0),
        ConfigField("partial_rotary_factor", ("partial_rotary_factor", "rotary_pct"), default=0.25),
        ConfigField("activation", ("hidden_act",), default="gelu"),
        ConfigField("parallel_residual", ("use_parallel_residual",), default=True),
        ConfigField("attention_bias", ("attention_bias",), default=True))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        activation = one_of(ACTIVATIONS, values["activation"], "hidden_act", cls.ARCH)
        return dict(values, activation=activation)

    def flags(self) -> Flags:
        return Flags(norm="layer", activation=self.activation, gated_mlp=False, qkv_bias=self.attention_bias,
                     o_bias=self.attention_bias, mlp_bias=True, parallel_residual=self.parallel_residual)


@dataclass(frozen=True)
class PersimmonConfig(GPTNeoXConfig):
    qk_layernorm: bool = True

    ARCH: ClassVar[str] = "persimmon"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        GPTNeoXConfig.FIELDS, ConfigField("partial_rotary_factor", ("partial_rotary_factor",), default=0.5),
        ConfigField("activation", ("hidden_act",), default="relu2"),
        ConfigField("qk_layernorm", ("qk_layernorm",), default=True))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        activation = one_of({"relu2": "relu2"}, values["activation"], "hidden_act", cls.ARCH)   # its code's only one
        return dict(values, activation=activation, parallel_residual=False, attention_bias=True)

    def flags(self) -> Flags:
        return dataclasses.replace(super().flags(), qk_norm=self.qk_layernorm)


@dataclass(frozen=True)
class GPTNeoXJapaneseConfig(GPTNeoXConfig):
    """ABEJA's GPT-NeoX-Japanese: GPT-NeoX's layers one after the other without biases, but for the last layer's
    attention output (its dense_bias: that layer's flags), the MLP intermediate_multiple_size times the width, RoPE
    over whole heads by default, the head tied."""

    intermediate_multiple: float = 4.0

    ARCH: ClassVar[str] = "gpt_neox_japanese"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        GPTNeoXConfig.FIELDS, ConfigField("intermediate_size", ("intermediate_size",), default=None),
        ConfigField("partial_rotary_factor", ("partial_rotary_factor", "rotary_pct"), default=1.0),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("intermediate_multiple", ("intermediate_multiple_size",), default=4.0))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        values = super().adapt(values, hf, notes)
        return dict(values, intermediate_size=int(values["hidden_size"] * values["intermediate_multiple"]),
                    parallel_residual=False, attention_bias=False)

    def flags(self) -> Flags:
        return dataclasses.replace(super().flags(), qkv_bias=False, o_bias=False, mlp_bias=False)

    def layer_flags(self, layer: int) -> Flags:
        return dataclasses.replace(self.flags(), o_bias=layer == self.num_hidden_layers - 1)


JAPANESE_NAMES = dict(NAMES, embed_tokens="gpt_neox_japanese.embed_in", norm="gpt_neox_japanese.final_layer_norm",
                      layer="gpt_neox_japanese.layers.{i}")
PERSIMMON_NAMES = dict(LLAMA_NAMES, norm="model.final_layernorm", o_proj="self_attn.dense", up_proj="mlp.dense_h_to_4h",
                       down_proj="mlp.dense_4h_to_h", q_norm="self_attn.q_layernorm", k_norm="self_attn.k_layernorm")
GPTNeoXForCausalLM = PersimmonForCausalLM = GPTNeoXJapaneseForCausalLM = CausalLM


def _by_kind(heads: int):
    """query_key_value rows [heads, 3, head_dim] -> [3, heads, head_dim] (every q, then every k and v)."""
    def reorder(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a.reshape(heads, 3, -1, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape))
    return reorder


def weight_map(c: GPTNeoXConfig) -> WeightMap:
    persimmon, japanese = isinstance(c, PersimmonConfig), isinstance(c, GPTNeoXJapaneseConfig)
    m = decoder_weight_map(c, PERSIMMON_NAMES if persimmon else JAPANESE_NAMES if japanese else NAMES)
    if japanese:
        for i in range(c.num_hidden_layers):
            m[f"model.layers.{i}.self_attn.qkv_proj.weight"] = WeightSpec(
                (f"gpt_neox_japanese.layers.{i}.attention.query_key_value.weight",), _by_kind(c.num_attention_heads))
        last = c.num_hidden_layers - 1
        m[f"model.layers.{last}.self_attn.o_proj.bias"] = [f"gpt_neox_japanese.layers.{last}.attention.dense_bias"]
        return m
    for i in range(c.num_hidden_layers):
        fused = f"model.layers.{i}.self_attn.query_key_value" if persimmon else \
            f"gpt_neox.layers.{i}.attention.query_key_value"
        reorder = _by_kind(c.num_attention_heads)
        for p in ("weight", "bias") if c.attention_bias else ("weight",):
            m[f"model.layers.{i}.self_attn.qkv_proj.{p}"] = WeightSpec((f"{fused}.{p}",), reorder)
    return m
