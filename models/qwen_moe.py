"""Qwen2-MoE (Qwen1.5-MoE) and Qwen3-MoE: Qwen2 / Qwen3 whose MLPs are sparse mixtures of `num_experts`
experts of `moe_intermediate_size` (models/moe.py): the top `num_experts_per_tok` per token,
renormalised where `norm_topk_prob`; every `decoder_sparse_step`-th layer not in `mlp_only_layers`
(the others keep a dense MLP of `intermediate_size`). Qwen2-MoE adds a shared expert of
`shared_expert_intermediate_size` behind a sigmoid gate. JetBrains' Mellum (MoE) is Qwen3-MoE with
sliding-window layers among full ones (`layer_types`, each kind its own RoPE base: RoPE in the graph),
dense layers by `mlp_layer_types` and multi-token-prediction layers (`mtp.*`, left unread). Flint is
Qwen3-MoE with attention sinks on every layer (a logit per head in each softmax: over the KV cache kiln
owns, models/owned_kv.py), sliding layers with RoPE among full ones without it, a sigmoid router and an
ungated shared expert."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, CausalLM, LayerAttention, WeightMap, local_rope_on_sliding, \
    rope_on_sliding_only
from .config import ConfigField, dense_layers, layer_types, one_partial_rotary, split_layer_rope, window_of
from .layers import Flags
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
class QwenMoeLayers:
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
class Qwen2MoeConfig(QwenMoeLayers, Qwen2Config):
    ARCH: ClassVar[str] = "qwen2_moe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*DECODER_FIELDS, *MOE_FIELDS)


@dataclass(frozen=True)
class Qwen3MoeConfig(QwenMoeLayers, Qwen3Config):
    ARCH: ClassVar[str] = "qwen3_moe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*Qwen3Config.FIELDS, *MOE_FIELDS)


@dataclass(frozen=True)
class MellumConfig(Qwen3MoeConfig):
    """Mellum: `rope_parameters` per layer type (transformers' defaults: 500,000 for full layers, 10,000
    for sliding ones; a partial rotary factor must be the same for both), every layer full where
    config.json lists no types, every MLP sparse where it lists no `mlp_layer_types`."""

    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    local_rope_theta: float = 10000.0

    ARCH: ClassVar[str] = "mellum"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *Qwen3MoeConfig.FIELDS, ConfigField("sliding_window", ("sliding_window",), default=None),
        ConfigField("layer_types", ("layer_types",), default=None),
        ConfigField("local_rope_theta", ("rope_local_base_freq",), default=10000.0))

    @classmethod
    def from_hf(cls, hf: dict) -> "MellumConfig":
        hf = one_partial_rotary(hf, cls.ARCH)
        return super().from_hf(split_layer_rope(hf, full_theta=500000.0, local_theta=10000.0))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        types = layer_types(tuple(values["layer_types"] or ("full_attention",) * n), n, hf, pattern=1)
        values = dict(values, sliding_window=window_of(values) if "sliding_attention" in types else None,
                      layer_types=types,
                      dense_layers=dense_layers(hf.get("mlp_layer_types"), n, first_dense=0))
        return super().adapt(values, hf, notes)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return local_rope_on_sliding(self)


@dataclass(frozen=True)
class FlintConfig(Qwen3MoeConfig):
    """Flint: every layer's attention with sinks; `layer_types` (by default full for the first two, every
    fourth from the second and the last, the others sliding), RoPE on the sliding layers only; experts
    chosen by the sigmoid of the router's logits, renormalised; an ungated shared expert of
    `shared_expert_intermediate_size`; dense MLPs on `mlp_only_layers` (by default the first two)."""

    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()

    ARCH: ClassVar[str] = "flint"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *Qwen3MoeConfig.FIELDS, ConfigField("sliding_window", ("sliding_window",), default=513),
        ConfigField("layer_types", ("layer_types",), default=None))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        types = tuple(values["layer_types"] or (
            "full_attention" if i < 2 or i % 4 == 1 or i == n - 1 else "sliding_attention" for i in range(n)))
        dense = values["dense_layers"] if "mlp_only_layers" in hf else (0, 1)
        return super().adapt(dict(values, layer_types=layer_types(types, n, hf, pattern=1), dense_layers=dense,
                                  norm_topk_prob=hf.get("norm_topk_prob", True)), hf, notes)

    def flags(self) -> Flags:
        return replace(super().flags(), attn_sinks=True)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return rope_on_sliding_only(self)

    def layer_moe(self, layer: int) -> MoESpec | None:
        spec = super().layer_moe(layer)
        return spec and replace(spec, scoring="sigmoid", shared_gated=False)


Qwen2MoeForCausalLM = Qwen3MoeForCausalLM = MellumForCausalLM = FlintForCausalLM = CausalLM


def weight_map(c: Qwen2MoeConfig | Qwen3MoeConfig) -> WeightMap:
    m = moe_weight_map(c, NAMES)
    if c.flags().attn_sinks:
        for i in range(c.num_hidden_layers):
            m[f"model.layers.{i}.self_attn.sinks"] = [f"model.layers.{i}.self_attn.softmax_offset"]   # as saved
    return m
