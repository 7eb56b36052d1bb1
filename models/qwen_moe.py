"""Qwen2-MoE (Qwen1.5-MoE) and Qwen3-MoE: Qwen2 / Qwen3 whose MLPs are sparse mixtures of `num_experts`
experts of `moe_intermediate_size` (models/moe.py): the top `num_experts_per_tok` per token,
renormalised where `norm_topk_prob`; every `decoder_sparse_step`-th layer not in `mlp_only_layers`
(the others keep a dense MLP of `intermediate_size`). Qwen2-MoE adds a shared expert of
`shared_expert_intermediate_size` behind a sigmoid gate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, CausalLM, WeightMap
from .config import ConfigField
from .moe import EXPERT_FIELDS, MoESpec, moe_weight_map
from .qwen2 import Qwen2Config
from .qwen3 import Qwen3Config

NAMES = dict(router="mlp.gate", expert="mlp.experts.{j}", gate="gate_proj", up="up_proj", down="down_proj",
             shared="mlp.shared_expert", shared_gate="mlp.shared_expert_gate")
MOE_FIELDS = (
    *EXPERT_FIELDS,
    ConfigField("moe_intermediate_size", ("moe_intermediate_size",)),
    ConfigField("norm_topk_prob", ("norm_topk_prob",), default=False),
    ConfigField("sparse_step", ("decoder_sparse_step",), default=1),
    ConfigField("dense_layers", ("mlp_only_layers",), default=()),
    ConfigField("shared_intermediate_size", ("shared_expert_intermediate_size",), default=0),
)


@dataclass(frozen=True)
class _QwenMoE:
    """The MoE fields and layer choice both Qwen MoE families share (a mixin before the dense config)."""

    num_experts: int = 0
    top_k: int = 1
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    sparse_step: int = 1
    dense_layers: tuple[int, ...] = ()
    shared_intermediate_size: int = 0

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        return super().adapt(dict(values, dense_layers=tuple(values["dense_layers"])), hf, notes)

    def layer_moe(self, layer: int) -> MoESpec | None:
        if layer in self.dense_layers or not self.num_experts or (layer + 1) % self.sparse_step:
            return None
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, self.norm_topk_prob,
                       self.shared_intermediate_size)


@dataclass(frozen=True)
class Qwen2MoeConfig(_QwenMoE, Qwen2Config):
    ARCH: ClassVar[str] = "qwen2_moe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*DECODER_FIELDS, *MOE_FIELDS)


@dataclass(frozen=True)
class Qwen3MoeConfig(_QwenMoE, Qwen3Config):
    ARCH: ClassVar[str] = "qwen3_moe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*Qwen3Config.FIELDS, *MOE_FIELDS)


Qwen2MoeForCausalLM = Qwen3MoeForCausalLM = CausalLM


def weight_map(c: Qwen2MoeConfig | Qwen3MoeConfig) -> WeightMap:
    return moe_weight_map(c, NAMES)
