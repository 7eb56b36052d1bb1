"""OwnedKVCache: a KV cache kiln owns, in the graph, in place of TVM's PagedKVCache.

An artifact compiled with it (KVCacheLayout.owner "kiln") takes the cache as one input of its
forward functions, a tuple: every layer's pages [num_pages, 2, kv_heads, page_size, head_dim]
(allocated by the runtime, runtime/owned_kv.py) and the forward's page tables (targets/owned_kv.py
lists them). Each layer splits q/k/v (RoPE applied with the cache's settings, as TVM's cache would),
writes k and v into its pages in place (call_tir_inplace: the function's output aliases the
runtime's tensor) and attends over them by position (targets/owned_kv.py). The functions return
the pages, so the writes stay live through the pipeline.

What it gives that TVM's cache cannot: attention sinks (a learned logit per head in every softmax:
gpt-oss, Flint, Granite SWA) and exact windows on sliding layers at any chunk length. It has the
two methods the model layers call on a cache (attention_with_fused_qkv, get_query_positions), so
every family's layers run over either cache unchanged. tools/kv_probe.py measured the design
against TVM's cache (exact; neutral in speed on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from kiln.targets.owned_kv import NO_SINK, owned_append, owned_attention

TABLES = ("page_indptr", "page_values", "seq_of", "positions", "slots")   # after the pages, in this order


@dataclass(frozen=True)
class OwnedLayout:
    """What the cache's kernels are built for."""
    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: str                          # the pages'
    windows: tuple[int, ...]            # per layer: tokens a sliding layer sees, 0 for a full layer
    rope: dict | None = None            # RoPE the cache applies (TVM's settings: theta, scaling, rotary_dim); None


def cache_spec(layout: OwnedLayout, tokens: str) -> list:
    """The cache input of an entry function (nn.spec), `tokens` the name of its token count."""
    pages = [nn.spec.Tensor(["num_pages", 2, layout.num_kv_heads, layout.page_size, layout.head_dim], layout.dtype)
             for _ in layout.windows]
    sizes = {"page_indptr": "batch_plus_one", "page_values": "page_entries"}
    return [pages, *[nn.spec.Tensor([sizes.get(name, tokens)], "int32") for name in TABLES]]


class OwnedKVCache:
    """One forward's view of the cache (built from the entry function's cache input)."""

    def __init__(self, layout: OwnedLayout, state: list):
        self.layout = layout
        pages, *tables = state
        self.pages = list(pages)
        self.tables = dict(zip(TABLES, tables))
        self._kernels: dict = {}

    def get_query_positions(self, total_length) -> Tensor:
        return self.tables["positions"]

    def outputs(self) -> tuple:
        """What the entry function returns for the cache: the pages as the appends left them."""
        return tuple(self.pages)

    def attention_with_fused_qkv(self, layer_id: int, qkv: Tensor, num_qo_heads: int, sm_scale: float,
                                 sinks: Tensor | None = None) -> Tensor:
        """As PagedKVCache's: qkv [b, s, heads + 2 kv heads, d] -> [b, s, heads, d]; with `sinks`
        [heads] float32, each head's sink logit in its softmax."""
        lay = self.layout
        b, s, fused, d = qkv.shape
        h, h_kv = num_qo_heads, lay.num_kv_heads
        flat = op.reshape(qkv, [b * s, fused, d])
        n = flat.shape[0]
        if lay.rope:
            q, k, v = op.tensor_ir_op(self._kernel("rope"), "owned_kv_split_rotary",
                                      [flat, self.tables["positions"]], out=[
                                          Tensor.placeholder([n, h, d], qkv.dtype),
                                          Tensor.placeholder([n, h_kv, d], qkv.dtype),
                                          Tensor.placeholder([n, h_kv, d], qkv.dtype)])
        else:
            q, k, v = op.split(flat, [h, h + h_kv], axis=1)
        pages = self.pages[layer_id]
        self.pages[layer_id] = op.tensor_ir_inplace_op(
            self._kernel("append"), "owned_kv_append", [pages, k, v, self.tables["slots"]], inplace_indices=[0],
            out=Tensor.placeholder(pages.shape, pages.dtype))
        if sinks is None:
            sinks = nn.Tensor.from_const(np.full(h, NO_SINK, np.float32))
        o = op.tensor_ir_op(
            self._kernel("attention", sm_scale, lay.windows[layer_id], h), "owned_kv_attention",
            [q, self.pages[layer_id], self.tables["page_indptr"], self.tables["page_values"], self.tables["seq_of"],
             self.tables["positions"], sinks], out=Tensor.placeholder([n, h, d], qkv.dtype))
        return op.reshape(o, [b, s, h, d])

    def _kernel(self, kind: str, *key):
        """The cache's PrimFuncs, built once per kind (and per scale, window and head count)."""
        from tvm.target import Target
        found = self._kernels.get((kind, *key))
        if found is not None:
            return found
        lay = self.layout
        if kind == "append":
            func = owned_append(lay.num_kv_heads, lay.head_dim, lay.dtype, lay.page_size)
        elif kind == "rope":
            func = _rope_kernel(lay)
        else:
            scale, window, heads = key
            gpu = Target.current().kind.name != "llvm"
            func = owned_attention(lay.num_kv_heads, heads, lay.head_dim, lay.dtype, lay.page_size, scale,
                                   window=window, gpu=gpu)
        # named by the call (tensor_ir_op's name hint): kernels of two windows or scales are two functions
        func = self._kernels[(kind, *key)] = func.without_attr("global_symbol")
        return func


def _rope_kernel(lay: OwnedLayout):
    """TVM's split + rotary kernel (the one its cache runs) with RoPE on: qkv, positions -> q, k, v."""
    from tvm import tirx
    from tvm.relax.frontend.nn.llm.position_embedding import llama_rope_with_position_map
    r = lay.rope
    func = llama_rope_with_position_map(r["theta"], 1.0, lay.head_dim, lay.num_heads, lay.num_kv_heads, lay.dtype,
                                        r.get("scaling") or {}, r.get("rotary_dim") or lay.head_dim)
    binds = {p: tirx.const(1, str(p.ty.dtype)) for p in func.params if p.name == "apply_rope"}
    return func.specialize(binds)
