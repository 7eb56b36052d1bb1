"""Mixtral (Mistral AI): a Mistral whose MLPs are sparse mixtures of `num_local_experts` experts, the
top `num_experts_per_tok` per token, their router weights renormalised to sum to 1 (models/moe.py).
Checkpoints name the experts' gate, down and up projections w1, w2 and w3. Phi-3.5-MoE is a Mixtral with
LayerNorm (weight and bias) for every norm, biases on q/k/v/o (`attention_bias`) and the head
(`lm_head_bias`), LongRoPE whose short factors scale cos and sin by `short_mscale`, and the sparsemixer
router (models/moe.py: each of its two experts weighed among the logits near its own). Rhymes' Aria (its language
model, aria_text, alone or inside AriaForConditionalGeneration) is a Llama whose every MLP is a mixture of
`moe_num_experts` experts of intermediate_size (the top `moe_topk`, weighed by the softmax of their logits) beside
`moe_num_shared_experts` shared ones added ungated, its experts stored as fc1 [experts, hidden, gate | up] and fc2
[experts, width, hidden] (x @ W)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import CausalLM, WeightMap, WeightSpec
from .config import ConfigField, refuse_unlike
from .layers import Flags
from .llama import LlamaConfig
from .moe import EXPERT_FIELDS, MoESpec, expert_columns, moe_weight_map
from .phi3 import longrope

NAMES = dict(router="block_sparse_moe.gate", expert="block_sparse_moe.experts.{j}", gate="w1", up="w3", down="w2")


@dataclass(frozen=True)
class MixtralConfig(LlamaConfig):
    num_experts: int = 8
    top_k: int = 2

    ARCH: ClassVar[str] = "mixtral"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*LlamaConfig.FIELDS, *EXPERT_FIELDS)

    def layer_moe(self, layer: int) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.intermediate_size, normalize=True)


@dataclass(frozen=True)
class PhimoeConfig(MixtralConfig):
    lm_head_bias: bool = False
    jitter_eps: float = 0.01

    ARCH: ClassVar[str] = "phimoe"
    ROPE_TYPES: ClassVar[tuple[str, ...]] = ("default", "longrope", "su")
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *MixtralConfig.FIELDS, ConfigField("lm_head_bias", ("lm_head_bias",), default=False),
        ConfigField("jitter_eps", ("router_jitter_noise",), default=0.01))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("input_jitter_noise"):
            notes.append("input_jitter_noise applies in training only")
        values = longrope(values, hf, notes)
        scaling = values["rope_scaling"]
        if scaling is not None and scaling.get("short_mscale") is not None:     # cos/sin's factor, short factors
            values["rope_scaling"] = dict(scaling, attention_factor=float(scaling["short_mscale"]))
        return super().adapt(values, hf, notes)

    def flags(self) -> Flags:
        return Flags(norm="layer", qkv_bias=self.attention_bias, o_bias=self.attention_bias,
                     head_bias=self.lm_head_bias)

    def layer_moe(self, layer: int) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.intermediate_size, normalize=False, scoring="sparsemixer",
                       jitter_eps=self.jitter_eps)


@dataclass(frozen=True)
class AriaTextConfig(MixtralConfig):
    shared_experts: int = 2

    ARCH: ClassVar[str] = "aria_text"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *LlamaConfig.FIELDS, ConfigField("num_experts", ("moe_num_experts",), default=8),
        ConfigField("top_k", ("moe_topk",), default=2), ConfigField("shared_experts", ("moe_num_shared_experts",),
                                                                    default=2))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        refuse_unlike(hf, (("hidden_act", "silu"),), cls.ARCH)     # its experts' SiLU is fixed; its shared ones'
        return super().adapt(values, hf, notes)

    def layer_moe(self, layer: int) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.intermediate_size, normalize=True,
                       shared_intermediate_size=self.intermediate_size * self.shared_experts, shared_gated=False)


MixtralForCausalLM = PhimoeForCausalLM = AriaTextForCausalLM = CausalLM


def weight_map(c: MixtralConfig) -> WeightMap:
    if not isinstance(c, AriaTextConfig):
        return moe_weight_map(c, NAMES)
    m = moe_weight_map(c, dict(router="mlp.router", expert="mlp.experts.{j}", gate="gate_proj", up="up_proj",
                               down="down_proj", shared="mlp.shared_experts"))
    for i in range(c.num_hidden_layers):
        k, experts = f"model.layers.{i}.mlp", f"model.layers.{i}.mlp.experts"
        m[f"{k}.experts_gate_up.weight"] = WeightSpec((f"{experts}.fc1.weight",), expert_columns)
        m[f"{k}.experts_down.weight"] = WeightSpec((f"{experts}.fc2.weight",), expert_columns)
    return m
