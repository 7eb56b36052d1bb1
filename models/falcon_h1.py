"""TII's Falcon-H1 (0.5B-34B, Falcon-H1R, Falcon-H1-Tiny): attention and Mamba-2 side by side in every layer.

    layer   h = rmsnorm(x)
            x = x + mamba(h * ssm_in) * ssm_out + attention(h * attention_in) * attention_out
            x = x + down(up(n2(x)) * silu(gate(n2(x)) * mlp[0])) * mlp[1]
    mamba   models/mamba2.py's mixer with in_proj's outputs (z, x, B, C, dt) each times its ssm_multipliers entry,
            inner width mamba_d_ssm, and its gated norm optional (mamba_rms_norm; before or after the gate)
    attention  GQA with RoPE, the keys times key_multiplier; the embeddings times embedding_multiplier, the logits
            times lm_head_multiplier

Every multiplier but the embeddings' and the logits' is a constant on a linear map's inputs or outputs, so it is
folded into that map's rows or columns at load (exact but for float rounding): the graph is a plain parallel hybrid.
A layer holds both keys and values and a recurrent state, and the KV cache kiln owns gives a cache layer one or the
other: layer i attends over cache layer i, and its Mamba-2 keeps its state in cache layer L + i (L layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor

from .causal_lm import LayerAttention, OwnedStackLM, PositionalStack, WeightMap, WeightSpec, head_weights
from .config import ConfigField
from .layers import MLP, Flags, Norm, PagedAttention
from .llama import LlamaConfig
from .mamba2 import MAMBA_FIELDS, Mamba2Fields, Mamba2Mixer, mamba_weights
from .rope import inv_freq

_MULTIPLIERS = ("embedding_multiplier", "lm_head_multiplier", "key_multiplier", "attention_in_multiplier",
                "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier")


@dataclass(frozen=True)
class FalconH1Config(Mamba2Fields, LlamaConfig):
    mamba_inner_size: int | None = None     # mamba_d_ssm (None: expand x hidden)
    projectors_bias: bool = False
    ssm_multipliers: tuple[float, ...] = (1.0,) * 5
    mlp_multipliers: tuple[float, float] = (1.0, 1.0)
    embedding_multiplier: float = 1.0
    lm_head_multiplier: float = 1.0
    key_multiplier: float = 1.0
    attention_in_multiplier: float = 1.0
    attention_out_multiplier: float = 1.0
    ssm_in_multiplier: float = 1.0
    ssm_out_multiplier: float = 1.0

    ARCH: ClassVar[str] = "falcon_h1"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *LlamaConfig.FIELDS, *MAMBA_FIELDS, ConfigField("mamba_inner_size", ("mamba_d_ssm",), default=None),
        ConfigField("mamba_rms_norm", ("mamba_rms_norm",), default=False),
        ConfigField("norm_before_gate", ("mamba_norm_before_gate",), default=True),
        ConfigField("projectors_bias", ("projectors_bias",), default=False),
        ConfigField("ssm_multipliers", ("ssm_multipliers",), default=None),
        ConfigField("mlp_multipliers", ("mlp_multipliers",), default=None),
        *(ConfigField(name, (name,), default=1.0) for name in _MULTIPLIERS))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n, inner = values["num_hidden_layers"], values["mamba_inner_size"]
        rms_norm, before_gate = values.pop("mamba_rms_norm"), values.pop("norm_before_gate")
        norm = ("before_gate" if before_gate else "gated") if rms_norm else "none"
        ssm = tuple(float(m) for m in (values["ssm_multipliers"] or (1.0,) * 5))
        mlp = tuple(float(m) for m in (values["mlp_multipliers"] or (1.0, 1.0)))
        if len(ssm) != 5 or len(mlp) != 2:
            raise ValueError(f"ssm_multipliers needs 5 values (z, x, B, C, dt) and mlp_multipliers 2 (gate, down); got "
                             f"{list(ssm)} and {list(mlp)}; fix config.json")
        values = cls.mamba_values(dict(values, mamba_norm=norm, ssm_multipliers=ssm, mlp_multipliers=mlp,
                                       mamba_out_bias=values["projectors_bias"]), range(n), inner)
        return super().adapt(values, hf, notes)

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, mlp_bias=self.mlp_bias,
                     embed_scale=self.embedding_multiplier, logit_divisor=1.0 / self.lm_head_multiplier)

    # The KV cache's layers: each layer's attention (0..L-1), then each layer's Mamba-2 state (L..2L-1).
    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return super().layer_attention() + (LayerAttention("full", None, self.rope_theta, None, rope=False),) * \
            self.num_hidden_layers

    def state_layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        return ((),) * self.num_hidden_layers + (self.mamba_states(),) * self.num_hidden_layers


class FalconH1Layer(nn.Module):
    def __init__(self, c: FalconH1Config, layer: int):
        flags = c.flags()
        self.layers = c.num_hidden_layers
        self.input_layernorm = Norm(c.hidden_size, c.norm_eps)
        self.mamba = Mamba2Mixer(c)
        self.self_attn = PagedAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, flags,
                                        c.norm_eps, inv_freq(c.rotary_dim, c.rope_theta, c.rope_scaling))
        self.post_attention_layernorm = Norm(c.hidden_size, c.norm_eps)
        self.mlp = MLP(c.hidden_size, c.intermediate_size, flags)

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        h = self.input_layernorm(x)
        x = x + self.mamba(h, kv, self.layers + layer_id) + self.self_attn(h, kv, layer_id, positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class FalconH1Stack(PositionalStack):
    def __init__(self, c: FalconH1Config):
        super().__init__(c, [FalconH1Layer(c, i) for i in range(c.num_hidden_layers)])


class FalconH1ForCausalLM(OwnedStackLM):
    """CausalLM's entry functions over FalconH1Stack; its KV cache always the one kiln owns."""

    STACK: ClassVar[type] = FalconH1Stack
    OWNED_ONLY: ClassVar[str] = "Falcon-H1's layers keep a Mamba-2 state beside their keys and values"


def _rows(scale: np.ndarray):
    """A transform multiplying each row (axis 0) of a weight or bias by `scale` (one value, or one a row)."""
    def apply(w: np.ndarray) -> np.ndarray:
        s = np.asarray(scale, np.float32)
        return (w * (s.reshape(-1, *[1] * (w.ndim - 1)) if s.ndim else s)).astype(w.dtype)
    return apply


def weight_map(c: FalconH1Config) -> WeightMap:
    m: WeightMap = head_weights(c, norm="final_layernorm")
    h, kv, d, inner = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.mamba_inner
    z, x, bc, dt = c.ssm_multipliers[0], c.ssm_multipliers[1], c.ssm_multipliers[2:4], c.ssm_multipliers[4]
    bc_width = c.mamba_groups * c.mamba_state
    mup = np.concatenate([np.full(inner, z), np.full(inner, x), np.full(bc_width, bc[0]), np.full(bc_width, bc[1]),
                          np.full(c.mamba_heads, dt)]).astype(np.float32)
    qkv = np.concatenate([np.ones(h * d), np.full(kv * d, c.key_multiplier), np.ones(kv * d)]) * \
        c.attention_in_multiplier
    gate_up = np.concatenate([np.full(c.intermediate_size, c.mlp_multipliers[0]), np.ones(c.intermediate_size)])
    for i in range(c.num_hidden_layers):
        k = hf = f"model.layers.{i}"
        m[f"{k}.input_layernorm.weight"] = [f"{hf}.input_layernorm.weight"]
        m[f"{k}.post_attention_layernorm.weight"] = [f"{hf}.pre_ff_layernorm.weight"]
        mamba = mamba_weights(c, f"{k}.mamba", f"{hf}.mamba")
        for part in [p for p in mamba if ".in_proj." in p]:       # its inputs times ssm_in, its outputs times mup
            m[part] = WeightSpec(tuple(mamba[part]), _rows(mup * (c.ssm_in_multiplier if part.endswith("weight")
                                                                  else 1.0)))
        for part in [p for p in mamba if ".out_proj." in p]:
            m[part] = WeightSpec(tuple(mamba[part]), _rows(c.ssm_out_multiplier))
        m.update({p: e for p, e in mamba.items() if p not in m})
        a = f"{hf}.self_attn"
        for part in ("weight", "bias") if c.attention_bias else ("weight",):
            scale = qkv if part == "weight" else qkv / c.attention_in_multiplier
            m[f"{k}.self_attn.qkv_proj.{part}"] = WeightSpec(tuple(f"{a}.{p}_proj.{part}" for p in "qkv"),
                                                             _rows(scale))
        m[f"{k}.self_attn.o_proj.weight"] = WeightSpec((f"{a}.o_proj.weight",), _rows(c.attention_out_multiplier))
        if c.attention_bias:
            m[f"{k}.self_attn.o_proj.bias"] = WeightSpec((f"{a}.o_proj.bias",), _rows(c.attention_out_multiplier))
        f = f"{hf}.feed_forward"
        for part in ("weight", "bias") if c.mlp_bias else ("weight",):
            m[f"{k}.mlp.gate_up_proj.{part}"] = WeightSpec((f"{f}.gate_proj.{part}", f"{f}.up_proj.{part}"),
                                                           _rows(gate_up))
            m[f"{k}.mlp.down_proj.{part}"] = WeightSpec((f"{f}.down_proj.{part}",), _rows(c.mlp_multipliers[1]))
    return m

