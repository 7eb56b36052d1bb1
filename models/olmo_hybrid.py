"""OLMo Hybrid (AI2): gated DeltaNet layers among OLMo 3's full-attention ones, 3:1 by default (`layer_types`); Lara
4 Mini (LaraMiniConfig below) the same DeltaNet among Qwen3 attention layers, sliding and full, with experts.

    DeltaNet layer   Qwen3.5's (models/qwen3_5.py GatedDeltaNet, its state in a slot of the KV cache kiln owns)
                     with its projections stored apart: q_proj, k_proj and v_proj feed the conv as Qwen3.5's
                     in_proj_qkv, g_proj gates the output (in_proj_z), b_proj / a_proj; beta doubled where
                     linear_allow_neg_eigval (the state's eigenvalues then in [-1, 1]); the gated norm's epsilon
                     1e-5 (o_norm); pre-norms before the DeltaNet and the MLP
    attention layer  OLMo 2's: q and k RMSNormed over all heads at once, no pre-norms, each output normed before
                     its residual add; RoPE only where rope_parameters give a base (the released models: none)
    every layer      a SwiGLU MLP; norms RMSNorm (x * w); the head untied

A DeltaNet layer's state holds every token before it: forks only at a sequence's end (prefix-cache entries
continued whole, checkpoints where prompts part: runtime/scheduler.py), no speculation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np

from .causal_lm import DecoderConfig, LayerAttention, WeightMap, WeightSpec, decoder_weight_map, \
    rope_on_sliding_only
from .config import ConfigField, fields_with
from .layers import Flags
from .mamba2 import HybridLM, HybridStack, hybrid_weight_map
from .moe import EXPERT_FIELDS, MoESpec, moe_weight_map
from .olmo2 import NAMES
from .qwen3_5 import GatedDeltaNet, Qwen35Config


@dataclass(frozen=True)
class OlmoHybridConfig(Qwen35Config):
    neg_eigval: bool = True                 # beta doubled (linear_allow_neg_eigval)
    rope: bool = True                       # the attention layers rotate (rope_parameters has a base)

    ARCH: ClassVar[str] = "olmo_hybrid"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        Qwen35Config.FIELDS,                # the DeltaNet's sizes default from the attention's (adapt)
        *(ConfigField(name, (key,), default=None) for name, key in (
            ("linear_key_heads", "linear_num_key_heads"), ("linear_value_heads", "linear_num_value_heads"),
            ("linear_key_dim", "linear_key_head_dim"), ("linear_value_dim", "linear_value_head_dim"))),
        ConfigField("neg_eigval", ("linear_allow_neg_eigval",), default=True))

    @classmethod
    def from_hf(cls, hf: dict) -> "OlmoHybridConfig":
        params = hf.get("rope_parameters") or {}
        rope = params.get("rope_theta") is not None or hf.get("rope_theta") is not None
        partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
        return dataclasses.replace(super().from_hf({**hf, "partial_rotary_factor": partial}), rope=rope)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        """transformers' defaults: the DeltaNet's key and value heads the attention's, a key head 0.75 x hidden /
        key heads wide, a value head twice a key head."""
        hk = values["linear_key_heads"] or values["num_attention_heads"]
        dk = values["linear_key_dim"] or int(0.75 * values["hidden_size"] / hk)
        values = dict(values, linear_key_heads=hk, linear_value_heads=values["linear_value_heads"] or
                      values["num_attention_heads"], linear_key_dim=dk, linear_value_dim=values["linear_value_dim"]
                      or 2 * dk)
        return super().adapt(values, hf, notes)

    @property
    def mamba_layers(self) -> tuple[int, ...]:
        """The DeltaNet layers (HybridStack's recurrent ones)."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def delta_norm_eps(self) -> float:
        return 1e-5                         # o_norm's (the FLA library's gated norm default), not rms_norm_eps

    @property
    def delta_beta_scale(self) -> float:
        return 2.0 if self.neg_eigval else 1.0

    def flags(self) -> Flags:
        """The attention layers' (OLMo 2's); layer_flags gives the DeltaNet layers pre-norms."""
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, pre_norms=False, sandwich_norms=True,
                     qk_norm=True, qk_norm_heads=False)

    def layer_flags(self, layer: int) -> Flags:
        return self.flags() if layer not in self.mamba_layers else Flags()

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return (LayerAttention("full", None, self.rope_theta, self.rope_scaling, rope=self.rope),) * \
            self.num_hidden_layers


class OlmoHybridStack(HybridStack):
    MIXER: ClassVar[Callable] = GatedDeltaNet


class OlmoHybridForCausalLM(HybridLM):
    STACK: ClassVar[type] = OlmoHybridStack
    OWNED_ONLY: ClassVar[str] = "its DeltaNet layers keep a recurrent state a sequence"


def weight_map(c: OlmoHybridConfig) -> WeightMap:
    """OLMo 2's map (the attention layers'), each DeltaNet layer's swapped for its pre-norms and linear_attn; under
    the checkpoints' own names, which transformers renames at load: a DeltaNet layer's pre-norms
    attention_layer_norm and feedforward_layer_norm (an attention layer's post-attention norm too), its conv three
    (q_conv1d, k_conv1d, v_conv1d)."""
    m = hybrid_weight_map(c, decoder_weight_map(c, dict(NAMES, post_attn_norm="feedforward_layer_norm")),
                          "linear_attn", _delta_net_weights, ("self_attn", "post_attn_norm", "post_mlp_norm"))
    for i in c.mamba_layers:
        k = f"model.layers.{i}"
        for kiln, hf in (("input_layernorm", "attention_layer_norm"), ("post_attention_layernorm",
                                                                        "feedforward_layer_norm")):
            m[f"{k}.{kiln}.weight"] = [f"{k}.{hf}.weight"]
    return m


def _delta_net_weights(c: OlmoHybridConfig, s: str, a: str) -> WeightMap:
    """A DeltaNet layer's weights: kiln's mixer `s` (Qwen3.5's, q/k/v and their convs joined) from linear_attn `a`."""
    m: WeightMap = {f"{s}.in_proj_qkv.weight": [f"{a}.{x}_proj.weight" for x in "qkv"]}
    for kiln, hf in (("in_proj_z", "g_proj"), ("in_proj_b", "b_proj"), ("in_proj_a", "a_proj"),
                     ("out_proj", "o_proj")):
        m[f"{s}.{kiln}.weight"] = [f"{a}.{hf}.weight"]
    m[f"{s}.conv"] = WeightSpec(tuple(f"{a}.{x}_conv1d.weight" for x in "qkv"),
                                lambda w: np.ascontiguousarray(w.reshape(w.shape[0], -1)))
    for x in ("dt_bias", "A_log"):
        m[f"{s}.{x}"] = [f"{a}.{x}"]
    m[f"{s}.norm"] = [f"{a}.o_norm.weight"]
    return m


# -- Lara Mini ------------------------------------------------------------------------------------------------------

LARA_KINDS = ("linear_attention", "sliding_attention", "full_attention")


@dataclass(frozen=True)
class LaraMiniConfig(OlmoHybridConfig):
    """Translated's Lara 4 Mini (lara_mini): Qwen3.5's gated DeltaNet (its projections stored fused as one in_proj,
    rows [q | k | v | z | b | a], its gated norm out_norm) among Qwen3 attention layers (per-head q/k RMSNorm, no
    gate): sliding ones with RoPE, full ones without (`layer_types`, by default [linear, sliding, linear, full,
    sliding] repeated); plain RMSNorms (x * w); every layer's MLP experts chosen by a softmax over the router's
    float32 logits, renormalised where `norm_topk_prob`, with an ungated shared expert of
    shared_expert_intermediate_size; the head tied by default."""

    sliding_window: int | None = 512
    num_experts: int = 0
    top_k: int = 1
    moe_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    norm_topk_prob: bool = True

    ARCH: ClassVar[str] = "lara_mini"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        OlmoHybridConfig.FIELDS, ConfigField("intermediate_size", ("intermediate_size",), default=0),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("linear_key_heads", ("linear_num_key_heads",), default=8),
        ConfigField("linear_value_heads", ("linear_num_value_heads",), default=16),
        ConfigField("sliding_window", ("sliding_window",), default=512), *EXPERT_FIELDS,
        ConfigField("moe_intermediate_size", ("moe_intermediate_size",)),
        ConfigField("shared_intermediate_size", ("shared_expert_intermediate_size",), default=0),
        ConfigField("norm_topk_prob", ("norm_topk_prob",), default=True))

    @classmethod
    def from_hf(cls, hf: dict) -> "LaraMiniConfig":
        return DecoderConfig.from_hf.__func__(cls, hf)      # RoPE on whole heads (Qwen3's), not Qwen3.5's quarter

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        pattern = ("linear_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention")
        types = tuple(values["layer_types"] or (pattern[i % 5] for i in range(n)))
        if len(types) != n or set(types) - set(LARA_KINDS):
            raise ValueError(f"layer_types must list one of {', '.join(LARA_KINDS)} for each of the {n} layers; got "
                             f"{list(types)}; fix config.json")
        delta = dict(values, layer_types=tuple("full_attention" if t == "sliding_attention" else t for t in types))
        return dict(super().adapt(delta, hf, notes), layer_types=types, neg_eigval=False, rope=True)

    @property
    def delta_norm_eps(self) -> float:
        return self.norm_eps                # its gated norm's, rms_norm_eps (OLMo Hybrid's is fixed)

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, qk_norm=True)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return rope_on_sliding_only(self)

    def layer_moe(self, layer: int) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, self.norm_topk_prob,
                       self.shared_intermediate_size, shared_gated=False)


class LaraMiniForCausalLM(HybridLM):
    STACK: ClassVar[type] = OlmoHybridStack
    OWNED_ONLY: ClassVar[str] = "its DeltaNet layers keep a recurrent state a sequence"


def lara_weight_map(c: LaraMiniConfig) -> WeightMap:
    """Qwen MoE's names, the experts 3-D as stored (mlp.experts.gate_up_proj / down_proj), each DeltaNet layer's
    attention swapped for its mixer, split from the fused in_proj."""
    from .qwen_moe import NAMES as QWEN_MOE
    return hybrid_weight_map(c, moe_weight_map(c, dict(QWEN_MOE, fused="mlp.experts")), "linear_attn",
                             _lara_delta_weights)


def _lara_delta_weights(c: LaraMiniConfig, s: str, a: str) -> WeightMap:
    key, value, hv = c.linear_key_heads * c.linear_key_dim, c.linear_value_heads * c.linear_value_dim, \
        c.linear_value_heads
    edges = np.cumsum([0, 2 * key + value, value, hv, hv])

    def rows(i: int) -> WeightSpec:
        return WeightSpec((f"{a}.in_proj.weight",), lambda w: np.ascontiguousarray(w[edges[i]:edges[i + 1]]))
    m: WeightMap = {f"{s}.{name}.weight": rows(i) for i, name in enumerate(("in_proj_qkv", "in_proj_z", "in_proj_b",
                                                                              "in_proj_a"))}
    m[f"{s}.conv"] = WeightSpec((f"{a}.conv1d.weight",), lambda w: np.ascontiguousarray(w.reshape(w.shape[0], -1)))
    m.update({f"{s}.{x}": [f"{a}.{x}"] for x in ("dt_bias", "A_log")})
    m[f"{s}.norm"] = [f"{a}.out_norm.weight"]
    m[f"{s}.out_proj.weight"] = [f"{a}.out_proj.weight"]
    return m
