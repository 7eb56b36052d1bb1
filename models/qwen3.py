"""Qwen3: Qwen2 with a per-head RMSNorm of q and k before RoPE, an explicit head_dim, and biases
only where `attention_bias` says (off in released checkpoints)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, CausalLM, WeightMap, decoder_weight_map
from .config import ConfigField
from .layers import Flags
from .qwen2 import Qwen2Config


@dataclass(frozen=True)
class Qwen3Config(Qwen2Config):
    attention_bias: bool = False            # q, k, v and o projections

    ARCH: ClassVar[str] = "qwen3"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *DECODER_FIELDS, ConfigField("attention_bias", ("attention_bias",), default=False))

    def flags(self) -> Flags:
        return Flags(qk_norm=True, qkv_bias=self.attention_bias, o_bias=self.attention_bias)


Qwen3ForCausalLM = CausalLM


def weight_map(c: Qwen3Config) -> WeightMap:
    return decoder_weight_map(c)
