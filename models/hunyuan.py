"""Tencent Hunyuan dense (Hunyuan-0.5B .. 7B): a Llama whose q and k are RMS-normed per head after RoPE
(`query_layernorm` / `key_layernorm`: RoPE is then applied in the graph, before the norms), with RoPE
scaling "dynamic" at a fixed `alpha`, which only raises the base: theta * alpha ** (d / (d - 2)).
Cross-layer attention (`use_cla`) is refused. Hunyuan MoE (Hunyuan-A13B) makes every MLP a sparse mixture of
`num_experts` experts (models/moe.py: softmax, the top `moe_topk` renormalised; a list gives each layer's)
beside an always-on shared MLP, all of `intermediate_size`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import LLAMA_NAMES, CausalLM, WeightMap, decoder_weight_map
from .config import ConfigField, fields_with
from .layers import Flags
from .llama import LlamaConfig
from .moe import MoESpec, moe_weight_map

NAMES = dict(LLAMA_NAMES, q_norm="self_attn.query_layernorm", k_norm="self_attn.key_layernorm")


@dataclass(frozen=True)
class HunYuanDenseConfig(LlamaConfig):
    ARCH: ClassVar[str] = "hunyuan_v1_dense"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        LlamaConfig.FIELDS, ConfigField("head_dim", ("head_dim", "attention_head_dim"), default=None))
    ROPE_TYPES: ClassVar[tuple[str, ...]] = (*LlamaConfig.ROPE_TYPES, "dynamic")

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("use_cla"):
            raise ValueError("Hunyuan with use_cla (cross-layer attention) is not supported; load a checkpoint "
                             "without it")
        if hf.get("use_qk_norm") is False:
            raise ValueError("Hunyuan with use_qk_norm false is not supported (transformers norms q and k always)")
        scaling = values["rope_scaling"]
        if scaling and scaling["rope_type"] == "dynamic":
            if not scaling.get("alpha"):
                raise ValueError("rope_scaling type 'dynamic' without 'alpha' (NTK scaling that follows the "
                                 "sequence length) is not supported for hunyuan_v1_dense; fix config.json")
            d = values["head_dim"]
            values = dict(values, rope_theta=values["rope_theta"] * scaling["alpha"] ** (d / (d - 2)),
                          rope_scaling=None)
        return super().adapt(values, hf, notes)

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, mlp_bias=self.mlp_bias,
                     qk_norm=True, qk_norm_after_rope=True)


@dataclass(frozen=True)
class HunYuanMoEConfig(HunYuanDenseConfig):
    num_experts: int = 1
    top_k: tuple[int, ...] = (1,)             # per layer

    ARCH: ClassVar[str] = "hunyuan_v1_moe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *HunYuanDenseConfig.FIELDS, ConfigField("num_experts", ("num_experts", "num_local_experts"), default=1),
        ConfigField("top_k", ("moe_topk", "num_experts_per_tok"), default=1))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n, k = values["num_hidden_layers"], values["top_k"]
        if isinstance(values["num_experts"], (list, tuple)):
            raise ValueError("Hunyuan MoE with a list for num_experts is not supported (transformers builds one "
                             "count); fix config.json")
        k = tuple(k) if isinstance(k, (list, tuple)) else (k,) * n
        if len(k) != n:
            raise ValueError(f"moe_topk lists {len(k)} values for {n} layers; fix config.json")
        return super().adapt(dict(values, top_k=k), hf, notes)

    def layer_moe(self, layer: int) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k[layer], self.intermediate_size, True, self.intermediate_size,
                       shared_gated=False)


HunYuanDenseV1ForCausalLM = HunYuanMoEV1ForCausalLM = CausalLM
MOE_NAMES = dict(router="mlp.gate.wg", expert="mlp.experts.{j}", gate="gate_proj", up="up_proj", down="down_proj",
                 shared="mlp.shared_mlp")


def weight_map(c: HunYuanDenseConfig) -> WeightMap:
    if isinstance(c, HunYuanMoEConfig):
        return moe_weight_map(c, MOE_NAMES, NAMES)
    return decoder_weight_map(c, NAMES)
