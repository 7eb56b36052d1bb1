"""Kyutai Helium: a Llama whose RoPE rotates adjacent pairs of each head's dims (kiln reorders the q
and k rows as it loads them: causal_lm.rope_halves); optional q/k/v and MLP biases, none on o."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import CausalLM, WeightMap, decoder_weight_map
from .layers import Flags
from .llama import LlamaConfig


@dataclass(frozen=True)
class HeliumConfig(LlamaConfig):
    ARCH: ClassVar[str] = "helium"
    ADJACENT_ROPE: ClassVar[bool] = True

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, mlp_bias=self.mlp_bias)


HeliumForCausalLM = CausalLM


def weight_map(c: HeliumConfig) -> WeightMap:
    return decoder_weight_map(c)
