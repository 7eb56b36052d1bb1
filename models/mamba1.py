"""Mamba-1 (MambaForCausalLM: the state-spaces models) and TII's Falcon Mamba: a block a layer, each an RMSNorm and a
Mamba-1 mixer behind a residual; AI21's Jamba: Mamba-1 layers (dt, B and C RMS-normed with weights) among
attention ones, experts every other layer.

    mixer   x, z = in_proj(h)                       (inner = expand x hidden each)
            x = silu(conv(x) + conv_bias)           (a causal depthwise conv of conv_kernel taps)
            dt, B, C = x_proj(x)                    (time_step_rank, state_size, state_size; Falcon Mamba RMS-norms
                                                     each, without a weight)
            dt = softplus(dt_proj(dt));  A = -exp(A_log)   [inner, state]
            h[c] <- exp(dt[c] A[c]) h[c] + dt[c] x[c] B;  y[c] = h[c] . C + D[c] x[c]
            out_proj(y * silu(z))

The conv's last inputs and the scan's h [inner, state] are a layer's state, kept in a state slot of the KV cache
kiln owns (models/owned_kv.py recurrent_conv / selective_scan, targets/recurrent.py); no layer holds pages. As
for every recurrent model, a state holds every token before it: no forks but at a sequence's end, prefix-cache
entries continued whole (runtime/scheduler.py), no speculation.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .causal_lm import (DECODER_FIELDS, LLAMA_NAMES, DecoderConfig, LayerAttention, OwnedStackLM, PositionalStack,
                        WeightMap, WeightSpec, decoder_weight_map, head_weights)
from .config import ConfigField, fields_with
from .layers import Norm
from .llama import LlamaConfig
from .mamba2 import MAMBA2_CONTEXT, HybridLM, HybridStack
from .moe import MoESpec


@dataclass(frozen=True)
class MambaConfig(DecoderConfig):
    state_size: int = 16
    conv_kernel: int = 4
    expand: int = 2
    time_step_rank: int = 0
    use_bias: bool = False
    use_conv_bias: bool = True
    mixer_rms_eps: float | None = None      # Falcon Mamba's norms of dt, B and C

    ARCH: ClassVar[str] = "mamba"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("intermediate_size", ("intermediate_size",), default=0),
        ConfigField("num_attention_heads", ("num_attention_heads",), default=1),
        ConfigField("context_window_size", ("max_position_embeddings",), default=MAMBA2_CONTEXT),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("norm_eps", ("layer_norm_epsilon", "rms_norm_eps"), default=1e-5),
        ConfigField("state_size", ("state_size",), default=16), ConfigField("conv_kernel", ("conv_kernel",), default=4),
        ConfigField("expand", ("expand",), default=2), ConfigField("time_step_rank", ("time_step_rank",), default=None),
        ConfigField("use_bias", ("use_bias",), default=False),
        ConfigField("use_conv_bias", ("use_conv_bias",), default=True),
        ConfigField("activation", ("hidden_act",), default="silu"))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if values.pop("activation") != "silu":
            raise ValueError(f"{cls.ARCH} with a hidden_act other than silu is not supported (released ones use silu)")
        rank = values["time_step_rank"]
        if rank in (None, "auto"):                  # transformers' "auto": ceil(hidden / 16)
            rank = math.ceil(values["hidden_size"] / 16)
        if values["conv_kernel"] < 2:
            raise ValueError(f"conv_kernel must be at least 2 (got {values['conv_kernel']})")
        return dict(values, time_step_rank=int(rank), intermediate_size=values["expand"] * values["hidden_size"])

    def mixer_spec(self) -> Mamba1Spec:
        return Mamba1Spec(self.hidden_size, self.intermediate_size, self.state_size, self.time_step_rank,
                          self.conv_kernel, self.use_bias, self.use_conv_bias,
                          None if self.mixer_rms_eps is None else "weightless", self.mixer_rms_eps or 1e-6)

    def state_layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        return (self.mixer_spec().states(),) * self.num_hidden_layers


@dataclass(frozen=True)
class FalconMambaConfig(MambaConfig):
    ARCH: ClassVar[str] = "falcon_mamba"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*MambaConfig.FIELDS,
                                                 ConfigField("mixer_rms_eps", ("mixer_rms_eps",), default=1e-6))


@dataclass(frozen=True)
class Mamba1Spec:
    """A Mamba-1 mixer's sizes."""

    hidden: int
    inner: int
    state: int
    rank: int                               # dt's low rank (time_step_rank)
    taps: int
    bias: bool                              # in_proj's and out_proj's
    conv_bias: bool
    norms: str | None = None                # dt, B and C RMS-normed: "weightless" (Falcon Mamba), "weighted" (Jamba)
    norm_eps: float = 1e-6

    def states(self) -> tuple[tuple[int, ...], ...]:
        """The layer's states: the conv's last inputs [inner, taps - 1] and h [inner, state]."""
        return (self.inner, self.taps - 1), (self.inner, self.state)


class Mamba1Mixer(nn.Module):
    kv_dtype: str | None = None             # unused: the states are float32

    def __init__(self, spec: Mamba1Spec):
        self.spec = spec
        inner, state, rank = spec.inner, spec.state, spec.rank
        self.in_proj = nn.Linear(spec.hidden, 2 * inner, bias=spec.bias)
        self.conv = nn.Parameter((inner, spec.taps))
        if spec.conv_bias:
            self.conv_bias = nn.Parameter((inner,))
        self.x_proj = nn.Linear(inner, rank + 2 * state, bias=False)
        self.dt_proj = nn.Linear(rank, inner, bias=True)
        self.A_log = nn.Parameter((inner, state))
        self.D = nn.Parameter((inner,))
        self.out_proj = nn.Linear(inner, spec.hidden, bias=spec.bias)
        if spec.norms == "weighted":
            self.dt_layernorm, self.b_layernorm, self.c_layernorm = (Norm(n, spec.norm_eps) for n in (rank, state,
                                                                                                      state))

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor | None = None) -> Tensor:
        spec = self.spec
        xs, z = op.split(self.in_proj(x), 2, axis=-1)
        xs = kv.recurrent_conv(layer_id, xs, self.conv)
        if hasattr(self, "conv_bias"):
            xs = xs + self.conv_bias
        xs = op.silu(xs)
        dt, B, C = op.split(self.x_proj(xs), [spec.rank, spec.rank + spec.state], axis=-1)
        if spec.norms == "weighted":
            dt, B, C = self.dt_layernorm(dt), self.b_layernorm(B), self.c_layernorm(C)
        dt, B, C = (t.astype("float32") for t in (dt, B, C))
        if spec.norms == "weightless":
            dt, B, C = (op.rms_norm(t, op.ones((int(t.shape[-1]),), "float32"), axes=[-1], epsilon=spec.norm_eps)
                        for t in (dt, B, C))
        dt = op.softplus(self.dt_proj(dt.astype(x.dtype)).astype("float32"))
        xf = xs.astype("float32")
        y = kv.selective_scan(layer_id, xf, dt, op.negative(op.exp(self.A_log.astype("float32"))), B, C)
        y = (y + xf * self.D.astype("float32")) * op.silu(z.astype("float32"))
        return self.out_proj(y.astype(x.dtype))


class MambaBlock(nn.Module):
    def __init__(self, c: MambaConfig):
        self.norm = Norm(c.hidden_size, c.norm_eps)
        self.mixer = Mamba1Mixer(c.mixer_spec())

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        return x + self.mixer(self.norm(x), kv, layer_id, positions)


class MambaStack(PositionalStack):
    def __init__(self, c: MambaConfig):
        super().__init__(c, [MambaBlock(c) for _ in range(c.num_hidden_layers)])


class MambaForCausalLM(OwnedStackLM):
    """CausalLM's entry functions over MambaStack; its KV cache always the one kiln owns."""

    STACK: ClassVar[type] = MambaStack
    OWNED_ONLY: ClassVar[str] = "Mamba's layers keep a recurrent state a sequence"


def mamba1_weights(spec: Mamba1Spec, kiln: str, hf: str) -> WeightMap:
    """A Mamba-1 mixer's weights: kiln's `kiln` from the checkpoint's `hf` (their shared names)."""
    m: WeightMap = {f"{kiln}.{x}.weight": [f"{hf}.{x}.weight"] for x in ("in_proj", "x_proj", "dt_proj", "out_proj")}
    m[f"{kiln}.dt_proj.bias"] = [f"{hf}.dt_proj.bias"]
    if spec.bias:
        m.update({f"{kiln}.{x}.bias": [f"{hf}.{x}.bias"] for x in ("in_proj", "out_proj")})
    m[f"{kiln}.conv"] = WeightSpec((f"{hf}.conv1d.weight",), lambda w: np.ascontiguousarray(w.reshape(w.shape[0], -1)))
    if spec.conv_bias:
        m[f"{kiln}.conv_bias"] = [f"{hf}.conv1d.bias"]
    m.update({f"{kiln}.{x}": [f"{hf}.{x}"] for x in ("A_log", "D")})
    if spec.norms == "weighted":
        m.update({f"{kiln}.{x}.weight": [f"{hf}.{x}.weight"] for x in ("dt_layernorm", "b_layernorm", "c_layernorm")})
    return m


def weight_map(c: MambaConfig) -> WeightMap:
    m: WeightMap = head_weights(c, "backbone", "embeddings", "norm_f")
    for i in range(c.num_hidden_layers):
        k, h = f"model.layers.{i}", f"backbone.layers.{i}"
        m[f"{k}.norm.weight"] = [f"{h}.norm.weight"]
        m.update(mamba1_weights(c.mixer_spec(), f"{k}.mixer", f"{h}.mixer"))
    return m


# -- Jamba -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JambaConfig(LlamaConfig):
    """AI21's Jamba (1.5 / 1.6 / 1.7 Mini and Large, Jamba Reasoning 3B): attention every `attn_layer_period`-th
    layer from `attn_layer_offset` (no RoPE), Mamba-1 layers with RMS-normed dt, B and C elsewhere; experts every
    `expert_layer_period`-th layer from `expert_layer_offset` (softmax top-k, the weights left unnormalised), MLPs
    elsewhere."""

    mamba: Mamba1Spec | None = None
    mamba_layers: tuple[int, ...] = ()
    expert_layers: tuple[int, ...] = ()
    num_experts: int = 1
    top_k: int = 1

    ARCH: ClassVar[str] = "jamba"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *LlamaConfig.FIELDS, ConfigField("num_experts", ("num_experts",), default=16),
        ConfigField("top_k", ("num_experts_per_tok",), default=2),
        *(ConfigField(name, (name,), default=default) for name, default in (
            ("expert_layer_period", 2), ("expert_layer_offset", 1), ("attn_layer_period", 8), ("attn_layer_offset", 4),
            ("mamba_d_state", 16), ("mamba_d_conv", 4), ("mamba_expand", 2), ("mamba_dt_rank", "auto"),
            ("mamba_conv_bias", True), ("mamba_proj_bias", False))))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n, hidden = values["num_hidden_layers"], values["hidden_size"]
        attn = (values.pop("attn_layer_period"), values.pop("attn_layer_offset"))
        experts = (values.pop("expert_layer_period"), values.pop("expert_layer_offset"))
        rank = values.pop("mamba_dt_rank")
        spec = Mamba1Spec(hidden, values.pop("mamba_expand") * hidden, values.pop("mamba_d_state"),
                          math.ceil(hidden / 16) if rank in (None, "auto") else int(rank), values.pop("mamba_d_conv"),
                          values.pop("mamba_proj_bias"), values.pop("mamba_conv_bias"), "weighted", values["norm_eps"])
        return super().adapt(dict(values, mamba=spec, mamba_layers=tuple(i for i in range(n) if i % attn[0] != attn[1]),
                                  expert_layers=tuple(i for i in range(n) if values["num_experts"] > 1
                                                      and i % experts[0] == experts[1])), hf, notes)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return tuple(dataclasses.replace(a, rope=False) for a in super().layer_attention())

    def layer_moe(self, layer: int) -> MoESpec | None:
        return MoESpec(self.num_experts, self.top_k, self.intermediate_size, normalize=False) \
            if layer in self.expert_layers else None

    def state_layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        return tuple(self.mamba.states() if i in self.mamba_layers else () for i in range(self.num_hidden_layers))


class JambaStack(HybridStack):
    MIXER: ClassVar[Callable] = staticmethod(lambda c: Mamba1Mixer(c.mamba))


class JambaForCausalLM(HybridLM):
    STACK: ClassVar[type] = JambaStack


def jamba_weight_map(c: JambaConfig) -> WeightMap:
    names = {"norm": "model.final_layernorm", "post_attention_layernorm": "pre_ff_layernorm",
             "gate_proj": "feed_forward.gate_proj", "up_proj": "feed_forward.up_proj",
             "down_proj": "feed_forward.down_proj"}
    m = decoder_weight_map(c, {**LLAMA_NAMES, **names})
    for i in c.mamba_layers:
        k = f"model.layers.{i}.self_attn"
        for key in [key for key in m if key.startswith(f"{k}.")]:
            del m[key]
        m.update(mamba1_weights(c.mamba, k, f"model.layers.{i}.mamba"))
    for i in c.expert_layers:
        k, h = f"model.layers.{i}.mlp", f"model.layers.{i}.feed_forward"
        for key in [key for key in m if key.startswith(f"{k}.")]:
            del m[key]
        m[f"{k}.router"] = [f"{h}.router.weight"]
        experts = [f"{h}.experts.{j}" for j in range(c.num_experts)]
        m[f"{k}.experts_gate_up.weight"] = [f"{e}.{w}_proj.weight" for e in experts for w in ("gate", "up")]
        m[f"{k}.experts_down.weight"] = [f"{e}.down_proj.weight" for e in experts]
    return m
