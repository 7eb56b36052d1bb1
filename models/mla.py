"""Multi-head latent attention (DeepSeek-V2/V3, Kimi K2, GLM-4.7-Flash, MiniCPM3, Mistral 4, Youtu-LLM), run
as the plain multi-head attention it expands to, over the KV cache every other family uses.

MLA projects x to a `kv_lora_rank` latent (RMS-normed) and one `qk_rope_head_dim` key part shared by
every head; each head's key is [its `qk_nope_head_dim` dims from the latent, the shared rotated part]
and its value `v_head_dim` dims from the latent; queries come from x directly (`q_proj`) or through a
`q_lora_rank` latent of their own. transformers caches the latent and expands it at every step; kiln
caches the expanded keys and values (heads x head_dim each, against MLA's kv_lora_rank +
qk_rope_head_dim a token: more memory, the same numbers), so TVM's paged cache, its kernels on every
target and RoPE applied by the cache serve MLA unchanged:

    head_dim    qk_rope_head_dim + qk_nope_head_dim, the rotated dims first (the cache rotates the
                first rotary_dim = qk_rope_head_dim of each head: q's and the key part's rows are
                reordered at load, and interleaved pairs regrouped into halves, causal_lm.rope_halves'
                rule); values padded with zeros to head_dim, the output's padding dropped
    kv heads    the query heads (each has its own key)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache

from .layers import Norm, cached_attention
from .rope import apply_rope, pair_halves, position_temperature


@dataclass(frozen=True)
class MLASpec:
    """A latent attention's shape (config.json's names)."""

    q_lora_rank: int | None                 # None: queries from x by one q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    interleaved: bool = True                # the checkpoint's RoPE pairs dims (2i, 2i+1) (DeepSeek's)
    latent_eps: float = 1e-6                # q_a_layernorm's and kv_a_layernorm's epsilon: every MLA family's own
                                            # code builds them with its RMSNorm's default, not rms_norm_eps

    def __post_init__(self) -> None:
        if self.v_head_dim > self.qk_nope_head_dim + self.qk_rope_head_dim:
            raise ValueError(f"v_head_dim ({self.v_head_dim}) above the key's qk_nope_head_dim + qk_rope_head_dim "
                             "is not supported; fix config.json")

    @property
    def head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class LatentAttention(nn.Module):
    kv_dtype: str | None = None             # the KV cache's dtype where it is not the activations'

    def __init__(self, hidden_size: int, num_heads: int, spec: MLASpec, sm_scale: float, bias: bool = False,
                 rope: tuple | None = None, temperature: tuple | None = None, gated: bool = False):
        self.spec, self.num_heads, self.sm_scale, self.rope = spec, num_heads, sm_scale, rope
        self.temperature = temperature      # Flags.attn_temperature (Mistral 4: RoPE is then in the graph)
        d = spec.head_dim
        if spec.q_lora_rank:
            self.q_a_proj = nn.Linear(hidden_size, spec.q_lora_rank, bias=bias)
            self.q_a_layernorm = Norm(spec.q_lora_rank, spec.latent_eps)
            self.q_b_proj = nn.Linear(spec.q_lora_rank, num_heads * d, bias=False)
        else:
            self.q_proj = nn.Linear(hidden_size, num_heads * d, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, spec.kv_lora_rank + spec.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = Norm(spec.kv_lora_rank, spec.latent_eps)
        self.kv_b_proj = nn.Linear(spec.kv_lora_rank, num_heads * (spec.qk_nope_head_dim + spec.v_head_dim), bias=False)
        self.o_proj = nn.Linear(num_heads * spec.v_head_dim, hidden_size, bias=bias)
        if gated:                           # each head's output times sigmoid(g_proj(x)) (Ling 3's)
            self.g_proj = nn.Linear(hidden_size, num_heads, bias=False)

    def forward(self, x: Tensor, kv_cache: PagedKVCache, layer_id: int, positions: Tensor | None = None) -> Tensor:
        b, s, _ = x.shape
        sp, h = self.spec, self.num_heads
        d, rope, nope = sp.head_dim, sp.qk_rope_head_dim, sp.qk_nope_head_dim
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if sp.q_lora_rank else self.q_proj(x)
        q = op.reshape(q, (b, s, h, d))                                         # [rotated | nope] a head
        latent, k_rot = op.split(self.kv_a_proj_with_mqa(x), [sp.kv_lora_rank], axis=-1)
        kv = op.reshape(self.kv_b_proj(self.kv_a_layernorm(latent)), (b, s, h, nope + sp.v_head_dim))
        k_nope, v = op.split(kv, [nope], axis=3)
        k = op.concat([op.broadcast_to(op.reshape(k_rot, (b, s, 1, rope)), (b, s, h, rope)), k_nope], dim=3)
        if self.rope:
            q, k = (apply_rope(t, positions, *self.rope) for t in (q, k))
        if self.temperature:
            q = position_temperature(q, positions, *self.temperature)
        if sp.v_head_dim < d:
            v = op.concat([v, op.zeros((b, s, h, d - sp.v_head_dim), v.dtype)], dim=3)
        out = cached_attention(kv_cache, layer_id, op.concat([q, k, v], dim=2), h, self.sm_scale, self.kv_dtype)
        if sp.v_head_dim < d:
            out = op.split(out, [sp.v_head_dim], axis=3)[0]
        if hasattr(self, "g_proj"):
            gate = op.sigmoid(self.g_proj(x).astype("float32"))
            out = out * op.reshape(gate if gate.dtype == out.dtype else gate.astype(out.dtype), (b, s, h, 1))
        return self.o_proj(op.reshape(out, (b, s, h * sp.v_head_dim)))


def _halves(r: int, interleaved: bool) -> np.ndarray:
    """The order of r rotated dims as kiln's cache rotates them: regrouped (rope.pair_halves) where the
    checkpoint pairs adjacent dims, as they are where it pairs halves already."""
    return pair_halves(r) if interleaved else np.arange(r)


def query_rows(spec: MLASpec, num_heads: int) -> Callable[[np.ndarray], np.ndarray]:
    """q_proj / q_b_proj rows: each head's [nope, rotated] as [rotated (halves), nope]."""
    nope, r = spec.qk_nope_head_dim, spec.qk_rope_head_dim
    head = np.concatenate([nope + _halves(r, spec.interleaved), np.arange(nope)])
    order = np.concatenate([i * spec.head_dim + head for i in range(num_heads)])
    return lambda rows: rows[order]


def latent_rows(spec: MLASpec) -> Callable[[np.ndarray], np.ndarray]:
    """kv_a_proj_with_mqa rows (weight or bias): the latent's, then the shared key part's in halves."""
    order = np.concatenate([np.arange(spec.kv_lora_rank), spec.kv_lora_rank + _halves(spec.qk_rope_head_dim,
                                                                                      spec.interleaved)])
    return lambda rows: rows[order]


def latent_weight_map(c, m: dict, attention: str = "self_attn") -> dict:
    """A decoder weight map (causal_lm.decoder_weight_map's, HF names under model.layers.{i}.`attention`) with
    each layer's fused q/k/v entries replaced by the latent attention's tensors, q's and the shared key
    part's rows in the order the cache rotates them."""
    from .causal_lm import WeightSpec
    spec, bias = c.latent_attention(), c.flags().qkv_bias
    for i in range(c.num_hidden_layers):
        k, h = f"model.layers.{i}.self_attn", f"model.layers.{i}.{attention}"
        for key in [key for key in m if key.startswith(f"{k}.qkv_proj.")]:
            del m[key]
        q = "q_b_proj" if spec.q_lora_rank else "q_proj"
        m[f"{k}.{q}.weight"] = WeightSpec((f"{h}.{q}.weight",), query_rows(spec, c.num_attention_heads))
        m[f"{k}.kv_a_proj_with_mqa.weight"] = WeightSpec((f"{h}.kv_a_proj_with_mqa.weight",), latent_rows(spec))
        m[f"{k}.kv_a_layernorm.weight"] = [f"{h}.kv_a_layernorm.weight"]
        m[f"{k}.kv_b_proj.weight"] = [f"{h}.kv_b_proj.weight"]
        if spec.q_lora_rank:
            m[f"{k}.q_a_proj.weight"] = [f"{h}.q_a_proj.weight"]
            m[f"{k}.q_a_layernorm.weight"] = [f"{h}.q_a_layernorm.weight"]
        if bias:
            m[f"{k}.kv_a_proj_with_mqa.bias"] = WeightSpec((f"{h}.kv_a_proj_with_mqa.bias",), latent_rows(spec))
            if spec.q_lora_rank:
                m[f"{k}.q_a_proj.bias"] = [f"{h}.q_a_proj.bias"]
    return m
