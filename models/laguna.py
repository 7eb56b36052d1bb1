"""Laguna (poolside: Laguna-XS.2, Laguna-S.2, Laguna-M.1): AFMoE's attention with a query head count of its own in
each layer (`num_attention_heads_per_layer`: XS.2's full layers 48, its sliding ones 64, over 8 KV heads), per-head
q/k RMSNorm, RoPE by layer kind (`rope_parameters` per kind: XS.2's full layers YaRN-scaled at base 500000 on half
of each head, its sliding ones unscaled at base 10000 on all of it: RoPE in the graph), the attention output gated by
softplus(g_proj(x)) in float32, one gate a head (`gating` true or "per-head": XS.2) or a value dim ("per-element":
M.1); DeepSeek-V3's router without groups (sigmoid scores, a choice bias, the weights renormalised, times
`moe_routed_scaling_factor`; the logits capped c * tanh(logits / c) where `moe_router_logit_softcapping` is set) with
one ungated shared expert of `shared_expert_intermediate_size`, dense layers by `mlp_layer_types` (the first where
unwritten). Its layers differ in query heads, so it runs over the KV cache kiln owns."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import CausalLM, LayerAttention, WeightMap, WeightSpec, attention_by_type, weight_spec
from .config import ConfigField, fields_with, layer_types, refuse_unlike, split_layer_rope, window_of
from .glm4_moe import FULL_ROTARY, MLP_LAYER_TYPES, DenseByType, Glm4MoeConfig, gates_after_queries
from .layers import Flags
from .moe import MoESpec, moe_weight_map

NAMES = dict(router="mlp.gate", expert="mlp.experts.{j}", gate="gate_proj", up="up_proj", down="down_proj",
             shared="mlp.shared_expert", choice_bias="mlp.experts.e_score_correction_bias")
# transformers' defaults where config.json has no rope_parameters (LagunaConfig.__post_init__)
DEFAULT_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}


@dataclass(frozen=True)
class LagunaConfig(DenseByType, Glm4MoeConfig):
    heads_per_layer: tuple[int, ...] = ()
    shared_intermediate_size: int = 0
    router_softcap: float = 0.0
    head_gate: bool = True                  # one gate a head (XS.2), else one a value dim (M.1)
    local_rope_theta: float = 10000.0
    local_rotary_factor: float = 1.0

    ARCH: ClassVar[str] = "laguna"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(Glm4MoeConfig.FIELDS, FULL_ROTARY,
                     ConfigField("routed_scale", ("moe_routed_scaling_factor", "routed_scaling_factor"), default=1.0),
                     ConfigField("first_dense", ("first_k_dense_replace",), default=1),
                     ConfigField("sliding_window", ("sliding_window",), default=512),
                     ConfigField("context_window_size", ("max_position_embeddings",), default=131072)),
        MLP_LAYER_TYPES,
        ConfigField("heads_per_layer", ("num_attention_heads_per_layer",), default=()),
        ConfigField("shared_intermediate_size", ("shared_expert_intermediate_size",), default=0),
        ConfigField("router_softcap", ("moe_router_logit_softcapping",), default=0.0),
        ConfigField("local_rope_theta", ("rope_local_base_freq",), default=10000.0),
        ConfigField("local_rotary_factor", ("local_partial_rotary_factor",), default=1.0))

    @classmethod
    def from_hf(cls, hf: dict) -> "LagunaConfig":
        """RoPE per layer kind (transformers' defaults where config.json has none) as the full layers' own fields and
        the sliding layers' base and share of each head."""
        params = hf.get("rope_parameters")
        if not (isinstance(params, dict) and "full_attention" in params):
            params = DEFAULT_ROPE
        full, local = dict(params["full_attention"] or {}), dict(params.get("sliding_attention") or {})
        full.pop("truncate", None)          # transformers reads truncate from the outer dict: always on here
        hf = split_layer_rope({**hf, "rope_parameters": {
            "full_attention": {k: v for k, v in full.items() if k != "partial_rotary_factor"},
            "sliding_attention": {k: v for k, v in local.items() if k != "partial_rotary_factor"}}},
            full_theta=500000.0, local_theta=10000.0)
        hf = {**hf, "partial_rotary_factor": full.get("partial_rotary_factor", 1.0),
              "local_partial_rotary_factor": local.get("partial_rotary_factor", 1.0)}
        return super().from_hf(hf)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        """A query head count a layer (the model's where unlisted); the gate's kind from `gating` (and `gating_types`,
        which must agree with it: transformers and vLLM read `gating` alone); each layer's kind."""
        refuse_unlike(hf, (("attention_bias", False), ("moe_apply_router_weight_on_input", False)), cls.ARCH)
        n = values["num_hidden_layers"]
        heads = tuple(values["heads_per_layer"] or ()) or (values["num_attention_heads"],) * n
        if len(heads) != n:
            raise ValueError(f"num_attention_heads_per_layer lists {len(heads)} layers of the {n}; fix config.json")
        gating, kinds = hf.get("gating", True), hf.get("gating_types")
        kind = "per-head" if gating is True else gating
        if kind not in ("per-head", "per-element"):
            raise ValueError(f"laguna with gating {gating!r} is not supported (true, 'per-head' or 'per-element'); "
                             "fix config.json")
        if kinds and {str(k).replace("_", "-") for k in kinds} != {kind}:
            raise ValueError(f"laguna's gating_types {kinds} disagree with gating {gating!r} (transformers reads "
                             "gating alone); fix config.json")
        rotary = values["head_dim"] * values["local_rotary_factor"]
        if not 0 < rotary <= values["head_dim"] or int(rotary) % 2:
            raise ValueError(f"the sliding layers' partial_rotary_factor {values['local_rotary_factor']} gives "
                             f"{rotary} rotary dims of head_dim {values['head_dim']}; it must be an even count")
        window = window_of(values)
        types = layer_types(values["layer_types"] or ["full_attention"] * n, n, hf, pattern=1)
        values = dict(values, groups=1, top_groups=1, norm_topk_prob=True, use_qk_norm=True, heads_per_layer=heads,
                      head_gate=kind == "per-head",
                      routed_scale=values["routed_scale"] if values["routed_scale"] is not None else 1.0)
        # Llama's adapt drops the kinds where nothing slides; here they also say which RoPE each layer turns
        return dict(super().adapt(values, hf, notes), layer_types=types, sliding_window=window)

    def flags(self) -> Flags:
        return Flags(qk_norm=True, attn_head_gate=self.head_gate, attn_output_gate=not self.head_gate,
                     attn_gate_act="softplus")

    def layer_heads(self, layer: int) -> int:
        return self.heads_per_layer[layer]

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        """Each layer's window and RoPE by its kind (the sliding kind's RoPE even where no window slides)."""
        local = int(self.head_dim * self.local_rotary_factor)
        layers = attention_by_type(self.layer_types, self.sliding_window, lambda t: (
            (self.local_rope_theta, None) if t == "sliding_attention" else (self.rope_theta, self.rope_scaling)))
        return tuple(dataclasses.replace(a, rotary_dim=local if t == "sliding_attention" else self.rotary_dim)
                     for a, t in zip(layers, self.layer_types))

    def routed(self) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, True, self.shared_intermediate_size,
                       shared_gated=False, scoring="sigmoid", choice_bias=True, routed_scale=self.routed_scale,
                       router_softcap=self.router_softcap)


LagunaForCausalLM = CausalLM


def weight_map(c: LagunaConfig, names: dict[str, str] = NAMES) -> WeightMap:
    """The released names (transformers saves them so too; `names`: the MoE's, moe_weight_map's): each layer's gate
    rows from g_proj, after v's rows (a gate a head) or beside each head's q rows (a gate a value dim)."""
    m = moe_weight_map(c, names)
    for i in range(c.num_hidden_layers):
        key = f"model.layers.{i}.self_attn.qkv_proj.weight"
        q, k, v = weight_spec(m[key]).hf_names
        g = f"model.layers.{i}.self_attn.g_proj.weight"
        m[key] = [q, k, v, g] if c.head_gate else \
            WeightSpec((q, g, k, v), gates_after_queries(c.layer_heads(i), c.head_dim))
    return m
