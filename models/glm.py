"""Zhipu GLM-4 (`glm`: glm-4-9b-chat-hf and kin; `glm4`: GLM-4-0414, GLM-Z1): a Llama with q/k/v
biases, gate and up stored fused (`gate_up_proj`), and RoPE on the first half of each head
(`partial_rotary_factor`, 0.5 by default) rotating adjacent pairs of dims (kiln reorders the q and
k rows as it loads them: causal_lm.rope_halves). GLM-4-0414 adds a norm on the attention and on the
MLP output before each residual add (`post_self_attn_layernorm`, `post_mlp_layernorm`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, WeightMap, decoder_weight_map
from .config import ConfigField, fields_with
from .layers import Flags

# kiln's post_attn_norm / post_mlp_norm are GLM-4-0414's post_self_attn_layernorm / post_mlp_layernorm.
NAMES = dict(LLAMA_NAMES, post_attn_norm="post_self_attn_layernorm", post_mlp_norm="post_mlp_layernorm")


@dataclass(frozen=True)
class GlmConfig(DecoderConfig):
    attention_bias: bool = True             # q, k and v (o has none)

    ARCH: ClassVar[str] = "glm"
    ADJACENT_ROPE: ClassVar[bool] = True
    POST_NORMS: ClassVar[bool] = False
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("partial_rotary_factor", ("partial_rotary_factor",), default=0.5),
        ConfigField("attention_bias", ("attention_bias",), default=True))

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, sandwich_norms=self.POST_NORMS)


@dataclass(frozen=True)
class Glm4Config(GlmConfig):
    ARCH: ClassVar[str] = "glm4"
    POST_NORMS: ClassVar[bool] = True


GlmForCausalLM = Glm4ForCausalLM = CausalLM


def weight_map(c: GlmConfig) -> WeightMap:
    m = decoder_weight_map(c, NAMES)
    for i in range(c.num_hidden_layers):                  # gate and up: one stored tensor, gate first
        m[f"model.layers.{i}.mlp.gate_up_proj.weight"] = [f"model.layers.{i}.mlp.gate_up_proj.weight"]
    return m
