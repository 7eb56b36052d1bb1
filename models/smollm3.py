"""SmolLM3 (Hugging Face): a Llama in which every `no_rope_layer_interval`-th layer (4th) uses no
positional encoding at all (NoPE): `no_rope_layers[i]` is 1 where layer i rotates q and k. The
layers then differ in RoPE, so the rotating ones rotate in the graph (models/rope.py) and the KV
cache rotates nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import CausalLM, LayerAttention, WeightMap, decoder_weight_map
from .config import ConfigField, fields_with
from .llama import LlamaConfig


@dataclass(frozen=True)
class SmolLM3Config(LlamaConfig):
    rope_layers: tuple[bool, ...] = ()      # per layer: whether it applies RoPE

    ARCH: ClassVar[str] = "smollm3"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        LlamaConfig.FIELDS, ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("rope_layers", ("no_rope_layers",), default=None))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        if hf.get("use_sliding_window") and hf.get("sliding_window"):
            raise ValueError("SmolLM3 with use_sliding_window is not supported (released checkpoints attend to the "
                             "whole context); set use_sliding_window to false in config.json")
        layers = values["rope_layers"]
        if layers is None:                          # transformers' default: every interval-th layer has no RoPE
            interval = hf.get("no_rope_layer_interval", 4)
            layers = [int((i + 1) % interval != 0) for i in range(n)]
        if len(layers) != n or set(layers) - {0, 1}:
            raise ValueError(f"no_rope_layers must hold 1 (RoPE) or 0 (none) for each of the {n} layers; got "
                             f"{layers}; fix config.json")
        return dict(values, rope_layers=tuple(bool(x) for x in layers), sliding_window=None)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return tuple(LayerAttention("full", None, self.rope_theta, self.rope_scaling, rope=r) for r in self.rope_layers)


SmolLM3ForCausalLM = CausalLM


def weight_map(c: SmolLM3Config) -> WeightMap:
    return decoder_weight_map(c)
