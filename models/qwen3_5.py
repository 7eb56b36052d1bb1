"""Qwen3.5 (text; dense 0.8B-27B and the MoE ones, text-only or under Qwen3_5ForConditionalGeneration) and
Qwen3-Next (its predecessor: the same layers, its DeltaNet projections stored fused a key head):
gated DeltaNet layers (linear attention with a recurrent state) among gated full-attention ones, 3:1 by
default (`layer_types`, or every `full_attention_interval`-th layer full).

    DeltaNet layer   q, k, v = silu(conv(in_proj_qkv(x)))   (a causal depthwise conv of linear_conv_kernel_dim taps)
                     q, k l2-normed per head, q / sqrt(dk);  beta = sigmoid(in_proj_b(x));
                     g = -exp(A_log) * softplus(in_proj_a(x) + dt_bias)
                     S <- S e^g + k (beta (v - e^g S^T k))^T;  o = S^T q      (a value head's S [dk, dv];
                     key heads serve hv / hk consecutive value heads)
                     out_proj(rmsnorm(o) * w * silu(in_proj_z(x)))
    attention layer  q_proj gives each head's query and an output gate side by side; q, k RMSNormed per
                     head (1 + w), RoPE on the first partial_rotary_factor (0.25) of each head; the output
                     times sigmoid(gate), then o_proj
    every layer      pre-norms (RMSNorm, 1 + w: zero-centred weights), a SwiGLU MLP (MoE: softmax top-k
                     renormalised experts beside a shared expert behind a sigmoid gate)

Text positions are one stream: the multimodal RoPE's three sections read the same position, which is
plain RoPE. A DeltaNet layer's state (the conv's last inputs, the delta rule's S) is a fixed size a
sequence, kept in a state slot of the KV cache kiln owns (models/owned_kv.py recurrent_conv / gated_delta,
targets/recurrent.py): the attention layers' keys and values sit in its pages as usual. A state holds every
token before it, so such a model shares no prefixes and speculates on none (KVCacheLayout.rewind_problem).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .causal_lm import (DECODER_FIELDS, DecoderConfig, LayerAttention, OwnedStackLM, PositionalStack, WeightMap,
                        WeightSpec, head_weights)
from .config import ConfigField, fields_with, text_model
from .layers import MLP, Flags, Norm, cached_attention
from .moe import EXPERT_FIELDS, MoESpec, SparseMoE
from .qwen_moe import QwenMoeLayers
from .rope import apply_rope, inv_freq

_FIELDS = (
    *DECODER_FIELDS,
    ConfigField("linear_key_heads", ("linear_num_key_heads",), default=16),
    ConfigField("linear_value_heads", ("linear_num_value_heads",), default=32),
    ConfigField("linear_key_dim", ("linear_key_head_dim",), default=128),
    ConfigField("linear_value_dim", ("linear_value_head_dim",), default=128),
    ConfigField("conv_taps", ("linear_conv_kernel_dim",), default=4),
    ConfigField("layer_types", ("layer_types",), default=None),
    ConfigField("full_interval", ("full_attention_interval",), default=4),
    ConfigField("attention_bias", ("attention_bias",), default=False),
    ConfigField("activation", ("hidden_act",), default="silu"),
)
KINDS = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class Qwen35Config(DecoderConfig):
    linear_key_heads: int = 16
    linear_value_heads: int = 32
    linear_key_dim: int = 128
    linear_value_dim: int = 128
    conv_taps: int = 4
    layer_types: tuple[str, ...] = ()
    full_interval: int = 4
    attention_bias: bool = False
    activation: str = "silu"
    weight_prefix: str = "model"

    ARCH: ClassVar[str] = "qwen3_5"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = _FIELDS

    @classmethod
    def from_hf(cls, hf: dict) -> "Qwen35Config":
        text, prefix = text_model(hf)
        params = text.get("rope_parameters") or {}
        if "partial_rotary_factor" not in params and "partial_rotary_factor" not in text:
            text = {**text, "partial_rotary_factor": 0.25}          # transformers' default for Qwen3.5
        return dataclasses.replace(super().from_hf(text), weight_prefix=prefix)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        types = values["layer_types"] or ["full_attention" if (i + 1) % values["full_interval"] == 0
                                          else "linear_attention" for i in range(n)]
        if len(types) != n or set(types) - set(KINDS):
            raise ValueError(f"layer_types must list one of {', '.join(KINDS)} for each of the {n} layers; "
                             f"got {types}; fix config.json")
        if values["linear_value_heads"] % values["linear_key_heads"]:
            raise ValueError(f"linear_num_value_heads ({values['linear_value_heads']}) must be a multiple of "
                             f"linear_num_key_heads ({values['linear_key_heads']}); fix config.json")
        if values["activation"] != "silu":
            raise ValueError(f"{cls.ARCH} with hidden_act {values['activation']!r} is not supported (its DeltaNet "
                             "and MLPs are silu's); fix config.json")
        if values["conv_taps"] < 2:
            raise ValueError(f"linear_conv_kernel_dim must be at least 2 (got {values['conv_taps']})")
        return dict(values, layer_types=tuple(types))

    def flags(self) -> Flags:
        return Flags(norm="rms_1p")

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return (LayerAttention("full", None, self.rope_theta, None),) * self.num_hidden_layers

    @property
    def delta_norm_eps(self) -> float:
        """The DeltaNet's gated norm's epsilon."""
        return self.norm_eps

    @property
    def delta_beta_scale(self) -> float:
        """beta's factor (OLMo Hybrid's 2, for negative eigenvalues)."""
        return 1.0

    def conv_channels(self) -> int:
        return 2 * self.linear_key_heads * self.linear_key_dim + self.linear_value_heads * self.linear_value_dim

    def state_layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """A DeltaNet layer's states: the conv's last inputs [channels, taps - 1] and S [hv, dk, dv]."""
        return tuple(((self.conv_channels(), self.conv_taps - 1),
                      (self.linear_value_heads, self.linear_key_dim, self.linear_value_dim))
                     if t == "linear_attention" else () for t in self.layer_types)

    def layer_moe(self, layer: int) -> MoESpec | None:
        return None


@dataclass(frozen=True)
class Qwen35MoeConfig(Qwen35Config):
    """Every layer's MLP a mixture of experts: softmax top-k renormalised, and a shared expert behind a
    sigmoid gate (Qwen2-MoE's block)."""

    num_experts: int = 0
    top_k: int = 1
    moe_intermediate_size: int = 0
    shared_intermediate_size: int = 0

    ARCH: ClassVar[str] = "qwen3_5_moe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        _FIELDS, ConfigField("intermediate_size", ("intermediate_size",), default=0),     # no dense MLPs
        *EXPERT_FIELDS, ConfigField("moe_intermediate_size", ("moe_intermediate_size",)),
        ConfigField("shared_intermediate_size", ("shared_expert_intermediate_size",), default=0))

    def layer_moe(self, layer: int) -> MoESpec | None:
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, normalize=True,
                       shared_intermediate_size=self.shared_intermediate_size)


@dataclass(frozen=True)
class Qwen3NextConfig(QwenMoeLayers, Qwen35MoeConfig):
    """Qwen3-Next (80B-A3B): Qwen3.5-MoE's layers before it, its experts every `decoder_sparse_step`-th layer not in
    `mlp_only_layers` (the others a dense MLP of intermediate_size), renormalised where `norm_topk_prob`; the
    DeltaNet's q, k, v, z and b, a projections stored fused a key head ([its q, k, v rows, z rows], [its b, a]),
    split at load into Qwen3.5's in_proj_qkv / in_proj_z / in_proj_b / in_proj_a. (Qwen MoE's layer choice:
    QwenMoeLayers.)"""

    ARCH: ClassVar[str] = "qwen3_next"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        Qwen35MoeConfig.FIELDS, ConfigField("sparse_step", ("decoder_sparse_step",), default=1),
        ConfigField("dense_layers", ("mlp_only_layers",), default=()),
        ConfigField("norm_topk_prob", ("norm_topk_prob",), default=True))


class Qwen35Attention(nn.Module):
    """Gated attention: q_proj's query and gate a head, q/k norms (1 + w), partial RoPE, GQA."""

    kv_dtype: str | None = None

    def __init__(self, c: Qwen35Config):
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        h, d, bias = c.num_attention_heads, c.head_dim, c.attention_bias
        self.q_proj = nn.Linear(c.hidden_size, 2 * h * d, bias=bias)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(h * d, c.hidden_size, bias=bias)
        self.q_norm = Norm(d, c.norm_eps, "rms_1p")
        self.k_norm = Norm(d, c.norm_eps, "rms_1p")
        self.rope = inv_freq(c.rotary_dim, c.rope_theta, None)

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        b, s, _ = x.shape
        h, h_kv, d = self.heads, self.kv_heads, self.head_dim
        q, gate = op.split(op.reshape(self.q_proj(x), (b, s, h, 2 * d)), 2, axis=3)
        k = op.reshape(self.k_proj(x), (b, s, h_kv, d))
        v = op.reshape(self.v_proj(x), (b, s, h_kv, d))
        q, k = (apply_rope(t, positions, *self.rope) for t in (self.q_norm(q), self.k_norm(k)))
        out = cached_attention(kv, layer_id, op.concat([q, k, v], dim=2), h, d ** -0.5, self.kv_dtype)
        return self.o_proj(op.reshape(out * op.sigmoid(gate), (b, s, h * d)))


class GatedDeltaNet(nn.Module):
    """Qwen3.5's linear attention over the layer's state slot (see the module's docstring)."""

    kv_dtype: str | None = None             # unused: the states are float32

    def __init__(self, c: Qwen35Config):
        self.hk, self.hv, self.dk, self.dv = c.linear_key_heads, c.linear_value_heads, c.linear_key_dim, \
            c.linear_value_dim
        self.eps, self.beta_scale = c.delta_norm_eps, c.delta_beta_scale
        key, value = self.hk * self.dk, self.hv * self.dv
        self.in_proj_qkv = nn.Linear(c.hidden_size, 2 * key + value, bias=False)
        self.in_proj_z = nn.Linear(c.hidden_size, value, bias=False)
        self.in_proj_b = nn.Linear(c.hidden_size, self.hv, bias=False)
        self.in_proj_a = nn.Linear(c.hidden_size, self.hv, bias=False)
        self.conv = nn.Parameter((c.conv_channels(), c.conv_taps))
        self.dt_bias = nn.Parameter((self.hv,))
        self.A_log = nn.Parameter((self.hv,))
        self.norm = nn.Parameter((self.dv,))
        self.out_proj = nn.Linear(value, c.hidden_size, bias=False)

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        b, s, _ = x.shape
        hk, hv, dk, dv = self.hk, self.hv, self.dk, self.dv
        mixed = op.silu(kv.recurrent_conv(layer_id, self.in_proj_qkv(x), self.conv))
        q, k, v = op.split(mixed.astype("float32"), [hk * dk, 2 * hk * dk], axis=-1)
        q, k = (_l2norm(op.reshape(t, (b, s, hk, dk))) for t in (q, k))
        q = q * (dk ** -0.5)
        beta = op.sigmoid(self.in_proj_b(x).astype("float32"))
        if self.beta_scale != 1.0:                                      # OLMo Hybrid's negative eigenvalues
            beta = beta * self.beta_scale
        a = self.in_proj_a(x).astype("float32") + self.dt_bias.astype("float32")
        g = op.negative(op.exp(self.A_log.astype("float32"))) * op.softplus(a)
        o = kv.gated_delta(layer_id, q, k, op.reshape(v, (b, s, hv, dv)), g, beta)           # [b, s, hv, dv] f32
        z = op.reshape(self.in_proj_z(x), (b, s, hv, dv)).astype("float32")
        o = op.rms_norm(o, self.norm.astype("float32"), axes=[-1], epsilon=self.eps) * op.silu(z)
        return self.out_proj(op.reshape(o, (b, s, hv * dv)).astype(x.dtype))


def _l2norm(x: Tensor) -> Tensor:
    """x / sqrt(sum(x^2) + 1e-6) over the last axis (the FLA library's and transformers' l2norm)."""
    return x * _rsqrt(op.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def _rsqrt(x: Tensor) -> Tensor:
    return op.divide(op.ones(x.shape, x.dtype), op.sqrt(x))


class Qwen35Layer(nn.Module):
    def __init__(self, c: Qwen35Config, layer: int):
        self.input_layernorm = Norm(c.hidden_size, c.norm_eps, "rms_1p")
        self.mixer = Qwen35Attention(c) if c.layer_types[layer] == "full_attention" else GatedDeltaNet(c)
        self.post_attention_layernorm = Norm(c.hidden_size, c.norm_eps, "rms_1p")
        spec = c.layer_moe(layer)
        self.mlp = SparseMoE(c.hidden_size, spec, Flags()) if spec else MLP(c.hidden_size, c.intermediate_size, Flags())

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        x = x + self.mixer(self.input_layernorm(x), kv, layer_id, positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen35Stack(PositionalStack):
    def __init__(self, c: Qwen35Config):
        super().__init__(c, [Qwen35Layer(c, i) for i in range(c.num_hidden_layers)], "rms_1p")


class Qwen35ForCausalLM(OwnedStackLM):
    """CausalLM's entry functions over Qwen35Stack; its KV cache always the one kiln owns."""

    STACK: ClassVar[type] = Qwen35Stack
    OWNED_ONLY: ClassVar[str] = "Qwen3.5's DeltaNet layers keep a recurrent state a sequence"


def weight_map(c: Qwen35Config) -> WeightMap:
    p = c.weight_prefix
    m: WeightMap = head_weights(c, p)
    for i, kind in enumerate(c.layer_types):
        k, h = f"model.layers.{i}", f"{p}.layers.{i}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            m[f"{k}.{norm}.weight"] = [f"{h}.{norm}.weight"]
        if kind == "full_attention":
            for x in ("q", "k", "v", "o"):
                for part in ("weight", "bias") if c.attention_bias else ("weight",):
                    m[f"{k}.mixer.{x}_proj.{part}"] = [f"{h}.self_attn.{x}_proj.{part}"]
            for x in ("q_norm", "k_norm"):
                m[f"{k}.mixer.{x}.weight"] = [f"{h}.self_attn.{x}.weight"]
        else:
            a = f"{h}.linear_attn"
            for x in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
                m[f"{k}.mixer.{x}.weight"] = [f"{a}.{x}.weight"]
            m[f"{k}.mixer.conv"] = WeightSpec((f"{a}.conv1d.weight",),
                                              lambda w: np.ascontiguousarray(w.reshape(w.shape[0], -1)))
            for x in ("dt_bias", "A_log"):
                m[f"{k}.mixer.{x}"] = [f"{a}.{x}"]
            m[f"{k}.mixer.norm"] = [f"{a}.norm.weight"]
        spec = c.layer_moe(i)
        if spec is None:
            m[f"{k}.mlp.gate_up_proj.weight"] = [f"{h}.mlp.gate_proj.weight", f"{h}.mlp.up_proj.weight"]
            m[f"{k}.mlp.down_proj.weight"] = [f"{h}.mlp.down_proj.weight"]
            continue
        m[f"{k}.mlp.router"] = [f"{h}.mlp.gate.weight"]
        experts = [f"{h}.mlp.experts.{j}" for j in range(spec.num_experts)]       # the checkpoints' (and
        m[f"{k}.mlp.experts_gate_up.weight"] = [f"{e}.{w}_proj.weight" for e in experts for w in ("gate", "up")]
        m[f"{k}.mlp.experts_down.weight"] = [f"{e}.down_proj.weight" for e in experts]   # save_pretrained's) names
        if spec.shared_intermediate_size:
            shared = f"{h}.mlp.shared_expert"
            m[f"{k}.mlp.shared.gate_up_proj.weight"] = [f"{shared}.gate_proj.weight", f"{shared}.up_proj.weight"]
            m[f"{k}.mlp.shared.down_proj.weight"] = [f"{shared}.down_proj.weight"]
            m[f"{k}.mlp.shared_gate"] = [f"{h}.mlp.shared_expert_gate.weight"]
    return m


def next_weight_map(c: Qwen3NextConfig) -> WeightMap:
    """Qwen3.5's map with each DeltaNet layer's fused in_proj_qkvz and in_proj_ba split back into its four."""
    m = weight_map(c)
    r = c.linear_value_heads // c.linear_key_heads
    parts = (c.linear_key_dim, c.linear_key_dim, r * c.linear_value_dim, r * c.linear_value_dim)

    def qkvz(which: str):
        def take(w: np.ndarray) -> np.ndarray:
            q, k, v, z = np.split(w.reshape(c.linear_key_heads, sum(parts), -1), np.cumsum(parts)[:-1], axis=1)
            flat = [t.reshape(-1, w.shape[-1]) for t in (q, k, v, z)]
            return np.ascontiguousarray(np.concatenate(flat[:3]) if which == "qkv" else flat[3])
        return take

    def ba(which: str):
        def take(w: np.ndarray) -> np.ndarray:
            b, a = np.split(w.reshape(c.linear_key_heads, 2 * r, -1), 2, axis=1)
            return np.ascontiguousarray((b if which == "b" else a).reshape(-1, w.shape[-1]))
        return take
    for i, kind in enumerate(c.layer_types):
        if kind != "linear_attention":
            continue
        k, a = f"model.layers.{i}.mixer", f"{c.weight_prefix}.layers.{i}.linear_attn"
        m[f"{k}.in_proj_qkv.weight"] = WeightSpec((f"{a}.in_proj_qkvz.weight",), qkvz("qkv"))
        m[f"{k}.in_proj_z.weight"] = WeightSpec((f"{a}.in_proj_qkvz.weight",), qkvz("z"))
        m[f"{k}.in_proj_b.weight"] = WeightSpec((f"{a}.in_proj_ba.weight",), ba("b"))
        m[f"{k}.in_proj_a.weight"] = WeightSpec((f"{a}.in_proj_ba.weight",), ba("a"))
    return m
