"""Reflection AI's Beam (beam: Beam-1.0-501B-A23B): DeepSeek-V3's grouped sigmoid router over experts without a
shared one after `mlp_layer_types`' dense layers (three where unwritten), on layers that

- attend per `layer_types`: sliding ones (`sliding_window`) with RoPE, full ones (every sixth and the last where
  unwritten) without it, their queries scaled by position, (1 + (p + 1) / 2048) ** 0.1 (scalable softmax);
- norm q and k a head (RMSNorm), and gate the attention output by sigmoid(gate_proj(x) + gate_bias) (a bias a head);
- norm before and after attention and MLP (Gemma's four norms, plain RMSNorm weights), then add each branch to the
  residual scaled by depth: layer i's attention add is branch / sqrt(n) + x * sqrt((n - 1) / n) with n = 2 (i + 1),
  its MLP's the same with n + 1;
- soft-cap the logits (`final_logit_softcapping`).

Experts are stored one by one (mlp.experts.{j}.gate_proj / up_proj / down_proj), as transformers saves them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import CausalLM, LayerAttention, WeightMap, WeightSpec, rope_on_sliding_only, weight_spec
from .config import ConfigField, fields_with, layer_types, refuse_unlike, window_of
from .gemma import NAMES as GEMMA_NAMES
from .glm4_moe import FULL_ROTARY, MLP_LAYER_TYPES, NAMES, DenseByType, Glm4MoeConfig, gates_after_queries
from .layers import Flags
from .moe import moe_weight_map

SSMAX = (0.1, 2048, 1, "power")         # Flags.attn_temperature of the layers without RoPE (compute_attention_scaling)


def sliding_rope(hf: dict, arch: str) -> dict:
    """config.json with RoPE per layer type (rope_parameters: the sliding layers' own, none on the full ones, as
    transformers writes Beam's and Ergo's) as the sliding layers' RoPE; the full layers' must be none."""
    params = hf.get("rope_parameters")
    if not (isinstance(params, dict) and ("sliding_attention" in params or "full_attention" in params)):
        return hf
    if params.get("full_attention") is not None:
        raise ValueError(f"{arch} with RoPE on its full_attention layers (rope_parameters.full_attention) is not "
                         "supported (released checkpoints give them none); fix config.json")
    return {**hf, "rope_parameters": params.get("sliding_attention") or {"rope_theta": 10000.0}}


@dataclass(frozen=True)
class BeamConfig(DenseByType, Glm4MoeConfig):
    final_logit_softcapping: float | None = 30.0

    ARCH: ClassVar[str] = "beam"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(Glm4MoeConfig.FIELDS, FULL_ROTARY,
                     ConfigField("groups", ("n_group",), default=8),
                     ConfigField("top_groups", ("topk_group",), default=4),
                     ConfigField("routed_scale", ("routed_scaling_factor",), default=2.5),
                     ConfigField("first_dense", ("first_k_dense_replace",), default=3),
                     ConfigField("sliding_window", ("sliding_window",), default=512)),
        MLP_LAYER_TYPES,
        ConfigField("final_logit_softcapping", ("final_logit_softcapping",), default=30.0))

    @classmethod
    def from_hf(cls, hf: dict) -> "BeamConfig":
        return super().from_hf(sliding_rope(hf, cls.ARCH))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        refuse_unlike(hf, (("hidden_act", "silu"), ("attention_bias", False)), cls.ARCH)
        n = values["num_hidden_layers"]
        types = values["layer_types"]
        if not types:                       # transformers' default: every sixth layer full, and the last
            types = ["full_attention" if (i + 1) % 6 == 0 or i == n - 1 else "sliding_attention" for i in range(n)]
        window = window_of(values)
        values = dict(values, groups=values["groups"] or 1, top_groups=values["top_groups"] or 1, use_qk_norm=True,
                      shared_experts=0)
        # Llama's adapt drops the layer kinds where nothing slides; here they also say which layers rotate
        return dict(super().adapt(values, hf, notes), layer_types=layer_types(types, n, hf, pattern=6),
                    sliding_window=window)

    def flags(self) -> Flags:
        return Flags(qk_norm=True, sandwich_norms=True, attn_output_gate=True, attn_gate_bias=True,
                     final_logit_softcap=self.final_logit_softcapping)

    def layer_flags(self, layer: int) -> Flags:
        n = 2 * (layer + 1)
        mix = (n ** -0.5, ((n - 1) / n) ** 0.5, (n + 1) ** -0.5, (n / (n + 1)) ** 0.5)
        full = self.layer_types[layer] == "full_attention"
        return dataclasses.replace(self.flags(), residual_mix=mix, attn_temperature=SSMAX if full else None)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return rope_on_sliding_only(self)


BeamForCausalLM = CausalLM


def weight_map(c: BeamConfig) -> WeightMap:
    m = moe_weight_map(c, NAMES, GEMMA_NAMES)
    for i in range(c.num_hidden_layers):    # the gate rows, from their own Linear, beside each head's q
        attn = f"model.layers.{i}.self_attn"
        q, k, v = weight_spec(m[f"{attn}.qkv_proj.weight"]).hf_names
        m[f"{attn}.qkv_proj.weight"] = WeightSpec((q, f"{attn}.gate_proj.weight", k, v),
                                                  gates_after_queries(c.num_attention_heads, c.head_dim))
        m[f"{attn}.gate_bias"] = [f"{attn}.gate_bias"]
    return m
