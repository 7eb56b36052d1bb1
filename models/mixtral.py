"""Mixtral (Mistral AI): a Mistral whose MLPs are sparse mixtures of `num_local_experts` experts, the
top `num_experts_per_tok` per token, their router weights renormalised to sum to 1 (models/moe.py).
Checkpoints name the experts' gate, down and up projections w1, w2 and w3."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import CausalLM, WeightMap
from .config import ConfigField
from .llama import LlamaConfig
from .moe import EXPERT_FIELDS, MoESpec, moe_weight_map

NAMES = dict(router="block_sparse_moe.gate", expert="block_sparse_moe.experts.{j}", gate="w1", up="w3", down="w2")


@dataclass(frozen=True)
class MixtralConfig(LlamaConfig):
    num_experts: int = 8
    top_k: int = 2

    ARCH: ClassVar[str] = "mixtral"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*LlamaConfig.FIELDS, *EXPERT_FIELDS)

    def layer_moe(self, layer: int) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.intermediate_size, normalize=True)


MixtralForCausalLM = CausalLM


def weight_map(c: MixtralConfig) -> WeightMap:
    return moe_weight_map(c, NAMES)
