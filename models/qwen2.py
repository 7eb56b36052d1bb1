"""Qwen2 / Qwen2.5: a Llama with biases on the q, k and v projections (none on o); the first Qwen (QwenConfig) as
it under its own code's names.

Sliding-window attention follows transformers' Qwen2Config: with `use_sliding_window`, layer i
slides iff `layer_types[i] == "sliding_attention"`, and without `layer_types` iff
i >= `max_window_layers` (so the first max_window_layers layers stay full). Released checkpoints
ship use_sliding_window=false.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import (DECODER_FIELDS, CausalLM, DecoderConfig, LayerAttention, WeightMap, decoder_weight_map,
                        head_weights)
from .config import ConfigField, fields_with
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


@dataclass(frozen=True)
class QwenConfig(Qwen2Config):
    """Qwen (the first: QWenLMHeadModel, its own code's checkpoints; Qwen-1.8B / 7B / 14B / 72B): Qwen2's layers
    (multi-head) under GPT-2's names (transformer.h.*: q, k and v fused as c_attn with its bias, the MLP's w2 its gate
    and w1 its up, each of half intermediate_size), RoPE over rotary_pct of each head. Its log-n attention scaling and
    dynamic NTK RoPE act past seq_length tokens alone (its training length): where either is on the context is capped
    there (a note says so), within which the model is Qwen2's."""

    ARCH: ClassVar[str] = "qwen"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("head_dim", ("kv_channels", "head_dim"), default=None),
        ConfigField("norm_eps", ("layer_norm_epsilon", "rms_norm_eps"), default=1e-6),
        ConfigField("rope_theta", ("rotary_emb_base", "rope_theta"), default=10000.0),
        ConfigField("partial_rotary_factor", ("rotary_pct", "partial_rotary_factor"), default=1.0))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("no_bias") is False:
            raise ValueError("Qwen with no_bias false is not supported (the released checkpoints have biases on "
                             "c_attn alone); fix config.json")
        values = dict(values, intermediate_size=values["intermediate_size"] // 2)       # w1's and w2's together
        trained = hf.get("seq_length")
        if trained and trained < values["context_window_size"] and (hf.get("use_logn_attn") or
                                                                    hf.get("use_dynamic_ntk")):
            notes.append(f"context window capped at seq_length ({trained} tokens): past it Qwen scales its attention "
                         "by log-n and its RoPE by dynamic NTK, which kiln does not run")
            values["context_window_size"] = trained
        return super().adapt(values, hf, notes)


Qwen2ForCausalLM = QwenForCausalLM = CausalLM


def weight_map(c: Qwen2Config) -> WeightMap:
    if not isinstance(c, QwenConfig):
        return decoder_weight_map(c)
    m = head_weights(c, "transformer", "wte", "ln_f")
    for i in range(c.num_hidden_layers):
        k, h = f"model.layers.{i}", f"transformer.h.{i}"
        m[f"{k}.input_layernorm.weight"] = [f"{h}.ln_1.weight"]
        m[f"{k}.post_attention_layernorm.weight"] = [f"{h}.ln_2.weight"]
        m[f"{k}.self_attn.qkv_proj.weight"] = [f"{h}.attn.c_attn.weight"]           # rows [q | k | v]
        m[f"{k}.self_attn.qkv_proj.bias"] = [f"{h}.attn.c_attn.bias"]
        m[f"{k}.self_attn.o_proj.weight"] = [f"{h}.attn.c_proj.weight"]
        m[f"{k}.mlp.gate_up_proj.weight"] = [f"{h}.mlp.w2.weight", f"{h}.mlp.w1.weight"]
        m[f"{k}.mlp.down_proj.weight"] = [f"{h}.mlp.c_proj.weight"]
    return m
