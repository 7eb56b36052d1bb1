"""Shared building blocks for decoder-only transformers, in tvm.relax.frontend.nn.

Every architecture in models/ is assembled from these. Attention runs through
TVM's paged KV cache (`PagedKVCache.attention_with_fused_qkv`), which applies
RoPE to q/k inside the cache (RopeMode.NORMAL, HF rotate-half convention), so
the layers here hold no position state.

Weights keep Hugging Face's layout (Linear weight [out, in]); q/k/v and
gate/up projections are stored fused, and each model's weight map says how the
HF tensors concatenate into them.
"""

from __future__ import annotations

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache


class RMSNorm(nn.Module):
    """y = x / rms(x) * weight, over the last axis."""

    def __init__(self, hidden_size: int, eps: float):
        self.weight = nn.Parameter((hidden_size,))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return op.rms_norm(x, self.weight, axes=[-1], epsilon=self.eps)


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused into one Linear."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False):
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up_proj(x)                       # [b, s, 2 * inter]
        gate, up = op.split(gate_up, 2, axis=-1)             # [b, s, inter] each
        return self.down_proj(op.silu(gate) * up)


class PagedAttention(nn.Module):
    """Multi-head attention with grouped KV heads over TVM's paged KV cache."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 qkv_bias: bool = False):
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of "
                             f"num_key_value_heads ({num_kv_heads})")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.qkv_proj = nn.Linear(hidden_size, (num_heads + 2 * num_kv_heads) * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)

    def forward(self, x: Tensor, kv_cache: PagedKVCache, layer_id: int) -> Tensor:
        b, s, _ = x.shape
        qkv = self.qkv_proj(x)                                # [b, s, (h + 2 * h_kv) * d]
        qkv = op.reshape(qkv, (b, s, self.num_heads + 2 * self.num_kv_heads, self.head_dim))
        out = kv_cache.attention_with_fused_qkv(
            layer_id, qkv, self.num_heads, sm_scale=self.head_dim ** -0.5)  # [b, s, h, d]
        return self.o_proj(op.reshape(out, (b, s, self.num_heads * self.head_dim)))


def tied_logits(x: Tensor, embed: nn.Embedding) -> Tensor:
    """Tied output projection: logits = x @ E.T with the embedding table E [vocab, hidden]."""
    return op.matmul(x, op.permute_dims(embed.weight))
