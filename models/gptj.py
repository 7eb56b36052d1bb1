"""EleutherAI GPT-J (GPT-J-6B, GPT4All-J): attention and MLP side by side behind one LayerNorm
(x + attn(n(x)) + mlp(n(x))), RoPE on the first `rotary_dim` dims of each head rotating adjacent
pairs (kiln reorders the q and k rows as it loads them: causal_lm.rope_halves), no biases on q, k,
v and the output projection, a plain tanh-GELU MLP with biases, and an untied head with a bias. Salesforce's
CodeGen (codegen-350M/2B/6B/16B mono / multi / nl) is GPT-J whose q, k and v are one qkv_proj, its rows in the 4
model-parallel shards it was trained with (each shard's queries, values, then keys), put back in kiln's order at
load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import (DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, WeightMap, WeightSpec,
                        decoder_weight_map, rope_halves)
from .config import ConfigField, fields_with, one_of
from .gpt2 import ACTIVATIONS
from .layers import Flags

NAMES = dict(LLAMA_NAMES, embed_tokens="transformer.wte", norm="transformer.ln_f", layer="transformer.h.{i}",
             input_layernorm="ln_1", q_proj="attn.q_proj", k_proj="attn.k_proj", v_proj="attn.v_proj",
             o_proj="attn.out_proj", up_proj="mlp.fc_in", down_proj="mlp.fc_out")


@dataclass(frozen=True)
class GPTJConfig(DecoderConfig):
    activation: str = "gelu_tanh"

    ARCH: ClassVar[str] = "gptj"
    ADJACENT_ROPE: ClassVar[bool] = True
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("intermediate_size", ("n_inner",), default=None),
        ConfigField("partial_rotary_factor", ("rotary_dim",), default=None),
        ConfigField("activation", ("activation_function",), default="gelu_new"))

    @classmethod
    def from_hf(cls, hf: dict) -> "GPTJConfig":
        """rotary_dim (dims, or every dim where null) as the share of each head RoPE rotates."""
        head_dim = hf["n_embd"] // hf["n_head"] if "n_embd" in hf and "n_head" in hf else None
        share = hf["rotary_dim"] / head_dim if head_dim and hf.get("rotary_dim") else 1.0
        return super().from_hf({**hf, "rotary_dim": share})

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        return dict(values, activation=one_of(ACTIVATIONS, values["activation"], "activation_function", cls.ARCH),
                    intermediate_size=values["intermediate_size"] or 4 * values["hidden_size"])

    def flags(self) -> Flags:
        return Flags(norm="layer", activation=self.activation, gated_mlp=False, mlp_bias=True,
                     parallel_residual=True, shared_norm=True, head_bias=True)


@dataclass(frozen=True)
class CodeGenConfig(GPTJConfig):
    ARCH: ClassVar[str] = "codegen"


GPTJForCausalLM = CodeGenForCausalLM = CausalLM
SHARDS = 4          # CodeGen's model-parallel shards (its code's mp_num)


def _by_kind(c: CodeGenConfig):
    """qkv_proj rows [shards, (q, v, k), hidden / shards] as kiln's [q | k | v] (a head's rows stay together)."""
    rows = np.arange(3 * c.hidden_size).reshape(SHARDS, 3, c.hidden_size // SHARDS)
    order = np.concatenate([rows[:, kind].reshape(-1) for kind in (0, 2, 1)])
    rotate = rope_halves(c)
    return lambda w: rotate(w[order])


def weight_map(c: GPTJConfig) -> WeightMap:
    m = decoder_weight_map(c, NAMES)
    if isinstance(c, CodeGenConfig):
        for i in range(c.num_hidden_layers):
            m[f"model.layers.{i}.self_attn.qkv_proj.weight"] = WeightSpec((f"transformer.h.{i}.attn.qkv_proj.weight",),
                                                                          _by_kind(c))
    return m
