"""Liquid AI's LFM2 (350M, 700M, 1.2B, 2.6B, LFM2.5), LFM2-MoE and LFM3: gated short-convolution layers among GQA
attention ones.

    conv layer       B, C, x = in_proj(norm(h)) (thirds);  y = C * conv(B * x);  h += out_proj(y)
                     conv: a depthwise causal convolution over each channel's last `conv_L_cache` (3) inputs
    attention layer  q, k normed per head (RMSNorm), RoPE, GQA;  h += out_proj(attention)
    every layer      h += w2(silu(w1(norm(h))) * w3(norm(h)))   (the width block_auto_adjust_ff_dim makes of
                     intermediate_size: 2/3 of it, times block_ffn_dim_multiplier, rounded up to block_multiple_of)
    final            embedding_norm (an RMSNorm, after the last layer despite its name), the head tied

A conv layer's state is its last inputs, a window of positions: the KV cache kiln owns keeps each conv layer's
inputs B * x as a one-head key and value (its two halves, models/owned_kv.py short_conv), and the conv reads the
tokens before it from those pages. So chunked prefill, prefix hits, forks and speculation's pops hold for it as
for attention, at the cost of keeping every token's input (hidden values a conv layer; llama.cpp keeps the last
two). RoPE is applied in the graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .causal_lm import (DECODER_FIELDS, DecoderConfig, LayerAttention, OwnedStackLM, PositionalStack, WeightMap,
                        WeightSpec, head_weights)
from .config import ConfigField, window_of
from .layers import MLP, Flags, Norm, cached_attention
from .moe import EXPERT_FIELDS, MoESpec, SparseMoE
from .rope import apply_rope, inv_freq, proportional

_FIELDS = (
    *DECODER_FIELDS, ConfigField("conv_taps", ("conv_L_cache",), default=3),
    ConfigField("conv_bias", ("conv_bias",), default=False),
    ConfigField("auto_ff", ("block_auto_adjust_ff_dim",), default=True),
    ConfigField("ff_multiplier", ("block_ffn_dim_multiplier",), default=1.0),
    ConfigField("multiple_of", ("block_multiple_of",), default=256),
    ConfigField("layer_types", ("layer_types",), default=None),
    ConfigField("full_attn_idxs", ("full_attn_idxs",), default=None),
)


@dataclass(frozen=True)
class Lfm2Config(DecoderConfig):
    conv_taps: int = 3
    conv_bias: bool = False
    auto_ff: bool = True
    ff_multiplier: float | None = 1.0
    multiple_of: int = 256
    layer_types: tuple[str, ...] = ()
    full_attn_idxs: tuple[int, ...] | None = None

    ARCH: ClassVar[str] = "lfm2"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = _FIELDS
    ROPE_TYPES: ClassVar[tuple[str, ...]] = ("default",)
    KINDS: ClassVar[tuple[str, ...]] = ("full_attention", "conv")
    NAMES: ClassVar[dict[str, str]] = {"o_proj": "out_proj", "q_norm": "q_layernorm", "k_norm": "k_layernorm"}

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        types = values["layer_types"]
        if not types:
            full = values["full_attn_idxs"] if values["full_attn_idxs"] is not None else list(range(n))
            types = ["full_attention" if i in full else "conv" for i in range(n)]
        if len(types) != n or set(types) - set(cls.KINDS):
            raise ValueError(f"layer_types must list one of {', '.join(cls.KINDS)} for each of the {n} layers; "
                             f"got {types}")
        if values["conv_bias"]:
            raise ValueError("LFM2 with conv_bias is not supported yet (the released checkpoints have none)")
        if values["hidden_size"] % 2 or values["conv_taps"] < 1:
            raise ValueError(f"LFM2 needs an even hidden_size and conv_L_cache >= 1 (got {values['hidden_size']}, "
                             f"{values['conv_taps']}); fix config.json")
        width = values["intermediate_size"]
        if values["auto_ff"]:
            width = int(2 * width / 3)
            if values["ff_multiplier"] is not None:
                width = int(values["ff_multiplier"] * width)
                width = values["multiple_of"] * ((width + values["multiple_of"] - 1) // values["multiple_of"])
        return dict(values, layer_types=tuple(types), intermediate_size=width, full_attn_idxs=None,
                    tie_word_embeddings=hf.get("tie_word_embeddings", hf.get("tie_embedding", True)))

    def flags(self) -> Flags:
        return Flags()

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return (LayerAttention("full", None, self.rope_theta, None),) * self.num_hidden_layers

    def kv_layers(self) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
        """Attention layers hold keys and values; conv layers their inputs, as one head of half the width."""
        return (tuple((self.num_key_value_heads, self.head_dim) if t != "conv" else (1, self.hidden_size // 2)
                      for t in self.layer_types), tuple(range(self.num_hidden_layers)))

    def rope_of(self, layer: int) -> tuple[np.ndarray, float]:
        return inv_freq(self.head_dim, self.rope_theta, None)

    def lfm3(self) -> tuple[bool, bool, bool]:
        """(sandwich norms, an attention output gate, q/k/v/o biases): LFM3's, none of them LFM2's."""
        return False, False, False


@dataclass(frozen=True)
class Lfm2MoeConfig(Lfm2Config):
    """LFM2-MoE (8B-A1B, 24B-A2B): LFM2's layers, each MLP after the first `num_dense_layers` a mixture of experts
    routed by sigmoid scores, a per-expert bias choosing (expert_bias), the chosen scores renormalised (+1e-6) and
    scaled; the dense MLPs are intermediate_size wide as given."""

    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    num_dense_layers: int = 0
    expert_bias: bool = True
    routed_scale: float = 1.0
    normalize: bool = True

    ARCH: ClassVar[str] = "lfm2_moe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *_FIELDS, *EXPERT_FIELDS, ConfigField("moe_intermediate_size", ("moe_intermediate_size",)),
        ConfigField("num_dense_layers", ("num_dense_layers",), default=2),
        ConfigField("expert_bias", ("use_expert_bias",), default=True),
        ConfigField("routed_scale", ("routed_scaling_factor",), default=1.0),
        ConfigField("normalize", ("norm_topk_prob",), default=True))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        values = super().adapt(dict(values, auto_ff=False), hf, notes)
        if values["num_dense_layers"] < values["num_hidden_layers"]:         # the counts make a router
            MoESpec(values["num_experts"], values["top_k"], values["moe_intermediate_size"], True)
        return values

    def layer_moe(self, layer: int) -> MoESpec | None:
        if layer < self.num_dense_layers:
            return None
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, normalize=self.normalize,
                       scoring="sigmoid", choice_bias=self.expert_bias, routed_scale=self.routed_scale, norm_eps=1e-6)


@dataclass(frozen=True)
class Lfm3Config(Lfm2Config):
    """LFM3: LFM2's conv layers (7 taps) among sliding-window attention layers and full ones, RoPE by kind (the
    full layers' proportional: half of each head rotated), norms on the operator's and the MLP's outputs too,
    a sigmoid gate a head on each attention output, the MLP intermediate_size wide as given."""

    sliding_window: int | None = 256
    sandwich: bool = True
    attention_gate: bool = True
    attention_bias: bool = False
    local_rope: tuple = (10000.0, 1.0)      # sliding layers' (theta, partial)
    global_rope: tuple = (1e6, 0.5)         # full layers' (theta, partial): proportional

    ARCH: ClassVar[str] = "lfm3"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *_FIELDS, ConfigField("sliding_window", ("sliding_window",), default=256),
        ConfigField("sandwich", ("use_sandwich_norm",), default=True),
        ConfigField("attention_gate", ("use_attention_gate",), default=True),
        ConfigField("attention_bias", ("attention_bias",), default=False))
    KINDS: ClassVar[tuple[str, ...]] = ("full_attention", "sliding_attention", "conv")
    NAMES: ClassVar[dict[str, str]] = {"o_proj": "o_proj", "q_norm": "q_norm", "k_norm": "k_norm"}

    @classmethod
    def from_hf(cls, hf: dict) -> "Lfm3Config":
        import dataclasses
        params = hf.get("rope_parameters") or {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.5}}
        ropes = {}
        for kind in ("sliding_attention", "full_attention"):
            p = params.get(kind) or {}
            if p.get("rope_type", "default") not in ("default", "proportional") or p.get("factor", 1.0) != 1.0:
                raise ValueError(f"rope_parameters.{kind} {p!r} is not supported for lfm3 (default or proportional, "
                                 "unscaled)")
            ropes[kind] = (float(p.get("rope_theta", 1e6)),
                           float(p.get("partial_rotary_factor", 1.0)) if p.get("rope_type") == "proportional" else 1.0)
        n = hf.get("num_hidden_layers", 24)
        types = hf.get("layer_types") or [
            "full_attention" if i % 4 == 2 else "sliding_attention" if i % 4 == 0 and i > 0 else "conv"
            for i in range(n)]
        flat = {k: v for k, v in hf.items() if k != "rope_parameters"}
        c = super().from_hf({**flat, "rope_theta": ropes["full_attention"][0], "layer_types": types,
                             "block_auto_adjust_ff_dim": False})
        return dataclasses.replace(c, local_rope=ropes["sliding_attention"], global_rope=ropes["full_attention"])

    def lfm3(self) -> tuple[bool, bool, bool]:
        return self.sandwich, self.attention_gate, self.attention_bias

    def rope_of(self, layer: int) -> tuple[np.ndarray, float]:
        theta, partial = self.local_rope if self.layer_types[layer] == "sliding_attention" else self.global_rope
        return proportional(self.head_dim, theta, partial)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        window = window_of(vars(self))
        return tuple(LayerAttention("sliding", window, self.rope_theta, None) if t == "sliding_attention" and window
                     else LayerAttention("full", None, self.rope_theta, None) for t in self.layer_types)


class Lfm2Attention(nn.Module):
    """q, k normed per head, RoPE (the layer kind's), GQA; LFM3's sigmoid gate a head on the output, and biases."""

    kv_dtype: str | None = None

    def __init__(self, c: Lfm2Config, layer: int):
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        _, gated, bias = c.lfm3()
        self.qkv_proj = nn.Linear(c.hidden_size, (self.heads + 2 * self.kv_heads) * c.head_dim, bias=bias)
        self.out_proj = nn.Linear(self.heads * c.head_dim, c.hidden_size, bias=bias)
        self.q_layernorm = Norm(c.head_dim, c.norm_eps)
        self.k_layernorm = Norm(c.head_dim, c.norm_eps)
        if gated:
            self.g_proj = nn.Linear(c.hidden_size, self.heads, bias=False)
        self.rope = c.rope_of(layer)

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        b, s, _ = x.shape
        h, h_kv, d = self.heads, self.kv_heads, self.head_dim
        q, k, v = op.split(op.reshape(self.qkv_proj(x), (b, s, h + 2 * h_kv, d)), [h, h + h_kv], axis=2)
        q, k = (apply_rope(t, positions, *self.rope) for t in (self.q_layernorm(q), self.k_layernorm(k)))
        out = cached_attention(kv, layer_id, op.concat([q, k, v], dim=2), h, d ** -0.5, self.kv_dtype)
        if hasattr(self, "g_proj"):
            out = out * op.reshape(op.sigmoid(self.g_proj(x)), (b, s, h, 1))
        return self.out_proj(op.reshape(out, (b, s, h * d)))


class Lfm2ShortConv(nn.Module):
    kv_dtype: str | None = None              # unused: the conv's inputs take the cache's dtype (owned_kv.short_conv)

    def __init__(self, c: Lfm2Config):
        self.in_proj = nn.Linear(c.hidden_size, 3 * c.hidden_size, bias=False)
        self.out_proj = nn.Linear(c.hidden_size, c.hidden_size, bias=False)
        self.conv = nn.Parameter((c.hidden_size, c.conv_taps))

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        gate_in, gate_out, value = op.split(self.in_proj(x), 3, axis=-1)          # B, C, x
        return self.out_proj(gate_out * kv.short_conv(layer_id, gate_in * value, self.conv))


class Lfm2Layer(nn.Module):
    def __init__(self, c: Lfm2Config, layer: int):
        self.operator_norm = Norm(c.hidden_size, c.norm_eps)
        self.self_attn = Lfm2Attention(c, layer) if c.layer_types[layer] != "conv" else Lfm2ShortConv(c)
        self.ffn_norm = Norm(c.hidden_size, c.norm_eps)
        if c.lfm3()[0]:                             # LFM3's norms on the operator's and the MLP's outputs
            self.post_operator_norm, self.post_ffn_norm = Norm(c.hidden_size, c.norm_eps), Norm(c.hidden_size,
                                                                                               c.norm_eps)
        spec = c.layer_moe(layer)
        self.mlp = SparseMoE(c.hidden_size, spec, Flags()) if spec else MLP(c.hidden_size, c.intermediate_size, Flags())

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        out = self.self_attn(self.operator_norm(x), kv, layer_id, positions)
        x = x + (self.post_operator_norm(out) if hasattr(self, "post_operator_norm") else out)
        out = self.mlp(self.ffn_norm(x))
        return x + (self.post_ffn_norm(out) if hasattr(self, "post_ffn_norm") else out)


class Lfm2Stack(PositionalStack):
    def __init__(self, c: Lfm2Config):              # its norm: HF's embedding_norm, after the last layer
        super().__init__(c, [Lfm2Layer(c, i) for i in range(c.num_hidden_layers)])


class Lfm2ForCausalLM(OwnedStackLM):
    """CausalLM's entry functions over Lfm2Stack; its KV cache always the one kiln owns."""

    STACK: ClassVar[type] = Lfm2Stack
    OWNED_ONLY: ClassVar[str] = "LFM2's conv layers keep their inputs in the KV cache"


def weight_map(c: Lfm2Config) -> WeightMap:
    m: WeightMap = head_weights(c, norm="embedding_norm")
    for i, kind in enumerate(c.layer_types):
        k = h = f"model.layers.{i}"
        m[f"{k}.operator_norm.weight"] = [f"{h}.operator_norm.weight"]
        m[f"{k}.ffn_norm.weight"] = [f"{h}.ffn_norm.weight"]
        if c.layer_moe(i) is not None:                 # LFM2-MoE: the router, its choice bias, each expert's w1/w3/w2
            experts = [f"{h}.feed_forward.experts.{j}" for j in range(c.num_experts)]
            m[f"{k}.mlp.router"] = [f"{h}.feed_forward.gate.weight"]
            if c.expert_bias:
                m[f"{k}.mlp.choice_bias"] = [f"{h}.feed_forward.expert_bias"]
            m[f"{k}.mlp.experts_gate_up.weight"] = [f"{e}.{w}.weight" for e in experts for w in ("w1", "w3")]
            m[f"{k}.mlp.experts_down.weight"] = [f"{e}.w2.weight" for e in experts]
        else:
            m[f"{k}.mlp.gate_up_proj.weight"] = [f"{h}.feed_forward.w1.weight", f"{h}.feed_forward.w3.weight"]
            m[f"{k}.mlp.down_proj.weight"] = [f"{h}.feed_forward.w2.weight"]
        sandwich, gated, bias = c.lfm3()
        if sandwich:
            for x in ("post_operator_norm", "post_ffn_norm"):
                m[f"{k}.{x}.weight"] = [f"{h}.{x}.weight"]
        if kind != "conv":
            names = c.NAMES
            for p in ("weight", "bias") if bias else ("weight",):
                m[f"{k}.self_attn.qkv_proj.{p}"] = [f"{h}.self_attn.{x}_proj.{p}" for x in "qkv"]
                m[f"{k}.self_attn.out_proj.{p}"] = [f"{h}.self_attn.{names['o_proj']}.{p}"]
            m[f"{k}.self_attn.q_layernorm.weight"] = [f"{h}.self_attn.{names['q_norm']}.weight"]
            m[f"{k}.self_attn.k_layernorm.weight"] = [f"{h}.self_attn.{names['k_norm']}.weight"]
            if gated:
                m[f"{k}.self_attn.g_proj.weight"] = [f"{h}.self_attn.gate_proj.weight"]   # the checkpoint's name
        else:
            m[f"{k}.self_attn.in_proj.weight"] = [f"{h}.conv.in_proj.weight"]
            m[f"{k}.self_attn.out_proj.weight"] = [f"{h}.conv.out_proj.weight"]
            m[f"{k}.self_attn.conv"] = WeightSpec((f"{h}.conv.conv.weight",),
                                                  lambda w: np.ascontiguousarray(w.reshape(w.shape[0], -1)))
    return m
