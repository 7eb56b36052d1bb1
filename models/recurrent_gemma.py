"""Google's RecurrentGemma (Griffin: 2B, 9B): residual blocks whose temporal mixing is a recurrent block in two of
every three layers (`block_types`) and local attention in the third, each followed by a gated MLP.

    block       x = x + temporal(n1(x));  x = x + mlp(n2(x))        norms x (1 + w), as Gemma's
    recurrent   y = gelu(linear_y(h));  u = conv(linear_x(h))          (a causal depthwise conv with a bias)
                u = rg_lru(u);  out = linear_out(u * y)               (every Linear with a bias)
    rg_lru      i = sigmoid(blockdiag_i(u));  r = sigmoid(blockdiag_a(u))   (a [width, width] matrix per head)
                log a = -8 r softplus(Lambda);  h_t = a h_t-1 + sqrt(1 - a^2) (i u)   (sqrt(...) 1 at position 0)
    attention   GQA over the last attention_window_size tokens, RoPE on half of each head, o_proj with a bias
    mlp         down(gelu(gate(h)) * up(h)), each of intermediate_size / 2, with biases

The embeddings are scaled by sqrt(hidden) rounded to bfloat16 (transformers keeps it a bfloat16 constant) and the
logits soft-capped (`logits_soft_cap`). The RG-LRU's recurrence is Mamba-2's scan with a head per channel (one
state entry, one value: S <- e^(log a) S + x'), run by the kernels of the KV cache kiln owns (targets/recurrent.py),
its state beside the conv's last inputs in the layer's slot; the attention layers' window is the cache's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .causal_lm import (DECODER_FIELDS, DecoderConfig, LayerAttention, OwnedStackLM, PositionalStack, WeightMap,
                        WeightSpec, head_weights)
from .config import ConfigField, fields_with
from .bnb import rounded
from .layers import MLP, Flags, Norm, PagedAttention, _activation, scalar
from .rope import inv_freq

_RECURRENT, _ATTENTION = ("recurrent", "linear_attention"), ("attention", "sliding_attention")
_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu"}


@dataclass(frozen=True)
class RecurrentGemmaConfig(DecoderConfig):
    lru_width: int = 0
    conv_width: int = 4
    window: int = 2048
    logits_soft_cap: float = 30.0
    activation: str = "gelu_tanh"
    attention_bias: bool = False
    recurrent_layers: tuple[int, ...] = ()

    ARCH: ClassVar[str] = "recurrent_gemma"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("partial_rotary_factor", ("partial_rotary_factor",), default=0.5),
        ConfigField("lru_width", ("lru_width",), default=None),
        ConfigField("conv_width", ("conv1d_width",), default=4),
        ConfigField("window", ("attention_window_size",), default=2048),
        ConfigField("logits_soft_cap", ("logits_soft_cap",), default=30.0),
        ConfigField("activation", ("hidden_activation",), default="gelu_pytorch_tanh"),
        ConfigField("attention_bias", ("attention_bias",), default=False),
        ConfigField("block_types", ("block_types",), default=("recurrent", "recurrent", "attention")))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n, heads = values["num_hidden_layers"], values["num_attention_heads"]
        kinds = (list(values.pop("block_types")) * n)[:n]            # the pattern repeated, as transformers does
        if not kinds or set(kinds) - {*_RECURRENT, *_ATTENTION}:
            raise ValueError(f"block_types must list 'recurrent' or 'attention' blocks; got {kinds}; fix config.json")
        if values["activation"] not in _ACTIVATIONS:
            raise ValueError(f"hidden_activation {values['activation']!r} is not supported ({', '.join(_ACTIVATIONS)})")
        width = values["lru_width"] or values["hidden_size"]
        if width % heads:
            raise ValueError(f"num_attention_heads ({heads}) must divide lru_width ({width}); fix config.json")
        values = dict(values, lru_width=width, activation=_ACTIVATIONS[values["activation"]],
                      recurrent_layers=tuple(i for i, k in enumerate(kinds) if k in _RECURRENT))
        return super().adapt(values, hf, notes)

    def flags(self) -> Flags:
        return Flags(norm="rms_1p", activation=self.activation, qkv_bias=self.attention_bias, o_bias=True,
                     mlp_bias=True, embed_scale=float(rounded(np.float32([self.hidden_size ** 0.5]), "bfloat16")[0]),
                     final_logit_softcap=self.logits_soft_cap or None)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        window = self.window if self.window < self.context_window_size else None
        return tuple(LayerAttention("full", None, self.rope_theta, None, rope=False) if i in self.recurrent_layers
                     else LayerAttention("sliding" if window else "full", window, self.rope_theta, self.rope_scaling)
                     for i in range(self.num_hidden_layers))

    def state_layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """A recurrent layer's states: the conv's last inputs [width, taps - 1], the RG-LRU's h [width, 1, 1]."""
        states = ((self.lru_width, self.conv_width - 1), (self.lru_width, 1, 1))
        return tuple(states if i in self.recurrent_layers else () for i in range(self.num_hidden_layers))


class RGLRU(nn.Module):
    """The recurrent block: its branches, conv and Real-Gated Linear Recurrent Unit."""

    def __init__(self, c: RecurrentGemmaConfig):
        w, heads = c.lru_width, c.num_attention_heads
        self.width, self.heads, self.activation = w, heads, c.activation
        self.linear_y = nn.Linear(c.hidden_size, w, bias=True)
        self.linear_x = nn.Linear(c.hidden_size, w, bias=True)
        self.linear_out = nn.Linear(w, c.hidden_size, bias=True)
        self.conv = nn.Parameter((w, c.conv_width))
        self.conv_bias = nn.Parameter((w,))
        block = w // heads
        self.input_gate_weight = nn.Parameter((heads, block, block), "float32")
        self.input_gate_bias = nn.Parameter((heads, block), "float32")
        self.recurrent_gate_weight = nn.Parameter((heads, block, block), "float32")
        self.recurrent_gate_bias = nn.Parameter((heads, block), "float32")
        self.recurrent_param = nn.Parameter((w,), "float32")

    def to(self, dtype: str | None = None) -> None:
        super().to(dtype)
        for name in ("input_gate_weight", "input_gate_bias", "recurrent_gate_weight", "recurrent_gate_bias",
                     "recurrent_param"):       # kept float32 under any compute dtype: the recurrence runs in it
            getattr(self, name).to("float32")

    def _gate(self, u: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """sigmoid(u's block per head times that head's [block, block] matrix, plus its bias): [n, width]."""
        n = u.shape[0]
        heads, block = self.heads, self.width // self.heads
        out = op.matmul(op.reshape(u, (n, heads, 1, block)), weight)                    # [n, heads, 1, block]
        return op.sigmoid(op.reshape(out, (n, self.width)) + op.reshape(bias, (self.width,)))

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        b, s, _ = x.shape
        w = self.width
        y = _activation(self.linear_y(x), self.activation)
        u = kv.recurrent_conv(layer_id, self.linear_x(x), self.conv) + self.conv_bias
        uf = op.reshape(u.astype("float32"), (b * s, w))
        i = self._gate(uf, self.input_gate_weight, self.input_gate_bias)
        r = self._gate(uf, self.recurrent_gate_weight, self.recurrent_gate_bias)
        log_a = r * op.negative(op.softplus(self.recurrent_param)) * scalar(8.0)
        scale = op.sqrt(scalar(1.0) - op.exp(log_a * scalar(2.0)))
        first = op.reshape(op.equal(positions, op.zeros(positions.shape, positions.dtype)).astype("float32"),
                           (b * s, 1))
        scale = scale + first * (scalar(1.0) - scale)                                   # position 0: 1
        xs = op.reshape(uf * i * scale, (b, s, w, 1))
        one = op.ones((b, s, 1, 1), "float32")
        h = kv.gated_delta(layer_id, one, one, xs, op.reshape(log_a, (b, s, w)), op.ones((b, s, w), "float32"),
                           delta=False)                                                  # h <- a h + x'
        return self.linear_out((op.reshape(h, (b, s, w)) * y.astype("float32")).astype(x.dtype))


class ResidualBlock(nn.Module):
    def __init__(self, c: RecurrentGemmaConfig, layer: int):
        flags = c.flags()
        self.temporal_pre_norm = Norm(c.hidden_size, c.norm_eps, "rms_1p")
        if layer in c.recurrent_layers:
            self.recurrent = RGLRU(c)
        else:
            rope = inv_freq(c.rotary_dim, c.rope_theta, c.rope_scaling)
            self.self_attn = PagedAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                            flags, c.norm_eps, rope)
        self.channel_pre_norm = Norm(c.hidden_size, c.norm_eps, "rms_1p")
        self.mlp = MLP(c.hidden_size, c.intermediate_size // 2, flags)

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        h = self.temporal_pre_norm(x)
        mixer = self.recurrent if hasattr(self, "recurrent") else self.self_attn
        x = x + mixer(h, kv, layer_id, positions)
        return x + self.mlp(self.channel_pre_norm(x))


class RecurrentGemmaStack(PositionalStack):
    def __init__(self, c: RecurrentGemmaConfig):
        super().__init__(c, [ResidualBlock(c, i) for i in range(c.num_hidden_layers)], "rms_1p")


class RecurrentGemmaForCausalLM(OwnedStackLM):
    """CausalLM's entry functions over RecurrentGemmaStack; its KV cache always the one kiln owns."""

    STACK: ClassVar[type] = RecurrentGemmaStack
    OWNED_ONLY: ClassVar[str] = "RecurrentGemma's recurrent blocks keep a state a sequence"


def weight_map(c: RecurrentGemmaConfig) -> WeightMap:
    m: WeightMap = head_weights(c, norm="final_norm")
    for i in range(c.num_hidden_layers):
        k = hf = f"model.layers.{i}"
        for norm in ("temporal_pre_norm", "channel_pre_norm"):
            m[f"{k}.{norm}.weight"] = [f"{hf}.{norm}.weight"]
        t = f"{hf}.temporal_block"
        if i in c.recurrent_layers:
            r = f"{k}.recurrent"
            for lin in ("linear_y", "linear_x", "linear_out"):
                m.update({f"{r}.{lin}.{p}": [f"{t}.{lin}.{p}"] for p in ("weight", "bias")})
            m[f"{r}.conv"] = WeightSpec((f"{t}.conv_1d.weight",), lambda w: np.ascontiguousarray(w.reshape(w.shape[0],
                                                                                                        -1)))
            m[f"{r}.conv_bias"] = [f"{t}.conv_1d.bias"]
            for p in ("input_gate_weight", "input_gate_bias", "recurrent_gate_weight", "recurrent_gate_bias",
                      "recurrent_param"):
                m[f"{r}.{p}"] = [f"{t}.rg_lru.{p}"]
        else:
            a = f"{k}.self_attn"
            m[f"{a}.qkv_proj.weight"] = [f"{t}.{p}_proj.weight" for p in "qkv"]
            if c.attention_bias:
                m[f"{a}.qkv_proj.bias"] = [f"{t}.{p}_proj.bias" for p in "qkv"]
            m.update({f"{a}.o_proj.{p}": [f"{t}.o_proj.{p}"] for p in ("weight", "bias")})
        f = f"{hf}.mlp_block"
        for p in ("weight", "bias"):
            m[f"{k}.mlp.gate_up_proj.{p}"] = [f"{f}.gate_proj.{p}", f"{f}.up_proj.{p}"]
            m[f"{k}.mlp.down_proj.{p}"] = [f"{f}.down_proj.{p}"]
    return m

