"""StepFun's Step 3.5 / 3.7 language model (step3p5: Step-3.5-Flash's Step3p5ForCausalLM, and the text model of Step
3.7's Step3p7ForConditionalGeneration, read alone by models/vision_text.py): Laguna's shape (models/laguna.py) with
its own settings. Sliding layers with a query head count of their own (num_sliding_attention_heads; the released
config's attention_other_setting) over the same KV heads, RoPE by layer kind (the released rope_theta and
partial_rotary_factors lists: full layers on half of each head), q / k RMS-normed a head, Gemma's norms x * (1 + w)
everywhere, the softmax scaled by query_pre_attn_scalar, the attention output gated a head by sigmoid(g_proj(x));
DeepSeek-V3's router without groups (sigmoid scores, the choice bias as moe.router_bias, the weights renormalised,
times moe_router_scaling_factor) beside an ungated shared expert (share_expert_dim), the first layers dense
(mlp_layer_types, or the released moe_layers_enum), SwiGLUs clamped a layer where swiglu_limits /
swiglu_limits_shared say (min(act(gate), limit) * clip(up, -limit, limit)). The released tensors' names (moe.gate_proj
[experts, rows, cols] stacked, share_expert.*), which transformers also writes; the multi-token-prediction layers
past num_hidden_layers are left unread. Its layers differ in query heads, so it runs over the KV cache kiln owns."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import CausalLM, WeightMap
from .config import ConfigField, fields_with
from .laguna import LagunaConfig
from .laguna import weight_map as laguna_weight_map
from .layers import Flags
from .moe import MoESpec


def _released(hf: dict) -> dict:
    """The released config.json's names (Step-3.5-Flash's) as transformers' Step3p7TextConfig reads them: the lists
    padded with the multi-token-prediction layers cut to the model's, the sliding layers' heads from
    attention_other_setting, RoPE per layer kind from the rope_theta and partial_rotary_factors lists, the dense layers
    from moe_layers_enum."""
    n = hf["num_hidden_layers"]
    hf = {k: (v[:n] if isinstance(v, list) and k in ("layer_types", "swiglu_limits", "swiglu_limits_shared",
                                                      "mlp_layer_types", "rope_theta", "partial_rotary_factors")
              else v) for k, v in hf.items()}
    other = hf.get("attention_other_setting") or {}
    if other and "num_sliding_attention_heads" not in hf:
        kv = hf.get("num_key_value_heads", hf.get("num_attention_groups"))
        if other.get("num_attention_groups", kv) != kv:
            raise ValueError(f"step3p5's attention_other_setting gives its sliding layers "
                             f"{other['num_attention_groups']} KV heads where the others have {kv}: transformers "
                             "reads one count for all; fix config.json")
        hf["num_sliding_attention_heads"] = other.get("num_attention_heads", hf["num_attention_heads"])
    if "rope_parameters" not in hf:
        types = hf.get("layer_types") or ["full_attention"] * n
        thetas = hf.get("rope_theta", 10000.0)
        thetas = thetas if isinstance(thetas, list) else [thetas] * n
        factors = hf.get("partial_rotary_factors") or [1.0] * n
        hf["rope_parameters"] = {t: {"rope_type": "default", "rope_theta": float(thetas[types.index(t)]),
                                     "partial_rotary_factor": float(factors[types.index(t)])} for t in set(types)}
        hf["rope_parameters"].setdefault("sliding_attention", {"rope_type": "default", "rope_theta": 10000.0})
        hf["rope_parameters"].setdefault("full_attention", hf["rope_parameters"]["sliding_attention"])
    if "mlp_layer_types" not in hf and hf.get("moe_layers_enum") is not None:
        enum = hf["moe_layers_enum"]
        moe = {int(i) for i in (enum.split(",") if isinstance(enum, str) else enum) if str(i).strip()}
        hf["mlp_layer_types"] = ["sparse" if i in moe else "dense" for i in range(n)]
    return hf


@dataclass(frozen=True)
class Step3p5Config(LagunaConfig):
    glu_limits: tuple[float, ...] = ()
    shared_glu_limits: tuple[float, ...] = ()
    query_scalar: float | None = None

    ARCH: ClassVar[str] = "step3p5"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        LagunaConfig.FIELDS,
        ConfigField("num_key_value_heads", ("num_key_value_heads", "num_attention_groups")),
        ConfigField("num_experts", ("n_routed_experts", "moe_num_experts")),
        ConfigField("top_k", ("num_experts_per_tok", "moe_top_k")),
        ConfigField("shared_intermediate_size", ("share_expert_dim",), default=0),
        ConfigField("routed_scale", ("moe_router_scaling_factor", "routed_scaling_factor"), default=1.0),
        ConfigField("first_dense", ("first_k_dense_replace",), default=3),     # transformers' default
        ConfigField("sliding_window", ("sliding_window",), default=None),
        ConfigField("context_window_size", ("max_position_embeddings",)),
        ConfigField("query_scalar", ("query_pre_attn_scalar",), default=None))

    @classmethod
    def from_hf(cls, hf: dict) -> "Step3p5Config":
        hf = _released(hf)
        sliding = hf.get("num_sliding_attention_heads") or hf["num_attention_heads"]
        types = hf.get("layer_types") or ["full_attention"] * hf["num_hidden_layers"]
        heads = [sliding if t == "sliding_attention" else hf["num_attention_heads"] for t in types]
        return super().from_hf({**hf, "num_attention_heads_per_layer": heads})

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("norm_expert_weight", True) is not True:
            raise ValueError("step3p5 with norm_expert_weight false is not supported (transformers' router always "
                             "renormalises the chosen weights); fix config.json")
        for key in ("use_head_wise_attn_gate", "zero_centered"):
            if hf.get(key, True) is not True:
                raise ValueError(f"step3p5 with {key} {hf[key]!r} is not supported (Step 3.5 / 3.7 and transformers' "
                                 "model gate every head and center every norm on 1); fix config.json")
        if hf.get("use_bidirectional_attention"):
            raise ValueError("step3p5 with use_bidirectional_attention is not supported (kiln's attention is causal)")
        if any(t not in ("full_attention", "sliding_attention") for t in hf.get("layer_types") or ()):
            raise ValueError(f"step3p5 layer_types {sorted(set(hf['layer_types']))}: kiln runs full and sliding "
                             "attention layers only (not the indexed sparse ones); fix config.json")
        n = values["num_hidden_layers"]

        def limits(key: str) -> tuple[float, ...]:
            given = hf.get(key) or [0.0] * n
            if len(given) < n:
                raise ValueError(f"step3p5 {key} lists {len(given)} layers of the {n}; fix config.json")
            return tuple(float(v or 0.0) for v in given[:n])

        values = super().adapt(dict(values, glu_limits=limits("swiglu_limits"),
                                    shared_glu_limits=limits("swiglu_limits_shared")), hf, notes)
        return dict(values, head_gate=True)

    def flags(self) -> Flags:
        return dataclasses.replace(super().flags(), norm="rms_1p", attn_gate_act="sigmoid",
                                   query_pre_attn_scalar=self.query_scalar)

    def layer_moe(self, layer: int) -> MoESpec | None:
        spec = super().layer_moe(layer)
        return spec and dataclasses.replace(spec, glu_limit=self.glu_limits[layer],
                                            shared_glu_limit=self.shared_glu_limits[layer])


Step3p5ForCausalLM = CausalLM


# The released names (transformers writes them so too): the router, its choice bias, the experts stacked under moe,
# the shared expert
NAMES = dict(router="moe.gate", choice_bias="moe.router_bias", stacked="moe", gate="gate_proj", up="up_proj",
             down="down_proj", shared="share_expert")


def weight_map(c: Step3p5Config) -> WeightMap:
    return laguna_weight_map(c, NAMES)
