"""Muse Spark's language model (muse_spark_text, inside MuseSparkForConditionalGeneration): Muse Glimmer's layers
(models/muse_glimmer.py: the embeddings normed without a weight, weightless q/k norms with q scaled, the attention
output gated, full layers without RoPE among sliding ones with it, soft-capped logits) with:

    attention    each head's output RMS-normed without a weight before the gate (o_norm: Flags.attn_out_norm)
    residuals    x = alpha * x + beta * branch, beta = sigmoid(g / T), alpha = sqrt(max(sigmoid(-g / T) * (1 + beta),
                 1e-3)), g a value a hidden dim, T residual_gate_temperature (Flags.residual_gates: computed at load)
    post norms   after the attention without a weight; after the MLP x * (1 + w) normed (rms_scaled: 1 + w stored,
                 so no kernel adds the 1 before the norm's reduction)
    MoE          the router reads x (float32, its logits times output_multiplier: folded into its weight at load;
                 sigmoid scores, a choice bias, the k best weights normalised + 1e-15, times routed_scaling_factor);
                 the experts run at moe_hidden_size: x pooled down (pre_expert_proj) and RMS-normed (x * (1 + w)),
                 each chosen expert's output times (1 + w) then normed (one w for every expert), weighted and summed,
                 then unpooled (post_expert_proj); dense layers where mlp_layer_types says so
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor

from .causal_lm import CausalLM, DecoderStack, WeightMap, WeightSpec
from .config import ConfigField
from .layers import MLP, DecoderLayer, Flags, Norm
from .moe import EXPERT_FIELDS, MoESpec, SparseMoE, expert_rows
from .muse_glimmer import MuseGlimmerTextConfig
from .muse_glimmer import weight_map as glimmer_weight_map

GATE_EPS = 1e-3             # transformers' MuseSparkResidualGate's floor under alpha's square


@dataclass(frozen=True)
class MuseSparkTextConfig(MuseGlimmerTextConfig):
    num_experts: int = 256
    top_k: int = 8
    moe_intermediate_size: int = 4096
    moe_hidden_size: int = 4096
    routed_scaling_factor: float = 1.0
    residual_gate_temperature: float = 0.3
    sparse_layers: tuple[bool, ...] = ()

    ARCH: ClassVar[str] = "muse_spark_text"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *MuseGlimmerTextConfig.FIELDS, *EXPERT_FIELDS,
        ConfigField("moe_intermediate_size", ("moe_intermediate_size",), default=4096),
        ConfigField("moe_hidden_size", ("moe_hidden_size",), default=4096),
        ConfigField("routed_scaling_factor", ("routed_scaling_factor",), default=1.0),
        ConfigField("residual_gate_temperature", ("residual_gate_temperature",), default=0.3),
        ConfigField("sparse_layers", ("mlp_layer_types",), default=None))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n, kinds = values["num_hidden_layers"], values["sparse_layers"] or ["sparse"] * values["num_hidden_layers"]
        if len(kinds) != n or set(kinds) - {"dense", "sparse"}:
            raise ValueError(f"Muse Spark's mlp_layer_types must give 'dense' or 'sparse' for each of its {n} layers; "
                             "fix config.json")
        values = dict(values, sparse_layers=tuple(k == "sparse" for k in kinds))
        if any(values["sparse_layers"]):
            MoESpec(values["num_experts"], values["top_k"], values["moe_intermediate_size"], True)   # refuses a bad k
        return super().adapt(values, hf, notes)

    def flags(self) -> Flags:
        return dataclasses.replace(super().flags(), attn_out_norm=True, residual_gates=True,
                                   post_attn_norm_kind="rms_noparam", post_mlp_norm_kind="rms_scaled")

    def moe(self) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, normalize=True, scoring="sigmoid",
                       choice_bias=True, routed_scale=self.routed_scaling_factor, norm_eps=1e-15,
                       expert_norm_eps=self.post_norm_eps, expert_norm_shared=True)


class PooledMoE(nn.Module):
    """Muse Spark's MoE (the module docstring): the router on x, the experts at moe_hidden_size."""

    def __init__(self, c: MuseSparkTextConfig, flags: Flags):
        self.pre_expert_proj = nn.Linear(c.hidden_size, c.moe_hidden_size, bias=False)
        self.pre_expert_norm = Norm(c.moe_hidden_size, c.norm_eps, "rms_1p")
        self.experts = SparseMoE(c.moe_hidden_size, c.moe(), flags, router_size=c.hidden_size)
        self.post_expert_proj = nn.Linear(c.moe_hidden_size, c.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        pooled = self.pre_expert_norm(self.pre_expert_proj(x))
        return self.post_expert_proj(self.experts(pooled, route=x))


class MuseSparkStack(DecoderStack):
    def decoder_layer(self, c: MuseSparkTextConfig, i: int, flags: Flags, rope: tuple | None) -> nn.Module:
        mlp = PooledMoE(c, flags) if c.sparse_layers[i] else MLP(c.hidden_size, c.intermediate_size, flags)
        return DecoderLayer(c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                            c.head_dim, c.norm_eps, flags, rope, mlp)


class MuseSparkForCausalLM(CausalLM):
    def stack(self, config: MuseSparkTextConfig) -> nn.Module:
        return MuseSparkStack(config, self.flags, self.attention)


def residual_gate(temperature: float):
    """A residual gate's parameter g [hidden] as Flags.residual_gates' [2, hidden]: the branch's factor beta, the
    residual's alpha (the module docstring; in float64)."""
    def gates(g: np.ndarray) -> np.ndarray:
        w = g.astype(np.float64) / temperature
        beta = 1.0 / (1.0 + np.exp(-w))
        alpha = np.sqrt(np.maximum((1.0 - beta) * (1.0 + beta), GATE_EPS))
        return np.stack([beta, alpha]).astype(np.float32)
    return gates


def weight_map(c: MuseSparkTextConfig) -> WeightMap:
    m = {k: v for k, v in glimmer_weight_map(c).items()
         if not k.endswith(("post_attn_norm.weight", ".mlp.gate_up_proj.weight", ".mlp.down_proj.weight"))}
    gates = residual_gate(c.residual_gate_temperature)
    scaled = lambda w: w * np.float32(c.output_multiplier)          # noqa: E731  the router's logits' multiplier
    one_plus = lambda w: w + np.float32(1.0)                        # noqa: E731  the input-scaled norms' factor
    for i, sparse in enumerate(c.sparse_layers):
        k = f"model.layers.{i}"
        m[f"{k}.attn_gates"] = WeightSpec((f"{k}.post_attention_residual_gate.gate",), gates)
        m[f"{k}.mlp_gates"] = WeightSpec((f"{k}.post_feedforward_residual_gate.gate",), gates)
        m[f"{k}.post_mlp_norm.weight"] = WeightSpec((f"{k}.post_feedforward_layernorm.weight",), one_plus)
        if not sparse:
            m[f"{k}.mlp.gate_up_proj.weight"] = [f"{k}.mlp.gate_proj.weight", f"{k}.mlp.up_proj.weight"]
            m[f"{k}.mlp.down_proj.weight"] = [f"{k}.mlp.down_proj.weight"]
            continue
        mlp, experts = f"{k}.mlp", f"{k}.mlp.experts"
        for part in ("pre_expert_proj", "pre_expert_norm", "post_expert_proj"):
            m[f"{mlp}.{part}.weight"] = [f"{mlp}.{part}.weight"]
        m[f"{experts}.router"] = WeightSpec((f"{mlp}.gate.weight",), scaled)
        m[f"{experts}.choice_bias"] = [f"{mlp}.gate.e_score_correction_bias"]
        m[f"{experts}.experts_gate_up.weight"] = WeightSpec((f"{experts}.gate_up_proj",), expert_rows)
        m[f"{experts}.experts_down.weight"] = WeightSpec((f"{experts}.down_proj",), expert_rows)
        m[f"{experts}.expert_norm"] = WeightSpec((f"{experts}.post_expert_norm.weight",), one_plus)
    return m
