"""Qwen2 / Qwen2.5: a Llama with biases on the q, k and v projections (none on o).

Sliding-window attention follows transformers' Qwen2Config: with `use_sliding_window`, layer i
slides iff `layer_types[i] == "sliding_attention"`, and without `layer_types` iff
i >= `max_window_layers` (so the first max_window_layers layers stay full). Released checkpoints
ship use_sliding_window=false.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import CausalLM, DecoderConfig, LayerAttention, WeightMap, decoder_weight_map
from .layers import Flags


@dataclass(frozen=True)
class Qwen2Config(DecoderConfig):
    sliding_layers: tuple[int, ...] = ()    # layer ids that attend to the last `sliding_window` tokens
    sliding_window: int | None = None

    ARCH: ClassVar[str] = "qwen2"

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        window = hf.get("sliding_window")
        n = values["num_hidden_layers"]
        if not (hf.get("use_sliding_window") and window and window < values["context_window_size"]):
            return values
        types = hf.get("layer_types")
        if types is not None and len(types) != n:
            raise ValueError(f"config.json layer_types lists {len(types)} layers but num_hidden_layers is {n}; "
                             "fix config.json")
        first = hf.get("max_window_layers", 28)      # transformers' default
        sliding = [i for i in range(n) if (types[i] == "sliding_attention" if types else i >= first)]
        values.update(sliding_layers=tuple(sliding), sliding_window=int(window) if sliding else None)
        return values

    def flags(self) -> Flags:
        return Flags(qkv_bias=True)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        def layer(i: int) -> LayerAttention:
            slides = i in self.sliding_layers
            return LayerAttention("sliding" if slides else "full", self.sliding_window if slides else None,
                                  self.rope_theta, self.rope_scaling)
        return tuple(layer(i) for i in range(self.num_hidden_layers))


Qwen2ForCausalLM = CausalLM


def weight_map(c: Qwen2Config) -> WeightMap:
    return decoder_weight_map(c)
