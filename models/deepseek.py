"""Llamas with multi-head latent attention (models/mla.py):

    deepseek_v2     DeepSeek-V2 / V2-Lite / V2.5: softmax experts, the top `num_experts_per_tok` taken
                    greedily or from the best `topk_group` of `n_group` groups by their best expert
                    (`topk_method` group_limited_greedy), not renormalised, times `routed_scaling_factor`;
                    ungated shared experts; the first `first_k_dense_replace` layers dense
    deepseek_v3     DeepSeek-V3 / R1, Kimi K2, Moonlight: DeepSeek-V3's router (models/glm4_moe.py), RoPE
                    on interleaved pairs where `rope_interleave` (the default), else on halves
    glm4_moe_lite   GLM-4.7-Flash: DeepSeek-V3's attention and router, dense layers by `mlp_layer_types`
    deepseek_v32    DeepSeek-V3.2 (-Exp) and GLM-5 (glm_moe_dsa): GLM-4.7-Flash's shape whose attention reads only
                    the `index_topk` keys its lightning indexer scores highest: up to index_topk tokens every key,
                    so V3's attention exactly; the context window capped there, the indexer's tensors unread
    axk1            SK Telecom's A.X K1: DeepSeek-V3 with an RMSNorm on the experts' output (post_mlp_layernorm), dense
                    layers by `mlp_layer_types` (or first_k_dense_replace and moe_layer_freq)
    youtu           Youtu-LLM: latent attention, dense MLPs, tied embeddings
    plm             PLM (PLM-Team's peripheral models, PLM-1.8B; its own code's PLMForCausalLM, llama.cpp's plm GGUFs):
                    Youtu's shape (queries by one q_proj) whose MLPs are squared ReLUs without a gate
                    (down_proj(relu(up_proj x)^2))
    minicpm3        MiniCPM3: Youtu's shape with RoPE on halves (LongRoPE: the short factors), MiniCPM's
                    embedding scale (`scale_emb`), residual scale (scale_depth / sqrt(layers)) and logits
                    divided by hidden_size / dim_model_base
    mistral4        Mistral 4: DeepSeek-V3's attention with Llama 4's query temperature past the
                    pretraining context (`llama_4_scaling_beta`), softmax experts chosen from the best
                    groups by their two best scores, renormalised, without a choice bias

YaRN scales the softmax by mscale(factor, mscale_all_dim) ** 2 as DeepSeek's checkpoints were trained.
The multi-token-prediction layers (`num_nextn_predict_layers`, after the last layer) are not loaded."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import CausalLM, WeightMap, decoder_weight_map
from .config import ConfigField, fields_with
from .glm4_moe import MLP_LAYER_TYPES, NAMES, ROUTED_FIELDS, DenseByType, Glm4MoeConfig, V2Router
from .layers import Flags
from .llama import MUP_FIELDS, LlamaConfig, MuPScales
from .mla import MLASpec, latent_weight_map
from .phi3 import longrope
from .rope import query_temperature
from .moe import MoESpec, moe_weight_map

MLA_FIELDS = (
    ConfigField("q_lora_rank", ("q_lora_rank",), default=None),
    ConfigField("kv_lora_rank", ("kv_lora_rank",)),
    ConfigField("qk_nope_head_dim", ("qk_nope_head_dim",)),
    ConfigField("qk_rope_head_dim", ("qk_rope_head_dim",)),
    ConfigField("v_head_dim", ("v_head_dim",)),
    ConfigField("rope_interleave", ("rope_interleave",), default=True),
)


@dataclass(frozen=True)
class DeepseekV3Config(Glm4MoeConfig):
    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rope_interleave: bool = True

    ARCH: ClassVar[str] = "deepseek_v3"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*fields_with(
        LlamaConfig.FIELDS, *ROUTED_FIELDS, ConfigField("first_dense", ("first_k_dense_replace",), default=3)),
        *MLA_FIELDS)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        # The cache holds each head's expanded key and value: q's heads, [rotated, nope] dims (models/mla.py).
        head_dim = values["qk_nope_head_dim"] + values["qk_rope_head_dim"]
        values = dict(values, head_dim=head_dim, num_key_value_heads=values["num_attention_heads"],
                      partial_rotary_factor=values["qk_rope_head_dim"] / head_dim, use_qk_norm=False)
        return super().adapt(values, hf, notes)

    @property
    def rotary_dim(self) -> int:
        return self.qk_rope_head_dim                # exactly (head_dim * its share can round below it)

    def latent_attention(self) -> MLASpec:
        return MLASpec(self.q_lora_rank, self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim,
                       self.v_head_dim, self.rope_interleave)

    def flags(self) -> Flags:
        scale = self.head_dim ** -0.5
        scaling = self.rope_scaling or {}
        if scaling.get("rope_type") == "yarn" and scaling.get("mscale_all_dim") and scaling["factor"] > 1:
            scale *= (0.1 * scaling["mscale_all_dim"] * math.log(scaling["factor"]) + 1.0) ** 2
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, attn_scale=scale)


@dataclass(frozen=True)
class SarvamMLAConfig(DeepseekV3Config):
    """Sarvam's MLA models (sarvam-105b): DeepSeek-V3 (transformers runs them as DeepseekV3ForCausalLM) with one
    leading dense layer and ungrouped routing by default, read from either config format: transformers' or the
    original one (num_experts / num_shared_experts, rope_scaling type deepseek_yarn: YaRN; its head_dim, vLLM's
    latent width, is derived here as DeepSeek-V3's is). The released checkpoints hold no multi-token-prediction
    layers."""

    ARCH: ClassVar[str] = "sarvam_mla"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DeepseekV3Config.FIELDS, ConfigField("first_dense", ("first_k_dense_replace",), default=1))

    @classmethod
    def from_hf(cls, hf: dict) -> "SarvamMLAConfig":
        scaling = hf.get("rope_scaling") or {}
        if "deepseek_yarn" in (scaling.get("type"), scaling.get("rope_type")):
            hf = dict(hf, rope_scaling={**{k: v for k, v in scaling.items() if k != "type"}, "rope_type": "yarn"})
        return super().from_hf(hf)


@dataclass(frozen=True)
class DeepseekV2Config(V2Router, DeepseekV3Config):
    ARCH: ClassVar[str] = "deepseek_v2"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DeepseekV3Config.FIELDS, ConfigField("first_dense", ("first_k_dense_replace",), default=0),
        ConfigField("norm_topk_prob", ("norm_topk_prob",), default=False),
        ConfigField("groups", ("n_group",), default=1), ConfigField("top_groups", ("topk_group",), default=1))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("moe_layer_freq", 1) != 1:
            raise ValueError("DeepSeek-V2 with moe_layer_freq other than 1 is not supported (transformers makes "
                             "every layer after first_k_dense_replace sparse); fix config.json")
        # V2 rotates pairs (complex); transformers' V2 router: V2Router's
        return super().adapt(dict(values, rope_interleave=True), hf, notes)


@dataclass(frozen=True)
class Glm4MoeLiteConfig(DenseByType, DeepseekV3Config):
    ARCH: ClassVar[str] = "glm4_moe_lite"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(DeepseekV3Config.FIELDS, ConfigField("first_dense", ("first_k_dense_replace",), default=1)),
        MLP_LAYER_TYPES)


@dataclass(frozen=True)
class DeepseekV32Config(Glm4MoeLiteConfig):
    ARCH: ClassVar[str] = "deepseek_v32"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(Glm4MoeLiteConfig.FIELDS, ConfigField("first_dense", ("first_k_dense_replace",), default=3)),
        ConfigField("index_topk", ("index_topk",), default=2048))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        topk = int(values.pop("index_topk"))
        if values["context_window_size"] > topk:
            # DeepSeek Sparse Attention: each query attends to the index_topk keys the indexer scores highest, so
            # every key while there are at most index_topk (transformers: topk of min(index_topk, keys))
            notes.append(f"context window capped at index_topk ({topk} tokens): within it, sparse attention attends "
                         "to every key (DeepSeek-V3's attention); the lightning indexer past it is not supported yet")
            values["context_window_size"] = topk
        return super().adapt(values, hf, notes)


@dataclass(frozen=True)
class AXK1Config(Glm4MoeLiteConfig):
    """SK Telecom's A.X K1: DeepSeek-V3 (queries always through q_lora_rank) whose experts' output (routed plus
    shared) is RMS-normed before its residual (post_mlp_layernorm, on the MoE layers only); dense layers by
    `mlp_layer_types`, else the first first_k_dense_replace and every moe_layer_freq-th after sparse."""

    ARCH: ClassVar[str] = "axk1"

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n, freq = values["num_hidden_layers"], int(hf.get("moe_layer_freq", 1))
        if values["mlp_layer_types"] is None:
            values = dict(values, mlp_layer_types=["sparse" if i >= values["first_dense"] and i % freq == 0
                                                   else "dense" for i in range(n)])
        return super().adapt(values, hf, notes)

    def layer_flags(self, layer: int) -> Flags:
        return dataclasses.replace(self.flags(), mlp_out_norm=self.layer_moe(layer) is not None)


@dataclass(frozen=True)
class YoutuConfig(DeepseekV3Config):
    ARCH: ClassVar[str] = "youtu"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(LlamaConfig.FIELDS, ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True)),
        *MLA_FIELDS)

    def layer_moe(self, layer: int) -> None:
        return None


@dataclass(frozen=True)
class PLMConfig(YoutuConfig):
    ARCH: ClassVar[str] = "plm"

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("hidden_act", "relu2") != "relu2":
            raise ValueError(f"PLM's MLP is a squared ReLU (hidden_act relu2), not {hf['hidden_act']!r}; fix "
                             "config.json")
        return super().adapt(values, hf, notes)

    def flags(self) -> Flags:
        return dataclasses.replace(super().flags(), activation="relu2", gated_mlp=False)


@dataclass(frozen=True)
class MiniCPM3Config(MuPScales, YoutuConfig):
    ARCH: ClassVar[str] = "minicpm3"
    ROPE_TYPES: ClassVar[tuple[str, ...]] = ("default", "longrope", "su")
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*YoutuConfig.FIELDS, *MUP_FIELDS)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        values = dict(longrope(values, hf, notes), rope_interleave=False)     # cos/sin on halves, as Llama's
        return super().adapt(values, hf, notes)


@dataclass(frozen=True)
class Mistral4Config(DeepseekV3Config):
    attn_temperature: tuple[float, int] | None = None

    ARCH: ClassVar[str] = "mistral4"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DeepseekV3Config.FIELDS, ConfigField("first_dense", ("first_k_dense_replace",), default=0))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        return super().adapt(dict(values, attn_temperature=query_temperature(values["rope_scaling"])), hf, notes)

    def flags(self) -> Flags:
        return dataclasses.replace(super().flags(), attn_temperature=self.attn_temperature)

    def routed(self) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, self.norm_topk_prob,
                       self.moe_intermediate_size * self.shared_experts, shared_gated=False, groups=self.groups,
                       top_groups=self.top_groups, routed_scale=self.routed_scale)


DeepseekV2ForCausalLM = DeepseekV3ForCausalLM = SarvamMLAForCausalLM = AXK1ForCausalLM = CausalLM
Glm4MoeLiteForCausalLM = DeepseekV32ForCausalLM = YoutuForCausalLM = CausalLM
MiniCPM3ForCausalLM = Mistral4ForCausalLM = PLMForCausalLM = CausalLM


def weight_map(c: DeepseekV3Config) -> WeightMap:
    # Mistral 4's checkpoints hold transformers 5's 3-D experts (no conversion maps them from per-expert tensors)
    names = dict(NAMES, fused="mlp.experts") \
        if isinstance(c, Mistral4Config) else NAMES
    m = decoder_weight_map(c) if isinstance(c, YoutuConfig) else moe_weight_map(c, names)
    if isinstance(c, AXK1Config):               # the experts' output norm, stored at the layer
        for i in range(c.num_hidden_layers):
            if c.layer_moe(i) is not None:
                m[f"model.layers.{i}.post_mlp_norm.weight"] = [f"model.layers.{i}.post_mlp_layernorm.weight"]
    return latent_weight_map(c, m)
