"""DiffLlama (diffllama): Llama layers with differential attention (the Differential Transformer's).

Query heads h < H/2 and their partners h + H/2 attend with the same scale over the grouped keys; each pair's output
is (softmax_h - lambda softmax_{h+H/2}) V_pair, normed (RMS over 2 head_dim, no weight) and times 1 - lambda_init,
where V_pair is the values of two KV heads side by side (KV head j and j + H_kv/2, j the pair's KV head mod H_kv/2),
lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init a layer (lambda_init = 0.8 - 0.6 exp(-0.3 layer)).

kiln runs it as one grouped attention whose values are 2 head_dim wide: v_proj's rows are laid out at load so each
KV head's value is its pair's two heads side by side, and q and k are padded with zeros to 2 head_dim (their scores
unchanged, the scale head_dim's); RoPE is applied in the graph to the first head_dim dims (partial_rotary_factor
1/2 of the cache's heads). The cache holds 2 head_dim a head for keys and values (twice a Llama's)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache

from .causal_lm import CausalLM, DecoderStack, WeightMap, WeightSpec
from .layers import DecoderLayer, Flags, Norm, cached_attention
from .llama import LlamaConfig
from .llama import weight_map as llama_weight_map
from .rope import apply_rope


def lambda_init(layer: int) -> float:
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


@dataclass(frozen=True)
class DiffLlamaConfig(LlamaConfig):
    ARCH: ClassVar[str] = "diffllama"

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if (hf.get("attention_dropout") or 0) > 0:
            raise ValueError("diffllama with attention_dropout > 0 is not supported (transformers refuses it too)")
        if values["num_key_value_heads"] % 2 or values["num_attention_heads"] % 2:
            raise ValueError(f"diffllama needs even num_attention_heads and num_key_value_heads (its heads pair up); "
                             f"got {values['num_attention_heads']} and {values['num_key_value_heads']}; "
                             "fix config.json")
        if values["partial_rotary_factor"] != 1.0:
            raise ValueError("diffllama with partial_rotary_factor is not supported (transformers rotates whole heads)")
        values = super().adapt(values, hf, notes)
        # the cache's heads: 2 head_dim (q and k padded), RoPE over the first half
        return dict(values, head_dim=2 * values["head_dim"], partial_rotary_factor=0.5)

    @property
    def qk_dim(self) -> int:
        return self.head_dim // 2

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, mlp_bias=self.mlp_bias,
                     rope_in_graph=True)


class DifferentialAttention(nn.Module):
    """The module docstring's attention: one grouped attention over values of paired heads, then each pair's
    difference."""

    kv_dtype: str | None = None             # the KV cache's dtype where not the activations' (CausalLM.set_kv_dtype)

    def __init__(self, c: DiffLlamaConfig, layer: int, rope: tuple):
        h, h_kv, d = c.num_attention_heads, c.num_key_value_heads, c.qk_dim
        self.h, self.h_kv, self.d, self.rope = h, h_kv, d, rope
        self.qkv_proj = nn.Linear(c.hidden_size, (h + h_kv) * d + h_kv * 2 * d, bias=c.attention_bias)
        self.o_proj = nn.Linear(h * d, c.hidden_size, bias=c.attention_bias)
        self.lambda_full = nn.Parameter((1,), "float32")
        self.out_scale = 1.0 - lambda_init(layer)
        self.norm = Norm(2 * d, c.norm_eps, "rms_noparam")

    def to(self, dtype: str | None = None) -> None:
        super().to(dtype)
        self.lambda_full.to("float32")

    def forward(self, x: Tensor, kv_cache: PagedKVCache, layer_id: int, positions: Tensor | None = None) -> Tensor:
        b, s, _ = x.shape
        h, h_kv, d = self.h, self.h_kv, self.d
        q, k, v = op.split(self.qkv_proj(x), [h * d, (h + h_kv) * d], axis=2)
        q, k = (apply_rope(op.reshape(t, (b, s, n, d)), positions, *self.rope) for t, n in ((q, h), (k, h_kv)))
        padded = op.concat([op.concat([q, k], dim=2), op.zeros((b, s, h + h_kv, d), q.dtype)], dim=3)
        qkv = op.concat([padded, op.reshape(v, (b, s, h_kv, 2 * d))], dim=2)
        out = cached_attention(kv_cache, layer_id, qkv, h, d ** -0.5, self.kv_dtype)            # [b, s, h, 2d]
        first, second = op.split(out, 2, axis=2)
        lam = self.lambda_full if out.dtype == "float32" else self.lambda_full.astype(out.dtype)
        y = self.norm(first - second * lam) * self.out_scale
        return self.o_proj(op.reshape(y, (b, s, h * d)))


class DiffLlamaStack(DecoderStack):
    def decoder_layer(self, c: DiffLlamaConfig, i: int, flags: Flags, rope: tuple | None) -> nn.Module:
        return DecoderLayer(c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                            c.head_dim, c.norm_eps, flags, rope, attention=DifferentialAttention(c, i, rope))


class DiffLlamaForCausalLM(CausalLM):
    def stack(self, config: DiffLlamaConfig) -> nn.Module:
        return DiffLlamaStack(config, self.flags, self.attention)


def _paired_value_rows(c: DiffLlamaConfig) -> np.ndarray:
    """v_proj's rows as kiln's values: KV head m's are heads j and j + H_kv/2 side by side (j = m mod H_kv/2)."""
    d, half = c.qk_dim, c.num_key_value_heads // 2
    return np.concatenate([np.r_[j * d:(j + 1) * d, (j + half) * d:(j + half + 1) * d]
                           for j in (m % half for m in range(c.num_key_value_heads))])


def _lambda(layer: int):
    def full(parts: list[np.ndarray]) -> np.ndarray:
        q1, k1, q2, k2 = (np.asarray(p, np.float32) for p in parts)
        value = np.exp(np.float32((q1 * k1).sum())) - np.exp(np.float32((q2 * k2).sum())) + np.float32(
            lambda_init(layer))
        return np.array([value], np.float32)
    return full


def weight_map(c: DiffLlamaConfig) -> WeightMap:
    m = llama_weight_map(c)
    rows, qk = _paired_value_rows(c), (c.num_attention_heads + c.num_key_value_heads) * c.qk_dim

    def paired(w: np.ndarray) -> np.ndarray:            # q's and k's rows, then v's laid out as pairs
        return np.concatenate([w[:qk], w[qk:][rows]])
    for i in range(c.num_hidden_layers):
        k = a = f"model.layers.{i}.self_attn"
        for part in ("weight", "bias") if c.attention_bias else ("weight",):
            m[f"{k}.qkv_proj.{part}"] = WeightSpec(tuple(f"{a}.{x}_proj.{part}" for x in "qkv"), paired)
        m[f"{k}.lambda_full"] = WeightSpec(tuple(f"{a}.lambda_{x}" for x in ("q1", "k1", "q2", "k2")), _lambda(i),
                                           apart=True)
    return m
