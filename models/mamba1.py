"""Mamba-1 (MambaForCausalLM: the state-spaces models) and TII's Falcon Mamba: a block a layer, each an RMSNorm and a
Mamba-1 mixer behind a residual.

    mixer   x, z = in_proj(h)                       (inner = expand x hidden each)
            x = silu(conv(x) + conv_bias)           (a causal depthwise conv of conv_kernel taps)
            dt, B, C = x_proj(x)                    (time_step_rank, state_size, state_size; Falcon Mamba RMS-norms
                                                     each, without a weight)
            dt = softplus(dt_proj(dt));  A = -exp(A_log)   [inner, state]
            h[c] <- exp(dt[c] A[c]) h[c] + dt[c] x[c] B;  y[c] = h[c] . C + D[c] x[c]
            out_proj(y * silu(z))

The conv's last inputs and the scan's h [inner, state] are a layer's state, kept in a state slot of the KV cache
kiln owns (models/owned_kv.py recurrent_conv / selective_scan, targets/recurrent.py); no layer holds pages. As
for every recurrent model, a state holds every token before it: no prefix sharing, no speculation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .causal_lm import DECODER_FIELDS, DecoderConfig, OwnedStackLM, PositionalStack, WeightMap, WeightSpec
from .config import ConfigField, fields_with
from .layers import Norm
from .mamba2 import MAMBA2_CONTEXT


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

    def kv_layers(self) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
        n = self.num_hidden_layers
        return ((1, 1),) * n, tuple(range(n))

    def state_layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Every layer's states: the conv's last inputs [inner, taps - 1] and h [inner, state]."""
        inner = self.intermediate_size
        return (((inner, self.conv_kernel - 1), (inner, self.state_size)),) * self.num_hidden_layers


@dataclass(frozen=True)
class FalconMambaConfig(MambaConfig):
    ARCH: ClassVar[str] = "falcon_mamba"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*MambaConfig.FIELDS,
                                                 ConfigField("mixer_rms_eps", ("mixer_rms_eps",), default=1e-6))


class Mamba1Mixer(nn.Module):
    kv_dtype: str | None = None             # unused: the states are float32

    def __init__(self, c: MambaConfig):
        inner, self.state, self.rank, self.rms_eps = c.intermediate_size, c.state_size, c.time_step_rank, \
            c.mixer_rms_eps
        self.in_proj = nn.Linear(c.hidden_size, 2 * inner, bias=c.use_bias)
        self.conv = nn.Parameter((inner, c.conv_kernel))
        if c.use_conv_bias:
            self.conv_bias = nn.Parameter((inner,))
        self.x_proj = nn.Linear(inner, self.rank + 2 * self.state, bias=False)
        self.dt_proj = nn.Linear(self.rank, inner, bias=True)
        self.A_log = nn.Parameter((inner, self.state))
        self.D = nn.Parameter((inner,))
        self.out_proj = nn.Linear(inner, c.hidden_size, bias=c.use_bias)

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor | None = None) -> Tensor:
        xs, z = op.split(self.in_proj(x), 2, axis=-1)
        xs = kv.recurrent_conv(layer_id, xs, self.conv)
        if hasattr(self, "conv_bias"):
            xs = xs + self.conv_bias
        xs = op.silu(xs)
        dt, B, C = (t.astype("float32") for t in op.split(self.x_proj(xs), [self.rank, self.rank + self.state],
                                                             axis=-1))
        if self.rms_eps is not None:                # Falcon Mamba: dt, B and C RMS-normed, no weight
            dt, B, C = (op.rms_norm(t, op.ones((int(t.shape[-1]),), "float32"), axes=[-1], epsilon=self.rms_eps)
                        for t in (dt, B, C))
        dt = op.softplus(self.dt_proj(dt.astype(x.dtype)).astype("float32"))
        xf = xs.astype("float32")
        y = kv.selective_scan(layer_id, xf, dt, op.negative(op.exp(self.A_log.astype("float32"))), B, C)
        y = (y + xf * self.D.astype("float32")) * op.silu(z.astype("float32"))
        return self.out_proj(y.astype(x.dtype))


class MambaBlock(nn.Module):
    def __init__(self, c: MambaConfig):
        self.norm = Norm(c.hidden_size, c.norm_eps)
        self.mixer = Mamba1Mixer(c)

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        return x + self.mixer(self.norm(x), kv, layer_id, positions)


class MambaStack(PositionalStack):
    def __init__(self, c: MambaConfig):
        super().__init__(c, [MambaBlock(c) for _ in range(c.num_hidden_layers)])


class MambaForCausalLM(OwnedStackLM):
    """CausalLM's entry functions over MambaStack; its KV cache always the one kiln owns."""

    STACK: ClassVar[type] = MambaStack
    OWNED_ONLY: ClassVar[str] = "Mamba's layers keep a recurrent state a sequence"


def mamba1_weights(c: MambaConfig, kiln: str, hf: str) -> WeightMap:
    """A Mamba-1 mixer's weights: kiln's `kiln` from the checkpoint's `hf` (their shared names)."""
    m: WeightMap = {f"{kiln}.{x}.weight": [f"{hf}.{x}.weight"] for x in ("in_proj", "x_proj", "dt_proj", "out_proj")}
    m[f"{kiln}.dt_proj.bias"] = [f"{hf}.dt_proj.bias"]
    if c.use_bias:
        m.update({f"{kiln}.{x}.bias": [f"{hf}.{x}.bias"] for x in ("in_proj", "out_proj")})
    m[f"{kiln}.conv"] = WeightSpec((f"{hf}.conv1d.weight",), lambda w: np.ascontiguousarray(w.reshape(w.shape[0], -1)))
    if c.use_conv_bias:
        m[f"{kiln}.conv_bias"] = [f"{hf}.conv1d.bias"]
    m.update({f"{kiln}.{x}": [f"{hf}.{x}"] for x in ("A_log", "D")})
    return m


def weight_map(c: MambaConfig) -> WeightMap:
    m: WeightMap = {"model.embed_tokens.weight": ["backbone.embeddings.weight"],
                    "model.norm.weight": ["backbone.norm_f.weight"]}
    if not c.tie_word_embeddings:
        m["lm_head.weight"] = ["lm_head.weight"]
    for i in range(c.num_hidden_layers):
        k, h = f"model.layers.{i}", f"backbone.layers.{i}"
        m[f"{k}.norm.weight"] = [f"{h}.norm.weight"]
        m.update(mamba1_weights(c, f"{k}.mixer", f"{h}.mixer"))
    return m
