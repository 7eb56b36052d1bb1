"""The Llama family: Llama 2/3 (RoPE scaling `llama3`), SmolLM2, TinyLlama, Mistral (sliding-window
attention on every layer when `sliding_window` is below the context): the causal-LM base with
Llama's defaults (models/causal_lm.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import (DECODER_FIELDS, CausalLM, DecoderConfig, LayerAttention, WeightMap,
                        decoder_weight_map)
from .config import ConfigField
from .layers import Flags


@dataclass(frozen=True)
class LlamaConfig(DecoderConfig):
    attention_bias: bool = False            # q, k, v and o projections
    mlp_bias: bool = False
    sliding_window: int | None = None       # Mistral: every layer attends to the last this-many tokens

    ARCH: ClassVar[str] = "llama"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*DECODER_FIELDS,
                                                 ConfigField("attention_bias", ("attention_bias",), default=False),
                                                 ConfigField("mlp_bias", ("mlp_bias",), default=False),
                                                 ConfigField("sliding_window", ("sliding_window",), default=None))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        window = values["sliding_window"]
        if not window or window >= values["context_window_size"]:
            values["sliding_window"] = None   # a window as long as the context never slides: plain attention
        return values

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, mlp_bias=self.mlp_bias)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        kind = "sliding" if self.sliding_window else "full"
        return (LayerAttention(kind, self.sliding_window, self.rope_theta, self.rope_scaling),) * self.num_hidden_layers


LlamaForCausalLM = CausalLM


def weight_map(c: LlamaConfig) -> WeightMap:
    return decoder_weight_map(c)
