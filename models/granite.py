"""IBM Granite 3.x (dense): a Llama with four multipliers — the embeddings scaled by
`embedding_multiplier`, attention's softmax scale `attention_multiplier` itself (not head_dim ** -0.5),
each attention and MLP output scaled by `residual_multiplier` before its residual add, and the logits
divided by `logits_scaling`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import CausalLM, WeightMap, decoder_weight_map
from .config import ConfigField
from .layers import Flags
from .llama import LlamaConfig


@dataclass(frozen=True)
class GraniteConfig(LlamaConfig):
    embedding_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0

    ARCH: ClassVar[str] = "granite"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*LlamaConfig.FIELDS, *(
        ConfigField(name, (name,), default=1.0)
        for name in ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")))

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, mlp_bias=self.mlp_bias,
                     embed_scale=self.embedding_multiplier, attn_scale=self.attention_multiplier,
                     residual_scale=self.residual_multiplier, logit_divisor=self.logits_scaling)


GraniteForCausalLM = CausalLM


def weight_map(c: GraniteConfig) -> WeightMap:
    return decoder_weight_map(c)
