"""Qwen2 / Qwen2.5: a Llama with biases on the q, k and v projections (none on o)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import CausalLM, DecoderConfig, WeightMap, decoder_weight_map
from .layers import Flags


@dataclass(frozen=True)
class Qwen2Config(DecoderConfig):
    ARCH: ClassVar[str] = "qwen2"

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        window = hf.get("sliding_window")
        if hf.get("use_sliding_window") and window and window < values["context_window_size"]:
            # Released Qwen2 checkpoints ship use_sliding_window=false. Where it is on, attention
            # is exact within the window: cap the context there until the runtime windows sequences.
            notes.append(f"context window capped at the sliding window ({window} tokens)")
            values["context_window_size"] = int(window)
        return values

    def flags(self) -> Flags:
        return Flags(qkv_bias=True)


Qwen2ForCausalLM = CausalLM


def weight_map(c: Qwen2Config) -> WeightMap:
    return decoder_weight_map(c)
