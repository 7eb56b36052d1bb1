"""OLMo 2 (AI2): a Llama whose norms come after attention and MLP instead of before (each block's
output is normed, then added), and whose q and k are RMS-normed over all heads' dims at once
(`q_norm` [heads x head_dim]) before RoPE."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import LLAMA_NAMES, CausalLM, WeightMap, decoder_weight_map
from .layers import Flags
from .llama import LlamaConfig

# kiln's post_attn_norm / post_mlp_norm are OLMo 2's post_attention_layernorm / post_feedforward_layernorm.
NAMES = dict(LLAMA_NAMES, post_attn_norm="post_attention_layernorm", post_mlp_norm="post_feedforward_layernorm")


@dataclass(frozen=True)
class Olmo2Config(LlamaConfig):
    ARCH: ClassVar[str] = "olmo2"

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, mlp_bias=self.mlp_bias,
                     pre_norms=False, sandwich_norms=True, qk_norm=True, qk_norm_heads=False)


Olmo2ForCausalLM = CausalLM


def weight_map(c: Olmo2Config) -> WeightMap:
    return decoder_weight_map(c, NAMES)
