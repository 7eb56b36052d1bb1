"""OLMoE (AI2): a pre-norm Llama whose q and k are RMS-normed over all heads' dims at once (as OLMo 2's)
and whose MLPs are sparse mixtures of `num_experts` experts, the top `num_experts_per_tok` per
token (models/moe.py), renormalised where `norm_topk_prob`. `clip_qkv` is refused. FlexOlmo is
OLMoE with OLMo 2's norms: after attention and MLP, none before."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import LLAMA_NAMES, CausalLM, WeightMap
from .config import ConfigField
from .layers import Flags
from .llama import LlamaConfig
from .moe import EXPERT_FIELDS, MoESpec, moe_weight_map
from .olmo2 import NAMES as OLMO2_NAMES
from .qwen_moe import NAMES


@dataclass(frozen=True)
class OlmoeConfig(LlamaConfig):
    num_experts: int = 64
    top_k: int = 8
    norm_topk_prob: bool = False

    ARCH: ClassVar[str] = "olmoe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*LlamaConfig.FIELDS, *EXPERT_FIELDS,
                                                 ConfigField("norm_topk_prob", ("norm_topk_prob",), default=False))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("clip_qkv") is not None:
            raise ValueError("OLMoE with clip_qkv is not supported yet (released checkpoints leave it null)")
        return super().adapt(values, hf, notes)

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, qk_norm=True, qk_norm_heads=False)

    def layer_moe(self, layer: int) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.intermediate_size, self.norm_topk_prob)


@dataclass(frozen=True)
class FlexOlmoConfig(OlmoeConfig):
    ARCH: ClassVar[str] = "flex_olmo"

    def flags(self) -> Flags:
        return dataclasses.replace(super().flags(), pre_norms=False, sandwich_norms=True)


OlmoeForCausalLM = FlexOlmoForCausalLM = CausalLM


def weight_map(c: OlmoeConfig) -> WeightMap:
    return moe_weight_map(c, NAMES, OLMO2_NAMES if isinstance(c, FlexOlmoConfig) else LLAMA_NAMES)
