"""Amazon's Ergo (ergo): sliding layers (`sliding_window`) with RoPE on adjacent pairs of dims among full ones
(every `global_attention_every_n_layers`-th) without it, whose scores are multiplied by
`global_attention_scale` where set; q, k and v from one wqkv, q and k normed a head; norms before and after
attention and MLP; each branch mixed into the residual by a learned gate a hidden dim (w: branch * sigmoid(w) +
x * sqrt(1 + sigmoid(w)) * exp(-softplus(w) / 2), the two vectors computed at load); relu^2 MLPs without a gate:
the first `num_dense_blocks` dense (first_dense_intermediate_size wide), the others a sigmoid router with a choice
bias over experts whose outputs are each RMS-normed with their expert's own weight before being weighted
(renormalised, times moe_routed_scaling_factor), beside a shared expert normed the same way.

Its checkpoints keep its training framework's serving layout (tok_embeddings, layers.{i}.attention.wqkv,
feed_forward.up_proj [experts, hidden, width], a router [hidden, experts], ...), which transformers also saves."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .beam import sliding_rope
from .causal_lm import LLAMA_NAMES, CausalLM, LayerAttention, WeightMap, WeightSpec, rope_on_sliding_only, \
    decoder_weight_map, rope_halves
from .config import ConfigField, fields_with, layer_types, window_of
from .glm4_moe import FULL_ROTARY, MLP_LAYER_TYPES, DenseByType, Glm4MoeConfig
from .layers import Flags
from .moe import MoESpec, expert_columns

NAMES = dict(LLAMA_NAMES, embed_tokens="tok_embeddings", norm="norm", lm_head="output", layer="layers.{i}",
             input_layernorm="attention_norm", post_attention_layernorm="ffn_norm",
             post_attn_norm="post_attention_norm", post_mlp_norm="post_ffn_norm", o_proj="attention.wo",
             q_norm="attention.q_norm", k_norm="attention.k_norm", up_proj="feed_forward.up",
             down_proj="feed_forward.down")


@dataclass(frozen=True)
class ErgoConfig(DenseByType, Glm4MoeConfig):
    shared_intermediate_size: int = 0
    global_attention_scale: float | None = None

    ARCH: ClassVar[str] = "ergo"
    ADJACENT_ROPE: ClassVar[bool] = True
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(Glm4MoeConfig.FIELDS, FULL_ROTARY,
                     ConfigField("intermediate_size", ("first_dense_intermediate_size",)),
                     ConfigField("norm_eps", ("rms_norm_eps",), default=1e-12),
                     ConfigField("rope_theta", ("rope_theta",), default=1000000.0),
                     ConfigField("routed_scale", ("moe_routed_scaling_factor",), default=8 ** 0.5),
                     ConfigField("first_dense", ("num_dense_blocks",), default=1),
                     ConfigField("sliding_window", ("sliding_window", "local_attention_window"), default=512)),
        MLP_LAYER_TYPES,
        ConfigField("shared_intermediate_size", ("shared_intermediate_size",), default=8192),
        ConfigField("global_attention_scale", ("global_attention_scale",), default=None))

    @classmethod
    def from_hf(cls, hf: dict) -> "ErgoConfig":
        return super().from_hf(sliding_rope(hf, cls.ARCH))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n, window = values["num_hidden_layers"], window_of(values)
        types = layer_types(values["layer_types"], n, hf, pattern=hf.get("global_attention_every_n_layers") or 4)
        values = dict(values, groups=1, top_groups=1, norm_topk_prob=True, use_qk_norm=True)
        # Llama's adapt drops the layer kinds where nothing slides; here they also say which layers rotate
        return dict(super().adapt(values, hf, notes), layer_types=types, sliding_window=window)

    def flags(self) -> Flags:
        return Flags(qk_norm=True, sandwich_norms=True, residual_gates=True, gated_mlp=False, activation="relu2")

    def layer_flags(self, layer: int) -> Flags:
        if self.global_attention_scale is None or self.layer_types[layer] != "full_attention":
            return self.flags()             # q and k times its square root each: the scores times it
        return dataclasses.replace(self.flags(), attn_scale=self.head_dim ** -0.5 * self.global_attention_scale)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return rope_on_sliding_only(self)

    def routed(self) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, True, self.shared_intermediate_size,
                       shared_gated=False, scoring="sigmoid", choice_bias=True, routed_scale=self.routed_scale,
                       norm_eps=1e-20, gated=False, expert_norm_eps=self.norm_eps, shared_norm_eps=self.norm_eps)


ErgoForCausalLM = CausalLM


def residual_gates(w: np.ndarray) -> np.ndarray:
    """A residual gate's weight w [hidden] as [2, hidden]: the branch's factor sigmoid(w), the residual's
    sqrt(1 + sigmoid(w)) * exp(-softplus(w) / 2) (computed in float64)."""
    w = w.astype(np.float64)
    branch = 1.0 / (1.0 + np.exp(-w))
    return np.stack([branch, np.sqrt(1.0 + branch) * np.exp(-0.5 * np.logaddexp(0.0, w))]).astype(np.float32)


def weight_map(c: ErgoConfig) -> WeightMap:
    m = decoder_weight_map(c, NAMES)
    for i in range(c.num_hidden_layers):
        k, h = f"model.layers.{i}", f"layers.{i}"
        m[f"{k}.self_attn.qkv_proj.weight"] = WeightSpec((f"{h}.attention.wqkv.weight",), rope_halves(c))
        m[f"{k}.attn_gates"] = WeightSpec((f"{h}.post_attention_residual.scale",), residual_gates)
        m[f"{k}.mlp_gates"] = WeightSpec((f"{h}.post_ffn_residual.scale",), residual_gates)
        if c.layer_moe(i) is None:
            continue
        for key in [key for key in m if key.startswith(f"{k}.mlp.")]:
            del m[key]
        ff = f"{h}.feed_forward"
        m.update({
            f"{k}.mlp.router": WeightSpec((f"{ff}.gate_kernel",), np.transpose),
            f"{k}.mlp.choice_bias": [f"{ff}.router_bias"],
            f"{k}.mlp.experts_gate_up.weight": WeightSpec((f"{ff}.up_proj",), expert_columns),
            f"{k}.mlp.experts_down.weight": WeightSpec((f"{ff}.down_proj",), expert_columns),
            f"{k}.mlp.expert_norm": [f"{ff}.expert_output_norm.scale"],
            f"{k}.mlp.shared.up_proj.weight": WeightSpec((f"{ff}.shared_up_proj",), np.transpose),
            f"{k}.mlp.shared.down_proj.weight": WeightSpec((f"{ff}.shared_down_proj",), np.transpose),
            f"{k}.mlp.shared_norm.weight": [f"{ff}.shared_expert_output_norm.scale"]})
    return m
