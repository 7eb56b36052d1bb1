"""Llama 4 (Scout, Maverick; the text model of Llama4ForConditionalGeneration, its vision tower left out):
a Llama whose RoPE layers rotate adjacent pairs (kiln reorders q and k rows as it loads them) and then
RMS-norm q and k without a weight (`use_qk_norm`), whose every `no_rope_layer_interval`-th layer attends
without RoPE and with a query temperature, 1 + attn_scale * log(1 + floor((position + 1) / floor_scale))
(`attn_temperature_tuning`), and whose `moe_layers` are mixtures of `num_local_experts` experts beside an
always-on shared expert: the top `num_experts_per_tok` by router logit, each reading x scaled by the
sigmoid of its logit (models/moe.py scale_input); dense layers have `intermediate_size_mlp`.

The RoPE layers attend within chunks of `attention_chunk_size` tokens: kiln caps the context there (with a
note), where chunked attention is causal attention. Experts are stored as transformers 5 writes them,
gate_up_proj [experts, hidden, gate + up] and down_proj [experts, expert size, hidden]: transposed at load."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import LLAMA_NAMES, CausalLM, LayerAttention, WeightMap, WeightSpec, prefixed_names
from .config import ConfigField, TextModelOf, fields_with
from .layers import Flags
from .llama import LlamaConfig
from .moe import MoESpec, moe_weight_map

FEED_FORWARD = dict(gate_proj="feed_forward.gate_proj", up_proj="feed_forward.up_proj",
                    down_proj="feed_forward.down_proj")
EXPERTS = dict(router="feed_forward.router", fused="feed_forward.experts", shared="feed_forward.shared_expert",
               gate="gate_proj", up="up_proj", down="down_proj")


@dataclass(frozen=True)
class Llama4Config(TextModelOf, LlamaConfig):
    moe_intermediate_size: int = 0
    num_experts: int = 16
    top_k: int = 1
    moe_layers: tuple[int, ...] = ()
    rope_layers: tuple[bool, ...] = ()
    use_qk_norm: bool = True
    temperature: tuple[float, int, int] | None = None     # (attn_scale, floor_scale, 1) on NoPE layers
    weight_prefix: str = "model"

    ARCH: ClassVar[str] = "llama4"
    ADJACENT_ROPE: ClassVar[bool] = True
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(LlamaConfig.FIELDS, ConfigField("intermediate_size", ("intermediate_size_mlp",)),
                     ConfigField("layer_types", ("_unused_layer_types",), default=None)),
        ConfigField("moe_intermediate_size", ("intermediate_size",)),
        ConfigField("num_experts", ("num_local_experts",), default=16),
        ConfigField("top_k", ("num_experts_per_tok",), default=1),
        ConfigField("moe_layers", ("moe_layers",), default=None),
        ConfigField("interleave", ("interleave_moe_layer_step",), default=1),
        ConfigField("rope_layers", ("no_rope_layers",), default=None),
        ConfigField("rope_interval", ("no_rope_layer_interval",), default=4),
        ConfigField("use_qk_norm", ("use_qk_norm",), default=True),
        ConfigField("chunk", ("attention_chunk_size",), default=None),
        ConfigField("tuning", ("attn_temperature_tuning",), default=True),
        ConfigField("floor_scale", ("floor_scale",), default=8192),
        ConfigField("attn_scale", ("attn_scale",), default=0.1))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        interleave, interval = values.pop("interleave"), values.pop("rope_interval")
        moe = values["moe_layers"]
        moe = tuple(moe) if moe is not None else tuple(range(interleave - 1, n, interleave))
        rope = values["rope_layers"] or [int((i + 1) % interval != 0) for i in range(n)]    # 1: the layer rotates
        if len(rope) != n:
            raise ValueError(f"no_rope_layers lists {len(rope)} layers for {n}; fix config.json")
        chunk, tuning = values.pop("chunk"), values.pop("tuning")
        floor_scale, attn_scale = values.pop("floor_scale"), values.pop("attn_scale")
        if chunk and values["context_window_size"] > chunk and any(rope):
            notes.append(f"context window capped at attention_chunk_size ({chunk} tokens): within it, Llama 4's "
                         "chunked attention is causal attention (chunks are not supported yet)")
            values["context_window_size"] = int(chunk)
        values = dict(values, moe_layers=moe, rope_layers=tuple(bool(r) for r in rope),
                      temperature=(float(attn_scale), int(floor_scale), 1) if tuning else None)
        return super().adapt(values, hf, notes)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return tuple(dataclasses.replace(a, rope=r) for a, r in zip(super().layer_attention(), self.rope_layers))

    def layer_flags(self, layer: int) -> Flags:
        flags = self.flags()
        if self.rope_layers[layer]:        # q and k RMS-normed without weight after RoPE
            return dataclasses.replace(flags, qk_norm=self.use_qk_norm, qk_norm_after_rope=True,
                                       qk_norm_kind="rms_noparam")
        return dataclasses.replace(flags, attn_temperature=self.temperature)

    def layer_moe(self, layer: int) -> MoESpec | None:
        if layer not in self.moe_layers:
            return None
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, normalize=False,
                       shared_intermediate_size=self.moe_intermediate_size, shared_gated=False, scoring="sigmoid",
                       scale_input=True)


Llama4ForCausalLM = CausalLM


def _transposed_rows(stacked):
    """transformers 5's Llama 4 experts [experts, cols, rows] as kiln's expert Linear [experts * rows, cols]."""
    return stacked.transpose(0, 2, 1).reshape(-1, stacked.shape[1])


def weight_map(c: Llama4Config) -> WeightMap:
    names = prefixed_names(dict(LLAMA_NAMES, **FEED_FORWARD), c.weight_prefix)
    m = moe_weight_map(c, EXPERTS, names)
    for key, entry in m.items():
        if key.endswith((".experts_gate_up.weight", ".experts_down.weight")):
            m[key] = WeightSpec(entry.hf_names, _transposed_rows)
    return m
