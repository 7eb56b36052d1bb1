"""Llamas with DeepSeek-V3's expert router (models/moe.py: sigmoid scores, a per-expert bias that only
chooses, experts chosen from the best `topk_group` of `n_group` groups, weights renormalised where
`norm_topk_prob` and scaled by `routed_scaling_factor`) and ungated shared experts of
`n_shared_experts` x `moe_intermediate_size`; the first `first_k_dense_replace` layers keep a dense
MLP of `intermediate_size`:

    glm4_moe     GLM-4.5 / 4.6 / 4.7 (and -Air): RoPE on the first `partial_rotary_factor` of each head
                 (half, where config.json says nothing), q/k/v biases (`attention_bias`) without o's,
                 per-head q/k RMSNorm where `use_qk_norm`
    solar_open   Upstage Solar Open: every layer sparse, full RoPE
    dots1        rednote dots.llm1: per-head q/k RMSNorm, optional sliding layers (`layer_types`)
    minimax_m2   MiniMax-M2: q/k RMSNorm over all heads at once, RoPE on `rotary_dim` dims of each head,
                 no groups or scaling, experts named as Mixtral's (w1 / w3 / w2)
    minimax_m3   MiniMax-M3's language model (alone, or inside MiniMaxM3SparseForConditionalGeneration): MiniMax-M2's
                 with Gemma's norms, q/k normed a head, gpt-oss's clamped SwiGLU in every MLP, an ungated shared
                 expert, routed_scaling_factor, dense layers by `mlp_layer_types`; its block-sparse attention
                 exact (every block picked) up to index_topk_blocks x index_block_size tokens, the context capped
                 there; the released names (block_sparse_moe) or transformers' own (mlp, 3-D experts)
    exaone_moe   LG K-EXAONE: per-head q/k RMSNorm, sliding layers with RoPE among global ones without
                 (as EXAONE 4.0's, but with norms before attention and MLP), dense layers by
                 `mlp_layer_types`
    sarvam_moe   Sarvam MoE (sarvam-30b) and BharatGen's Param2 MoE (param2moe): GLM-4.5 with per-head q/k
                 RMSNorm and full RoPE under Bailing's tensor names (q/k/v fused as
                 attention.query_key_value, attention.dense, query_layernorm / key_layernorm,
                 model.word_embeddings, mlp.gate.expert_bias); Ling 2.0 / Ring 2.0 (bailing_moe_v2): the same
                 with RoPE on half of each head, the shared expert's width its own
                 (moe_shared_expert_intermediate_size)
    minicpm5_moe OpenBMB MiniCPM5-MoE: gated attention (q_proj also writes a sigmoid gate per head on the
                 attention output), no q/k norms, dense layers by `mlp_layer_types`
    afmoe        Arcee's AFMoE (Trinity): per-head q/k RMSNorm, sliding layers with RoPE among global ones
                 without (as EXAONE 4.0's), norms before and after attention and MLP, the attention output
                 gated per head by its own gate_proj (sigmoid), embeddings scaled by sqrt(hidden) where
                 `mup_enabled`, the first `num_dense_layers` dense
    kolibri1     Aleph Alpha's Kolibri 1: EXAONE 4.0's layers (every 5th global, without RoPE), per-head q/k
                 RMSNorm, norms after attention and MLP too, experts chosen by logits plus the bias (their
                 weights the sigmoid of the logits), an ungated shared expert, every layer sparse
    deepseek_ocr2_text  DeepSeek-OCR 2's language model: DeepSeek-V2's router (V2Router: softmax, greedy or
                 group-limited, never renormalised) and ungated shared experts under Llama's multi-head attention
                 (RoPE on halves), dense layers by `mlp_layer_types`
    hy_v3        Tencent Hy V3: per-head q/k RMSNorm, no groups, the weights always renormalised and
                 scaled by `router_scaling_factor`, dense layers by `mlp_layer_types` (the first where
                 unwritten), its own tensor names (mlp.router.gate, mlp.expert_bias, mlp.shared_mlp)

GLM-4.5's and Hy V3's multi-token-prediction layers (stored after the last layer) are not loaded: they
only draft tokens."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import LLAMA_NAMES, CausalLM, LayerAttention, WeightMap, WeightSpec, local_rope_on_sliding, \
    weight_spec
from .config import (ConfigField, dense_layers, fields_with, layer_types, one_partial_rotary, refuse_unlike,
                     split_layer_rope, window_of)
from .layers import Flags
from .llama import LlamaConfig
from .moe import MoESpec, moe_weight_map
from .olmo2 import ExaoneLayers

NAMES = dict(router="mlp.gate", expert="mlp.experts.{j}", gate="gate_proj", up="up_proj", down="down_proj",
             shared="mlp.shared_experts", choice_bias="mlp.gate.e_score_correction_bias")
FULL_ROTARY = ConfigField("partial_rotary_factor", ("partial_rotary_factor",), default=1.0)   # GLM-4.5's is half
ROUTED_FIELDS = (
    ConfigField("num_experts", ("n_routed_experts", "num_experts", "num_local_experts")),
    ConfigField("top_k", ("num_experts_per_tok",)),
    ConfigField("moe_intermediate_size", ("moe_intermediate_size",)),
    ConfigField("shared_experts", ("n_shared_experts", "num_shared_experts"), default=0),
    ConfigField("groups", ("n_group",), default=1),
    ConfigField("top_groups", ("topk_group",), default=1),
    ConfigField("routed_scale", ("routed_scaling_factor",), default=1.0),
    ConfigField("norm_topk_prob", ("norm_topk_prob",), default=True),
    ConfigField("first_dense", ("first_k_dense_replace",), default=0),
    ConfigField("use_qk_norm", ("use_qk_norm",), default=False),
)


MLP_LAYER_TYPES = ConfigField("mlp_layer_types", ("mlp_layer_types",), default=None)


@dataclass(frozen=True)
class Glm4MoeConfig(LlamaConfig):
    num_experts: int = 0
    top_k: int = 1
    moe_intermediate_size: int = 0
    shared_experts: int = 0
    groups: int = 1
    top_groups: int = 1
    routed_scale: float = 1.0
    norm_topk_prob: bool = True
    first_dense: int = 0
    use_qk_norm: bool = False

    ARCH: ClassVar[str] = "glm4_moe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        LlamaConfig.FIELDS, ConfigField("partial_rotary_factor", ("partial_rotary_factor",), default=0.5),
        *ROUTED_FIELDS)

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, qk_norm=self.use_qk_norm)

    def layer_moe(self, layer: int) -> MoESpec | None:
        return None if layer < self.first_dense else self.routed()

    def routed(self) -> MoESpec:
        """A sparse layer's experts and router."""
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, self.norm_topk_prob,
                       self.moe_intermediate_size * self.shared_experts, shared_gated=False, scoring="sigmoid",
                       choice_bias=True, groups=self.groups, top_groups=self.top_groups,
                       routed_scale=self.routed_scale)


@dataclass(frozen=True)
class SolarOpenConfig(Glm4MoeConfig):
    ARCH: ClassVar[str] = "solar_open"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        Glm4MoeConfig.FIELDS, FULL_ROTARY,
        ConfigField("intermediate_size", ("intermediate_size", "moe_intermediate_size")))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        return super().adapt(dict(values, first_dense=0, use_qk_norm=False), hf, notes)

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias)


@dataclass(frozen=True)
class Dots1Config(Glm4MoeConfig):
    ARCH: ClassVar[str] = "dots1"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        Glm4MoeConfig.FIELDS, FULL_ROTARY,
        ConfigField("norm_topk_prob", ("norm_topk_prob",), default=False))

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, qk_norm=True)


@dataclass(frozen=True)
class MiniMaxM2Config(Glm4MoeConfig):
    ARCH: ClassVar[str] = "minimax_m2"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        Glm4MoeConfig.FIELDS, FULL_ROTARY,
        ConfigField("moe_intermediate_size", ("moe_intermediate_size", "intermediate_size")))

    @classmethod
    def from_hf(cls, hf: dict) -> "MiniMaxM2Config":
        rotary, head_dim = hf.get("rotary_dim"), hf.get("head_dim")
        if rotary and head_dim and "partial_rotary_factor" not in (hf.get("rope_parameters") or hf):
            hf = {**hf, "partial_rotary_factor": rotary / head_dim}     # released checkpoints' legacy field
        return super().from_hf(hf)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("use_routing_bias") is False:
            raise ValueError("MiniMax-M2 with use_routing_bias false is not supported (transformers always adds "
                             "e_score_correction_bias); fix config.json")
        refuse_unlike(hf, (("qk_norm_type", cls.QK_NORM_TYPE),), cls.ARCH)
        return super().adapt(dict(values, **cls.FIXED), hf, notes)

    FIXED: ClassVar[dict] = dict(first_dense=0, groups=1, top_groups=1, routed_scale=1.0, norm_topk_prob=True)
    QK_NORM_TYPE: ClassVar[str] = "per_layer"      # q / k normed over all heads at once (M3's: a head)

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, qk_norm=True, qk_norm_heads=False)


@dataclass(frozen=True)
class DenseByType:
    """The dense layers as config.json's `mlp_layer_types` lists them ("dense" | "sparse" each), else the
    first `first_dense` (K-EXAONE, MiniCPM5-MoE, Hy V3, GLM-4.7-Flash: a mixin first among its bases; FIELDS
    must add MLP_LAYER_TYPES)."""

    dense_layers: tuple[int, ...] = ()

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        values = dict(values, dense_layers=dense_layers(values.pop("mlp_layer_types"), n, values["first_dense"]))
        return super().adapt(values, hf, notes)

    def layer_moe(self, layer: int) -> MoESpec | None:
        return None if layer in self.dense_layers else self.routed()


@dataclass(frozen=True)
class V2Router:
    """DeepSeek-V2's router (a mixin first among its bases): softmax scores, the top `num_experts_per_tok` taken
    greedily or, where `topk_method` is group_limited_greedy, from the best `topk_group` of `n_group` groups by their
    best expert; never renormalised, times `routed_scaling_factor`; ungated shared experts."""

    group_limited: bool = False             # topk_method group_limited_greedy

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        method = hf.get("topk_method") or "greedy"
        if method not in ("greedy", "group_limited_greedy"):
            raise ValueError(f"{cls.ARCH} topk_method {method!r} is not supported (greedy, group_limited_greedy)")
        limited = method == "group_limited_greedy"
        values = dict(values, group_limited=limited)
        if not limited:
            values.update(groups=1, top_groups=1)
        return super().adapt(values, hf, notes)

    def routed(self) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, False,
                       self.moe_intermediate_size * self.shared_experts, shared_gated=False, groups=self.groups,
                       top_groups=self.top_groups, group_score="max", routed_scale=self.routed_scale)


@dataclass(frozen=True)
class DeepseekOcr2TextConfig(V2Router, DenseByType, Glm4MoeConfig):
    """DeepSeek-OCR 2's language model (transformers' deepseek_ocr2_text): DeepSeek-V2's experts and router under
    Llama's multi-head attention (RoPE on halves, q/k/v/o biased where `attention_bias`), dense layers by
    `mlp_layer_types`."""

    ARCH: ClassVar[str] = "deepseek_ocr2_text"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*fields_with(Glm4MoeConfig.FIELDS, FULL_ROTARY), MLP_LAYER_TYPES)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        # its class has no norm_topk_prob, no q/k norms (transformers' config drops the V2 fields it does not use)
        return super().adapt(dict(values, norm_topk_prob=False, use_qk_norm=False), hf, notes)

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias)


@dataclass(frozen=True)
class DeepseekMoeConfig(DeepseekOcr2TextConfig):
    """DeepSeek-MoE (deepseek: deepseek-moe-16b, its own code's DeepseekForCausalLM): DeepSeek-OCR 2's language model,
    which took its layers (Llama's multi-head attention, softmax routing over fine-grained experts taken greedily,
    ungated shared experts, the first first_k_dense_replace layers dense), without a routed scale."""

    ARCH: ClassVar[str] = "deepseek"

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        refuse_unlike(hf, (("norm_topk_prob", False), ("moe_layer_freq", 1), ("scoring_func", "softmax")), cls.ARCH)
        return super().adapt(dict(values, routed_scale=1.0), hf, notes)     # its code scales the routed weights never


@dataclass(frozen=True)
class MiniMaxM3Config(DenseByType, MiniMaxM2Config):
    """MiniMax-M3's language model (transformers' minimax_m3_vl_text): MiniMax-M2's with Gemma's norms (x * (1 + w))
    everywhere, q/k normed a head, gpt-oss's clamped SwiGLU in every MLP (experts, the ungated shared expert of
    shared_intermediate_size, the dense layers' of dense_intermediate_size), routed_scaling_factor, dense layers by
    `mlp_layer_types` (or the released moe_layer_freq). Its sparse layers attend to the index_topk_blocks blocks of
    index_block_size keys its lightning indexer picks (and the local one): every key while there are at most that
    many, so the context is capped there (as DeepSeek-V3.2's) and the indexer's tensors left unread."""

    shared_width: int = 3072
    swiglu: tuple[float, float] = (1.702, 7.0)        # (alpha, limit)
    released: bool = False                  # the released checkpoints' tensor names (MiniMaxM3Sparse* classes),
                                            # else transformers' own (weight_map)

    ARCH: ClassVar[str] = "minimax_m3"
    FIXED: ClassVar[dict] = dict(groups=1, top_groups=1, norm_topk_prob=True)
    QK_NORM_TYPE: ClassVar[str] = "per_head"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(MiniMaxM2Config.FIELDS,
                     ConfigField("intermediate_size", ("dense_intermediate_size",), default=12288),
                     ConfigField("moe_intermediate_size", ("intermediate_size",)),
                     ConfigField("shared_width", ("shared_intermediate_size",), default=3072),
                     ConfigField("routed_scale", ("routed_scaling_factor",), default=2.0),
                     ConfigField("first_dense", ("first_k_dense_replace",), default=0)),
        MLP_LAYER_TYPES)

    @classmethod
    def from_hf(cls, hf: dict) -> "MiniMaxM3Config":
        return super(MiniMaxM2Config, cls).from_hf(hf)     # RoPE's share: partial_rotary_factor, as transformers'
                                                            # M3 reads it (rotary_dim unread; the released agree)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        # (use_routing_bias false: MiniMax-M2's adapt refuses it)
        refuse_unlike(hf, (("use_gemma_norm", True), ("attention_output_gate", False)), cls.ARCH)
        sparse = hf.get("sparse_attention_config") or {}
        if values["mlp_layer_types"] is None and hf.get("moe_layer_freq") is not None:
            values = dict(values, mlp_layer_types=["sparse" if f else "dense" for f in hf["moe_layer_freq"]])
        kinds = hf.get("layer_types") or (["minimax_m3_sparse" if f else "full_attention"
                                           for f in sparse.get("sparse_attention_freq") or []])
        if "minimax_m3_sparse" in kinds:
            blocks = int(hf.get("index_topk_blocks", sparse.get("sparse_topk_blocks", 16)))
            keys = blocks * int(hf.get("index_block_size", sparse.get("sparse_block_size", 128)))
            if values["context_window_size"] > keys:
                notes.append(f"context window capped at {keys} tokens (index_topk_blocks x index_block_size): within "
                             "it, the sparse layers' indexer picks every key block (full attention); past it is not "
                             "supported yet")
                values["context_window_size"] = keys
        swiglu = (float(hf.get("swiglu_alpha", 1.702)), float(hf.get("swiglu_limit", 7.0)))
        released = bool(set(hf.get("architectures") or []) & {"MiniMaxM3SparseForConditionalGeneration",
                                                               "MiniMaxM3SparseForCausalLM"})
        return super().adapt(dict(values, swiglu=swiglu, layer_types=None, released=released), hf, notes)

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, qk_norm=True, norm="rms_1p", clamped_glu=self.swiglu)

    def routed(self) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, True, self.shared_width,
                       shared_gated=False, scoring="sigmoid", choice_bias=True, routed_scale=self.routed_scale,
                       clamped_glu=self.swiglu)


@dataclass(frozen=True)
class ExaoneMoeConfig(DenseByType, ExaoneLayers, Glm4MoeConfig):
    ARCH: ClassVar[str] = "exaone_moe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(Glm4MoeConfig.FIELDS, ConfigField("first_dense", ("first_k_dense_replace",), default=1),
                     FULL_ROTARY,
                     ConfigField("routed_scale", ("routed_scaling_factor",), default=2.5)),
        MLP_LAYER_TYPES)

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, qk_norm=True)


@dataclass(frozen=True)
class SarvamMoeConfig(Glm4MoeConfig):
    shared_width: int | None = None         # moe_shared_expert_intermediate_size (Bailing's); else the experts'
    expert_bias: bool = True                # moe_router_enable_expert_bias: the router's choice bias

    ARCH: ClassVar[str] = "sarvam_moe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        Glm4MoeConfig.FIELDS, FULL_ROTARY,
        ConfigField("use_qk_norm", ("use_qk_norm",), default=True),
        ConfigField("routed_scale", ("routed_scaling_factor",), default=2.5),
        ConfigField("first_dense", ("first_k_dense_replace",), default=1),
        ConfigField("shared_experts", ("n_shared_experts", "num_shared_experts"), default=1),
        ConfigField("attention_bias", ("attention_bias", "use_qkv_bias"), default=False),
        ConfigField("rope_theta", ("rope_theta",), default=8000000.0),
        ConfigField("shared_width", ("moe_shared_expert_intermediate_size",), default=None),
        ConfigField("expert_bias", ("moe_router_enable_expert_bias",), default=True))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        """Bailing's own config keys where its code reads them: experts scored by sigmoid only, no sliding window,
        no biases but q/k/v's."""
        refuse_unlike(hf, (("score_function", "sigmoid"), ("use_sliding_window", False), ("use_bias", False)), cls.ARCH)
        return super().adapt(values, hf, notes)

    def routed(self) -> MoESpec:
        shared = self.moe_intermediate_size * self.shared_experts if self.shared_width is None else self.shared_width
        return dataclasses.replace(super().routed(), shared_intermediate_size=shared if self.shared_experts else 0,
                                   choice_bias=self.expert_bias)


@dataclass(frozen=True)
class BailingMoeV2Config(SarvamMoeConfig):
    """inclusionAI's Ling 2.0 / Ring 2.0 (BailingMoeV2ForCausalLM, their own code): Sarvam MoE's layers and names
    (llama.cpp converts Sarvam as a BailingMoeV2 with full rotary), RoPE on half of each head by default."""

    ARCH: ClassVar[str] = "bailing_moe_v2"
    STAND_IN: ClassVar[tuple[str, str]] = ("sarvam_moe", "SarvamMoEForCausalLM")   # transformers' class that runs it
                                                                                 # (compiler/golden.py's reference)
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        SarvamMoeConfig.FIELDS, ConfigField("partial_rotary_factor", ("partial_rotary_factor",), default=0.5),
        ConfigField("rope_theta", ("rope_theta",), default=600000.0))


@dataclass(frozen=True)
class Param2MoeConfig(SarvamMoeConfig):
    ARCH: ClassVar[str] = "param2moe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        SarvamMoeConfig.FIELDS, ConfigField("shared_experts", ("n_shared_experts", "num_shared_experts"), default=2),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("rope_theta", ("rope_theta",), default=500000.0))


@dataclass(frozen=True)
class MiniCPM5MoeConfig(DenseByType, Glm4MoeConfig):
    ARCH: ClassVar[str] = "minicpm5_moe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(Glm4MoeConfig.FIELDS, FULL_ROTARY,
                     ConfigField("routed_scale", ("routed_scaling_factor",), default=3.66),
                     ConfigField("first_dense", ("first_k_dense_replace",), default=1),
                     ConfigField("shared_experts", ("n_shared_experts",), default=1),
                     ConfigField("rope_theta", ("rope_theta",), default=5000000.0)),
        MLP_LAYER_TYPES)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("use_gated_attention") is False:
            raise ValueError("minicpm5_moe with use_gated_attention false is not supported (transformers refuses it "
                             "too); fix config.json")
        return super().adapt(dict(values, use_qk_norm=False), hf, notes)

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, attn_output_gate=True)


@dataclass(frozen=True)
class AfmoeConfig(ExaoneLayers, Glm4MoeConfig):
    mup: bool = False

    ARCH: ClassVar[str] = "afmoe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(Glm4MoeConfig.FIELDS, FULL_ROTARY,
                     ConfigField("routed_scale", ("route_scale", "routed_scaling_factor"), default=1.0),
                     ConfigField("first_dense", ("num_dense_layers", "first_k_dense_replace"), default=1),
                     ConfigField("shared_experts", ("num_shared_experts", "n_shared_experts"), default=2)),
        ConfigField("mup", ("mup_enabled",), default=False))

    @classmethod
    def from_hf(cls, hf: dict) -> "AfmoeConfig":      # every n-th layer global where layer_types lists none
        every = hf.get("global_attn_every_n_layers") or 4
        return super().from_hf({"sliding_window": 1024, **hf, "sliding_window_pattern": every})

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if values["attention_bias"]:
            raise ValueError("afmoe with attention_bias is not supported (released checkpoints have none); fix "
                             "config.json")
        return super().adapt(dict(values, use_qk_norm=True, groups=1, top_groups=1, norm_topk_prob=True), hf, notes)

    def flags(self) -> Flags:
        return Flags(qk_norm=True, sandwich_norms=True, attn_output_gate=True,
                     embed_scale=float(np.sqrt(self.hidden_size)) if self.mup else None)


@dataclass(frozen=True)
class Kolibri1Config(ExaoneLayers, Glm4MoeConfig):
    shared_intermediate_size: int = 0

    ARCH: ClassVar[str] = "kolibri1"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(Glm4MoeConfig.FIELDS, FULL_ROTARY,
                     ConfigField("intermediate_size", ("intermediate_size", "moe_intermediate_size")),
                     ConfigField("norm_topk_prob", ("norm_topk_prob",), default=False)),
        ConfigField("shared_intermediate_size", ("shared_expert_intermediate_size",), default=0))

    @classmethod
    def from_hf(cls, hf: dict) -> "Kolibri1Config":    # every 5th layer global where layer_types lists none
        return super().from_hf({"sliding_window": 513, **hf, "sliding_window_pattern": 5})

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        return super().adapt(dict(values, first_dense=0, use_qk_norm=True), hf, notes)

    def flags(self) -> Flags:
        return Flags(qk_norm=True, sandwich_norms=True)

    def routed(self) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, self.norm_topk_prob,
                       self.shared_intermediate_size, shared_gated=False, scoring="sigmoid", choice_bias=True,
                       choice_from="logits")


@dataclass(frozen=True)
class HyV3Config(DenseByType, Glm4MoeConfig):
    ARCH: ClassVar[str] = "hy_v3"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(Glm4MoeConfig.FIELDS, FULL_ROTARY,
                     ConfigField("routed_scale", ("router_scaling_factor", "routed_scaling_factor"), default=2.826),
                     ConfigField("first_dense", ("first_k_dense_replace",), default=1),   # where mlp_layer_types is not
                     ConfigField("rope_theta", ("rope_theta",), default=11158840.0)),
        MLP_LAYER_TYPES)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        return super().adapt(dict(values, groups=1, top_groups=1, norm_topk_prob=True), hf, notes)

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, qk_norm=True)


@dataclass(frozen=True)
class MiMoV2FlashConfig(DenseByType, Glm4MoeConfig):
    """Xiaomi's MiMo-V2-Flash: sliding layers (with attention sinks and twice the KV heads) among full ones (the first
    and every sixth where `layer_types` lists none), each kind its own RoPE base on the first partial_rotary_factor of
    each head (RoPE in the graph); keys of head_dim, values of v_head_dim, scaled by attention_value_scale (0.707
    where unwritten: folded into v_proj); DeepSeek-V3's router without shared experts after `mlp_layer_types`' dense
    layers. Its layers' KV shapes differ, so it runs over the KV cache kiln owns, the values padded to the keys'
    dims there."""

    v_head_dim: int = 0
    value_scale: float = 1.0
    local_rope_theta: float = 10000.0

    ARCH: ClassVar[str] = "mimo_v2_flash"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(Glm4MoeConfig.FIELDS, FULL_ROTARY,
                     ConfigField("num_experts", ("n_routed_experts", "num_local_experts")),
                     ConfigField("first_dense", ("first_k_dense_replace",), default=1),
                     ConfigField("sliding_window", ("sliding_window",), default=129)),
        MLP_LAYER_TYPES, ConfigField("v_head_dim", ("v_head_dim",)),
        ConfigField("value_scale", ("attention_value_scale",), default=0.707),
        ConfigField("local_rope_theta", ("rope_local_base_freq",), default=10000.0))

    @classmethod
    def from_hf(cls, hf: dict) -> "MiMoV2FlashConfig":
        """transformers' config, or the released one (its own code's): the window past the query itself
        (sliding_window_size), the layer kinds as hybrid_layer_pattern (1: sliding), the sliding layers' shapes as
        swa_* (transformers fixes them: twice the KV heads, the same head sizes, which kiln checks), no
        rope_parameters (transformers' defaults: 5e6 on full layers, 1e4 on sliding ones, a third of each head)."""
        if hf.get("sliding_window_size") is not None:
            hf = {**hf, "sliding_window": hf["sliding_window_size"] + 1}
        if not hf.get("layer_types") and hf.get("hybrid_layer_pattern"):
            hf = {**hf, "layer_types": ["sliding_attention" if p == 1 else "full_attention"
                                        for p in hf["hybrid_layer_pattern"]]}
        kv = hf.get("num_key_value_heads")
        for key, want in (("swa_num_key_value_heads", 2 * kv if kv else None), ("swa_head_dim", hf.get("head_dim")),
                          ("swa_v_head_dim", hf.get("v_head_dim")), ("swa_num_attention_heads",
                                                                     hf.get("num_attention_heads"))):
            if hf.get(key) is not None and want is not None and hf[key] != want:
                raise ValueError(f"mimo_v2_flash with {key} {hf[key]} is not supported (transformers runs {want}: "
                                 "its sliding layers hold twice the full layers' KV heads of the same sizes); fix "
                                 "config.json")
        if hf.get("rope_parameters") is None:
            hf = {**hf, "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.334},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.334}}}
        hf = split_layer_rope(one_partial_rotary(hf, cls.ARCH), full_theta=5000000.0, local_theta=10000.0)
        return super().from_hf(hf)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        refuse_unlike(hf, (("attention_bias", False),), cls.ARCH)
        n, window = values["num_hidden_layers"], window_of(values)
        types = values["layer_types"] or ["full_attention" if i == 0 or not (i + 1) % 6 else "sliding_attention"
                                          for i in range(n)]
        if not 0 < values["v_head_dim"] <= values["head_dim"]:
            raise ValueError(f"v_head_dim {values['v_head_dim']} must be from 1 to head_dim ({values['head_dim']}); "
                             "fix config.json")
        values = dict(values, value_scale=values["value_scale"] if values["value_scale"] is not None else 1.0,
                      routed_scale=values["routed_scale"] if values["routed_scale"] is not None else 1.0)
        # Llama's adapt drops the layer kinds where nothing slides; here they also say which layers hold what
        return dict(super().adapt(values, hf, notes), layer_types=layer_types(types, n, hf, pattern=6),
                    sliding_window=window)

    def flags(self) -> Flags:
        return Flags(v_head_dim=self.v_head_dim if self.v_head_dim < self.head_dim else None)

    def layer_flags(self, layer: int) -> Flags:
        return dataclasses.replace(self.flags(), attn_sinks=self.layer_types[layer] == "sliding_attention")

    def layer_kv_heads(self, layer: int) -> int:
        return self.num_key_value_heads * (2 if self.layer_types[layer] == "sliding_attention" else 1)

    def kv_layers(self):
        n = self.num_hidden_layers
        return tuple((self.layer_kv_heads(i), self.head_dim) for i in range(n)), tuple(range(n))

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return local_rope_on_sliding(self)


Glm4MoeForCausalLM = SolarOpenForCausalLM = Dots1ForCausalLM = MiniMaxM2ForCausalLM = ExaoneMoeForCausalLM = CausalLM
MiniMaxM3ForCausalLM = CausalLM
HyV3ForCausalLM = SarvamMoeForCausalLM = Param2MoeForCausalLM = MiniCPM5MoeForCausalLM = AfmoeForCausalLM = CausalLM
BailingMoeV2ForCausalLM = CausalLM
Kolibri1ForCausalLM = MiMoV2FlashForCausalLM = DeepseekOcr2TextForCausalLM = CausalLM

_OWN_NAMES = {
    "minimax_m2": dict(router="block_sparse_moe.gate", expert="block_sparse_moe.experts.{j}", gate="w1", up="w3",
                       down="w2", choice_bias="block_sparse_moe.e_score_correction_bias"),
    "minimax_m3": dict(router="block_sparse_moe.gate", expert="block_sparse_moe.experts.{j}", gate="w1", up="w3",
                       down="w2", shared="block_sparse_moe.shared_experts",
                       shared_proj=("gate_proj", "up_proj", "down_proj"),
                       choice_bias="block_sparse_moe.e_score_correction_bias"),
    "exaone_moe": dict(NAMES, choice_bias="mlp.e_score_correction_bias"),
    "hy_v3": dict(NAMES, router="mlp.router.gate", shared="mlp.shared_mlp", choice_bias="mlp.expert_bias"),
    "afmoe": dict(NAMES, router="mlp.router.gate", choice_bias="mlp.expert_bias"),
    "kolibri1": dict(NAMES, choice_bias="moe.router.expert_bias"),
}
# AFMoE's norms: its post_attention_layernorm follows attention (kiln's post_attn_norm); pre_mlp_layernorm
# comes before the MLP (kiln's post_attention_layernorm)
AFMOE_NAMES = dict(LLAMA_NAMES, post_attention_layernorm="pre_mlp_layernorm", post_attn_norm="post_attention_layernorm",
                   post_mlp_norm="post_mlp_layernorm")


# Bailing's names (Sarvam MoE, Param2 MoE): the decoder's, then the router's choice bias.
BAILING_NAMES = dict(LLAMA_NAMES, embed_tokens="model.word_embeddings", o_proj="attention.dense",
                     q_norm="attention.query_layernorm", k_norm="attention.key_layernorm")
BAILING_QKV = "attention.query_key_value"


def gates_after_queries(h: int, d: int):
    """Rows [q (h heads x d) | gate (h x d) | k | v] -> [each head's q, then its gate | k | v] (the
    layout Flags.attn_output_gate reads)."""
    per_head = np.arange(2 * h * d).reshape(2, h, d).transpose(1, 0, 2).reshape(-1)
    return lambda rows: np.concatenate([rows[per_head], rows[2 * h * d:]])


def weight_map(c: Glm4MoeConfig) -> WeightMap:
    if isinstance(c, AfmoeConfig):              # the gate rows, from their own Linear, beside each head's q
        m = moe_weight_map(c, _OWN_NAMES["afmoe"], AFMOE_NAMES)
        for i in range(c.num_hidden_layers):
            key = f"model.layers.{i}.self_attn.qkv_proj.weight"
            q, k, v = weight_spec(m[key]).hf_names
            m[key] = WeightSpec((q, f"model.layers.{i}.self_attn.gate_proj.weight", k, v),
                                gates_after_queries(c.num_attention_heads, c.head_dim))
        return m
    if isinstance(c, Kolibri1Config):           # its norm after the MLP: post_ffn_norm
        return moe_weight_map(c, _OWN_NAMES["kolibri1"], dict(LLAMA_NAMES, post_mlp_norm="post_ffn_norm"))
    if isinstance(c, MiniMaxM3Config):
        return _minimax_m3_weight_map(c)
    if isinstance(c, MiMoV2FlashConfig):
        return _mimo_v2_flash_weight_map(c)
    if not isinstance(c, SarvamMoeConfig):
        return moe_weight_map(c, _OWN_NAMES.get(c.ARCH, NAMES))
    m = moe_weight_map(c, dict(NAMES, choice_bias="mlp.gate.expert_bias"), BAILING_NAMES)
    for i in range(c.num_hidden_layers):           # q, k and v stored as one tensor, rows [q | k | v]
        for p in ("weight", "bias") if c.attention_bias else ("weight",):
            m[f"model.layers.{i}.self_attn.qkv_proj.{p}"] = [f"model.layers.{i}.{BAILING_QKV}.{p}"]
    return m


def _mimo_v2_flash_weight_map(c: MiMoV2FlashConfig) -> WeightMap:
    """DeepSeek-V3's names; each layer's q / k / v rows (its KV heads) with the values scaled, the sliding layers'
    sinks."""
    m = moe_weight_map(c, NAMES)
    for i in range(c.num_hidden_layers):
        k = f"model.layers.{i}.self_attn"
        keys = (c.num_attention_heads + c.layer_kv_heads(i)) * c.head_dim        # q's and k's rows, then v's

        def scaled(rows, keys=keys):
            return np.concatenate([rows[:keys], rows[keys:] * np.float32(c.value_scale)])
        m[f"{k}.qkv_proj.weight"] = WeightSpec(weight_spec(m[f"{k}.qkv_proj.weight"]).hf_names, scaled)
        if c.layer_types[i] == "sliding_attention":
            m[f"{k}.sinks"] = [f"{k}.attention_sink_bias"]
    return m


def _minimax_m3_weight_map(c: MiniMaxM3Config) -> WeightMap:
    """The released names (MiniMaxM3Sparse*: block_sparse_moe, experts' w1 / w3 / w2, a shared expert's and the dense
    MLPs' gate / up / down_proj), or transformers' own (its MiniMaxM3VLForCausalLM saves them: mlp, 3-D experts, the
    shared expert's and dense MLPs' gate_up_proj fused)."""
    if c.released:
        return moe_weight_map(c, _OWN_NAMES["minimax_m3"])
    m = moe_weight_map(c, dict(NAMES, fused="mlp.experts"))
    for i in range(c.num_hidden_layers):
        k = f"model.layers.{i}.mlp"
        mlp = f"{k}.shared" if c.layer_moe(i) else k
        m[f"{mlp}.gate_up_proj.weight"] = [f"{k}.shared_experts.gate_up_proj.weight" if c.layer_moe(i)
                                           else f"{k}.gate_up_proj.weight"]
    return m
