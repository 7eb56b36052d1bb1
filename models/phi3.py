"""Phi-3 / Phi-3.5 mini, Phi-4 mini: a Llama whose checkpoints store q/k/v fused (`qkv_proj`) and gate/up
fused (`gate_up_proj`, gate first) — kiln's own layout, so the weights map one to one. Phi-4 mini
rotates only the first 3/4 of each head (`partial_rotary_factor`).

LongRoPE (`rope_scaling` type `longrope`, or `su` in older configs) switches from short to long
factors once a sequence passes original_max_position_embeddings. kiln applies the short factors
(in the graph, with LongRoPE's cos/sin factor) and caps the context there, so within it the model
is exactly transformers' and no prompt silently runs on the wrong factors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, CausalLM, DecoderConfig, LayerAttention, WeightMap, head_weights
from .config import ConfigField, window_of


@dataclass(frozen=True)
class Phi3Config(DecoderConfig):
    sliding_window: int | None = None

    ARCH: ClassVar[str] = "phi3"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*DECODER_FIELDS,
                                                 ConfigField("sliding_window", ("sliding_window",), default=None))
    ROPE_TYPES: ClassVar[tuple[str, ...]] = ("default", "longrope", "su")

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        return longrope(values, hf, notes)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        window = window_of(vars(self))
        return (LayerAttention("sliding" if window else "full", window, self.rope_theta, self.rope_scaling),) \
            * self.num_hidden_layers


def longrope(values: dict, hf: dict, notes: list[str]) -> dict:
    """A config's LongRoPE scaling (longrope, or su) completed (its pretraining context and factor), and the
    context capped there with a note: kiln applies the short factors only."""
    scaling = values["rope_scaling"]
    if scaling is None:
        return values
    original = scaling.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings")
    if not original:
        raise ValueError("longrope rope_scaling needs original_max_position_embeddings; add it to config.json")
    factor = scaling.get("factor") or values["context_window_size"] / original
    values = dict(values, rope_scaling=dict(scaling, rope_type="longrope", original_max_position_embeddings=original,
                                            factor=factor))
    if values["context_window_size"] > original:
        notes.append(f"context window capped at {original} tokens (LongRoPE's short factors; "
                     "the long factors are not supported yet)")
        values["context_window_size"] = int(original)
    return values


Phi3ForCausalLM = CausalLM


def weight_map(c: Phi3Config) -> WeightMap:
    m: WeightMap = head_weights(c)
    for i in range(c.num_hidden_layers):
        k = f"model.layers.{i}"
        for name in ("input_layernorm", "post_attention_layernorm", "self_attn.qkv_proj", "self_attn.o_proj",
                     "mlp.gate_up_proj", "mlp.down_proj"):
            m[f"{k}.{name}.weight"] = [f"{k}.{name}.weight"]
    return m
