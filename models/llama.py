"""The Llama family: Llama 2/3 (RoPE scaling `llama3`), SmolLM2, TinyLlama, Mistral (without
sliding window): the causal-LM base with Llama's defaults (models/causal_lm.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, CausalLM, DecoderConfig, WeightMap, decoder_weight_map
from .config import ConfigField
from .layers import Flags


@dataclass(frozen=True)
class LlamaConfig(DecoderConfig):
    attention_bias: bool = False            # q, k, v and o projections
    mlp_bias: bool = False

    ARCH: ClassVar[str] = "llama"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*DECODER_FIELDS,
                                                 ConfigField("attention_bias", ("attention_bias",), default=False),
                                                 ConfigField("mlp_bias", ("mlp_bias",), default=False))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        window = hf.get("sliding_window")
        if window and window < values["context_window_size"]:
            # Mistral's sliding window is not mapped yet: within the window attention is exact,
            # so the context is capped at the window instead of silently diverging past it.
            notes.append(f"context window capped at the sliding window ({window} tokens)")
            values["context_window_size"] = int(window)
        return values

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, mlp_bias=self.mlp_bias)


LlamaForCausalLM = CausalLM


def weight_map(c: LlamaConfig) -> WeightMap:
    return decoder_weight_map(c)
