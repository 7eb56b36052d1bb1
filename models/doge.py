"""Doge (doge: SmallDoge's Doge-20M ... Doge-320M): a Llama with dynamic mask attention, q and k RMS-normed a head,
and a learned scale on each residual.

Dynamic mask attention: every key carries a bias a KV head, dt = exp(A * softplus(dt_proj(v))) from its token's
values (all KV heads' values in, one bias a KV head out), added to every query's score of that key:
score = q.k / sqrt(head_dim) + dt. Only past keep_window_size keys does Doge mask all but each query's
keep_window_size highest-biased keys; kiln caps the context there (a note says so), within which the bias is the whole
of it. kiln carries the bias in the key: the cache's heads are head_dim plus PAD dims, the key's first extra dim
dt * sqrt(head_dim), the query's 1, the value's 0 (the output's extra dims dropped), so the cache's score is Doge's.
RoPE is applied in the graph over the first head_dim dims (the cache's rotation would turn the extra ones).

The residual adds are x * input_residual + attention and x * post_attention_residual + MLP (a scale a hidden dim:
Flags.residual_gates with the branch's factor 1). Doge's cross-domain MoE (is_moe: product-key experts) and sliding
window are refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache

from .causal_lm import (DECODER_FIELDS, CausalLM, DecoderConfig, DecoderStack, LayerAttention, WeightMap, WeightSpec,
                        head_weights)
from .config import ConfigField
from .layers import DecoderLayer, Flags, Norm, cached_attention
from .rope import apply_rope, inv_freq

PAD = 16                    # the key's bias dim, and zeros to keep the cache's head a multiple of 16


@dataclass(frozen=True)
class DogeConfig(DecoderConfig):
    attention_bias: bool = False
    mlp_bias: bool = False
    keep_window_size: int = 2048
    hidden_act: str = "silu"
    attn_head_dim: int = 0                  # Doge's heads' dims (head_dim: the cache's, PAD more)

    ARCH: ClassVar[str] = "doge"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *DECODER_FIELDS, ConfigField("attention_bias", ("attention_bias",), default=False),
        ConfigField("mlp_bias", ("mlp_bias",), default=False),
        ConfigField("keep_window_size", ("keep_window_size",), default=2048),
        ConfigField("hidden_act", ("hidden_act",), default="silu"))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("is_moe"):
            raise ValueError("Doge with is_moe (its cross-domain MoE: product-key experts) is not supported yet; the "
                             "dense Doge models are")
        if hf.get("sliding_window") is not None:
            raise ValueError(f"Doge with sliding_window {hf['sliding_window']} is not supported yet (SmallDoge's "
                             "releases leave it null)")
        if values["hidden_act"] not in ("silu", "gelu", "relu"):
            raise ValueError(f"Doge with hidden_act {values['hidden_act']!r} is not supported (silu, gelu or relu)")
        keep = values["keep_window_size"]
        if values["context_window_size"] > keep:
            notes.append(f"context window capped at keep_window_size ({keep} tokens): past it Doge's dynamic mask "
                         "keeps each query's keep_window_size highest-biased keys, which kiln does not run")
            values = dict(values, context_window_size=keep)
        return dict(values, attn_head_dim=values["head_dim"], head_dim=values["head_dim"] + PAD)

    def flags(self) -> Flags:
        return Flags(activation=self.hidden_act, mlp_bias=self.mlp_bias, residual_gates=True)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        # RoPE in the graph (DynamicMaskAttention rotates q and k itself): the cache rotates none of the dims
        return (LayerAttention("full", None, self.rope_theta, self.rope_scaling, rope=False),) * self.num_hidden_layers


class DynamicMaskAttention(nn.Module):
    """Doge's attention (the module docstring) over the cache's heads of head_dim + PAD dims."""

    kv_dtype: str | None = None

    def __init__(self, c: DogeConfig):
        self.h, self.h_kv, self.d = c.num_attention_heads, c.num_key_value_heads, c.attn_head_dim
        self.sm_scale = self.d ** -0.5
        self.rope = inv_freq(self.d, c.rope_theta, c.rope_scaling)
        self.qkv_proj = nn.Linear(c.hidden_size, (self.h + 2 * self.h_kv) * self.d, bias=c.attention_bias)
        self.o_proj = nn.Linear(self.h * self.d, c.hidden_size, bias=c.attention_bias)
        self.dt_proj = nn.Linear(self.h_kv * self.d, self.h_kv, bias=c.attention_bias)
        self.A = nn.Parameter((self.h_kv,), "float32")
        self.q_norm, self.k_norm = Norm(self.d, c.norm_eps), Norm(self.d, c.norm_eps)

    def to(self, dtype: str | None = None) -> None:
        super().to(dtype)
        self.A.to("float32")

    def forward(self, x: Tensor, kv_cache: PagedKVCache, layer_id: int, positions: Tensor | None = None) -> Tensor:
        b, s, _ = x.shape
        h, h_kv, d = self.h, self.h_kv, self.d
        q, k, v = op.split(op.reshape(self.qkv_proj(x), (b, s, h + 2 * h_kv, d)), [h, h + h_kv], axis=2)
        q, k = (apply_rope(t, positions, *self.rope) for t in (self.q_norm(q), self.k_norm(k)))
        dt = self.dt_proj(op.reshape(v, (b, s, h_kv * d)))                              # [b, s, h_kv]
        dt = op.exp(self.A * op.softplus(dt if dt.dtype == "float32" else dt.astype("float32")))
        bias = op.reshape(dt / self.sm_scale, (b, s, h_kv, 1))
        one, zeros = op.ones((b, s, h, 1), q.dtype), op.zeros((b, s, h_kv, PAD - 1), q.dtype)
        qkv = op.concat([op.concat([q, one, op.zeros((b, s, h, PAD - 1), q.dtype)], dim=3),
                         op.concat([k, bias if bias.dtype == k.dtype else bias.astype(k.dtype), zeros], dim=3),
                         op.concat([v, op.zeros((b, s, h_kv, PAD), v.dtype)], dim=3)], dim=2)
        out = cached_attention(kv_cache, layer_id, qkv, h, self.sm_scale, self.kv_dtype)     # [b, s, h, d + PAD]
        return self.o_proj(op.reshape(op.split(out, [d], axis=3)[0], (b, s, h * d)))


class DogeStack(DecoderStack):
    def decoder_layer(self, c: DogeConfig, i: int, flags: Flags, rope: tuple | None) -> nn.Module:
        return DecoderLayer(c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                            c.attn_head_dim, c.norm_eps, flags, None, attention=DynamicMaskAttention(c))


class DogeForCausalLM(CausalLM):
    def stack(self, config: DogeConfig) -> nn.Module:
        return DogeStack(config, self.flags, self.attention)


def residual_scale(r: np.ndarray) -> np.ndarray:
    """A residual's scale r [hidden] as residual_gates' [2, hidden]: the branch's factor 1, the residual's r."""
    return np.stack([np.ones_like(r), r]).astype(np.float32)


def weight_map(c: DogeConfig) -> WeightMap:
    m = head_weights(c)
    for i in range(c.num_hidden_layers):
        k = f"model.layers.{i}"
        a = f"{k}.self_attn"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            m[f"{k}.{norm}.weight"] = [f"{k}.{norm}.weight"]
        m[f"{k}.attn_gates"] = WeightSpec((f"{k}.input_residual",), residual_scale)
        m[f"{k}.mlp_gates"] = WeightSpec((f"{k}.post_attention_residual",), residual_scale)
        for p in ("weight", "bias") if c.attention_bias else ("weight",):
            m[f"{a}.qkv_proj.{p}"] = [f"{a}.{x}_proj.{p}" for x in "qkv"]
            m[f"{a}.o_proj.{p}"] = [f"{a}.o_proj.{p}"]
            m[f"{a}.dt_proj.{p}"] = [f"{a}.dt_proj.{p}"]
        m[f"{a}.A"] = [f"{a}.A"]
        m[f"{a}.q_norm.weight"] = [f"{a}.q_norm.weight"]
        m[f"{a}.k_norm.weight"] = [f"{a}.k_norm.weight"]
        for p in ("weight", "bias") if c.mlp_bias else ("weight",):
            m[f"{k}.mlp.gate_up_proj.{p}"] = [f"{k}.mlp.gate_proj.{p}", f"{k}.mlp.up_proj.{p}"]
            m[f"{k}.mlp.down_proj.{p}"] = [f"{k}.mlp.down_proj.{p}"]
    return m
