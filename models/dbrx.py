"""Databricks DBRX: a pre-norm decoder with LayerNorms without bias, q/k/v fused in one `Wqkv` and
clamped to [-clip_qkv, clip_qkv], and sparse mixtures of `moe_num_experts` GLU experts on every layer
(softmax router, the top `moe_top_k`, their weights divided by their sum where
`moe_normalize_expert_weights` is 1). config.json keeps attention's and the MLP's fields in
`attn_config` and `ffn_config`; the experts are three 2-D tensors a layer (w1: every expert's gate rows,
v1: their up rows, w2: their down projections transposed, [experts x ffn, d_model] each)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import CausalLM, WeightMap, WeightSpec, head_weights
from .config import ConfigField
from .layers import Flags
from .llama import LlamaConfig
from .moe import EXPERT_FIELDS, MoESpec

DBRX_NORM_EPS = 1e-5                        # torch's LayerNorm default: DBRX's config.json writes none


@dataclass(frozen=True)
class DbrxConfig(LlamaConfig):
    num_experts: int = 16
    top_k: int = 4
    clip_qkv: float | None = None
    normalize: bool = True

    ARCH: ClassVar[str] = "dbrx"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *LlamaConfig.FIELDS, *EXPERT_FIELDS, ConfigField("clip_qkv", ("clip_qkv",), default=None),
        ConfigField("normalize", ("moe_normalize_expert_weights",), default=None))

    @classmethod
    def from_hf(cls, hf: dict) -> "DbrxConfig":
        attn, ffn = hf.get("attn_config") or {}, hf.get("ffn_config") or {}
        act = (ffn.get("ffn_act_fn") or {}).get("name", "silu")
        if act != "silu":
            raise ValueError(f"dbrx with ffn_act_fn {act!r} is not supported (silu); fix config.json")
        p = ffn.get("moe_normalize_expert_weights", 1)
        if p not in (None, 1, 1.0):
            raise ValueError(f"dbrx with moe_normalize_expert_weights {p} is not supported (1: divided by their sum, "
                             "or null)")
        flat = {"hidden_size": hf.get("d_model"), "num_hidden_layers": hf.get("n_layers"),
                "num_attention_heads": hf.get("n_heads"), "max_position_embeddings": hf.get("max_seq_len"),
                "num_key_value_heads": attn.get("kv_n_heads"), "rope_theta": attn.get("rope_theta", 10000.0),
                "clip_qkv": attn.get("clip_qkv"), "intermediate_size": ffn.get("ffn_hidden_size"),
                "num_experts": ffn.get("moe_num_experts"), "num_experts_per_tok": ffn.get("moe_top_k"),
                "moe_normalize_expert_weights": p is not None, "rms_norm_eps": DBRX_NORM_EPS}
        return super().from_hf({**hf, **{k: v for k, v in flat.items() if v is not None}})

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        clip = values["clip_qkv"]
        if clip is not None and clip <= 0:
            raise ValueError(f"clip_qkv {clip} must be above 0 (or null); fix config.json")
        return super().adapt(values, {**hf, "clip_qkv": None}, notes)

    def flags(self) -> Flags:
        return Flags(norm="layer_nobias", clip_qkv=self.clip_qkv)

    def layer_moe(self, layer: int) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.intermediate_size, bool(self.normalize))


DbrxForCausalLM = CausalLM


def _gate_up_by_expert(c: DbrxConfig):
    """[w1 (every expert's gate rows) | v1 (their up rows)] -> each expert's gate rows, then its up rows."""
    e, f = c.num_experts, c.intermediate_size
    return lambda rows: rows.reshape(2, e, f, -1).transpose(1, 0, 2, 3).reshape(2 * e * f, -1)


def _down_by_expert(c: DbrxConfig):
    """w2 [experts x ffn, d_model] (each expert's down projection transposed) -> [experts x d_model, ffn]."""
    e, f = c.num_experts, c.intermediate_size
    return lambda rows: np.ascontiguousarray(rows.reshape(e, f, -1).transpose(0, 2, 1).reshape(-1, f))


def weight_map(c: DbrxConfig) -> WeightMap:
    m: WeightMap = head_weights(c, "transformer", "wte", "norm_f")
    for i in range(c.num_hidden_layers):
        k, h = f"model.layers.{i}", f"transformer.blocks.{i}"
        attn, ffn = f"{h}.norm_attn_norm", f"{h}.ffn"
        m.update({
            f"{k}.input_layernorm.weight": [f"{attn}.norm_1.weight"],
            f"{k}.post_attention_layernorm.weight": [f"{attn}.norm_2.weight"],
            f"{k}.self_attn.qkv_proj.weight": [f"{attn}.attn.Wqkv.weight"],
            f"{k}.self_attn.o_proj.weight": [f"{attn}.attn.out_proj.weight"],
            f"{k}.mlp.router": [f"{ffn}.router.layer.weight"],
            f"{k}.mlp.experts_gate_up.weight": WeightSpec((f"{ffn}.experts.mlp.w1", f"{ffn}.experts.mlp.v1"),
                                                          _gate_up_by_expert(c)),
            f"{k}.mlp.experts_down.weight": WeightSpec((f"{ffn}.experts.mlp.w2",), _down_by_expert(c)),
        })
    return m
