"""OwnedKVCache: a KV cache kiln owns, in the graph, in place of TVM's PagedKVCache.

An artifact compiled with it (KVCacheLayout.owner "kiln") takes the cache as one input of its
forward functions, a tuple: every layer's pages [num_pages, 2, kv_heads, page_size, head_dim]
(allocated by the runtime, runtime/kv_caches.py) and the forward's page tables (contract.OWNED_KV_TABLES
names them). Each layer splits q/k/v (RoPE applied with the cache's settings, as TVM's cache would),
writes k and v into its pages in place (call_tir_inplace: the function's output aliases the
runtime's tensor) and attends over them by position (targets/owned_kv.py). The functions return
the pages, so the writes stay live through the pipeline.

What it gives that TVM's cache cannot: attention sinks (a learned logit per head in every softmax:
gpt-oss, Flint, Granite SWA), ALiBi's per-head bias by distance (BLOOM, MPT: on CPUs too through
targets/owned_kv.py's kernel, not kiln's faster CPU one) and exact windows on sliding layers at any
chunk length. It has the
two methods the model layers call on a cache (attention_with_fused_qkv, get_query_positions), so
every family's layers run over either cache unchanged. tools/kv_probe.py measured the design
against TVM's cache (exact; neutral in speed on the CPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from kiln.runtime.contract import OWNED_KV_TABLES, OWNED_STATE_TABLES
from kiln.targets.owned_kv import NO_SINK, owned_append, owned_attention, owned_conv
from kiln.targets.recurrent import gated_delta, selective_scan, state_conv

TABLES = OWNED_KV_TABLES          # after the pages, in this order (runtime/kv_caches.py OwnedCache.begin builds them)
_SIZES = {"page_indptr": "batch_plus_one", "q_indptr": "batch_plus_one", "page_values": "page_entries",
          "last_len": "batch", "rope_offset": "batch", "state_slots": "batch"}


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
    softcap: float | None = None        # attention scores soft-capped, cap * tanh(s / cap) (Gemma 2): CPU kernels only
    layer_kv: tuple[tuple[int, int], ...] = ()  # per layer (kv heads, head dim) where layers differ (Gemma 4's
                                                # global layers); empty: num_kv_heads and head_dim for every one
    sources: tuple[int, ...] = ()       # per layer, the layer whose keys and values it attends over (Gemma 4's
                                        # shared KV: a later layer reads an earlier one's pages and writes
                                        # none); empty: each its own
    alibi: tuple[float, ...] = ()       # ALiBi's slope a query head (BLOOM, MPT): slope * (j - p) on each score;
                                        # empty: none
    states: tuple[tuple[tuple[int, ...], ...], ...] = ()   # per layer, its recurrent state tensors' shapes (a
                                        # slot a sequence, float32: Qwen3.5's DeltaNet); such a layer holds no pages

    def kv_of(self, layer: int) -> tuple[int, int]:
        """Layer `layer`'s (kv heads, head dim)."""
        return self.layer_kv[layer] if self.layer_kv else (self.num_kv_heads, self.head_dim)

    def source(self, layer: int) -> int:
        """The layer whose pages layer `layer` attends over (itself unless it shares another's)."""
        return self.sources[layer] if self.sources else layer

    @property
    def owners(self) -> list[int]:
        """The layers that hold pages, in order (the cache input's page tensors, one each)."""
        return [i for i in range(len(self.windows)) if self.source(i) == i and not (self.states and self.states[i])]

    @property
    def tables(self) -> tuple[str, ...]:
        """The page tables the cache input takes after its tensors (the state slots with recurrent layers)."""
        return TABLES + (OWNED_STATE_TABLES if any(self.states) else ())


def cache_spec(layout: OwnedLayout, tokens: str) -> list:
    """The cache input of an entry function (nn.spec), `tokens` the name of its token count: the owners'
    pages, then the recurrent layers' state tensors, then the tables."""
    pages = [nn.spec.Tensor(["num_pages", 2, layout.kv_of(i)[0], layout.page_size, layout.kv_of(i)[1]], layout.dtype)
             for i in layout.owners]
    states = [nn.spec.Tensor(["state_slots_total", *shape], "float32") for shapes in layout.states for shape in shapes]
    return [pages + states, *[nn.spec.Tensor([_SIZES.get(name, tokens)], "int32") for name in layout.tables]]


class OwnedKVCache:
    """One forward's view of the cache (built from the entry function's cache input)."""

    def __init__(self, layout: OwnedLayout, state: list):
        self.layout = layout
        pages, *tables = state
        self.pages = list(pages)                    # the owners' (layout.owners), then the recurrent states
        self._page_of = {layer: i for i, layer in enumerate(layout.owners)}
        at = len(layout.owners)
        self._states_of: dict[int, list[int]] = {}  # recurrent layer -> its state tensors' indices in self.pages
        for layer, shapes in enumerate(layout.states):
            self._states_of[layer] = list(range(at, at + len(shapes)))
            at += len(shapes)
        self.tables = dict(zip(layout.tables, tables))
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
        h, (h_kv, _) = num_qo_heads, lay.kv_of(layer_id)
        flat = op.reshape(qkv, [b * s, fused, d])
        n = flat.shape[0]
        if lay.rope:
            q, k, v = op.tensor_ir_op(self._kernel("rope", int(h), int(h_kv)), "owned_kv_split_rotary",
                                      [flat, self.tables["positions"]], out=[
                                          Tensor.placeholder([n, h, d], qkv.dtype),
                                          Tensor.placeholder([n, h_kv, d], qkv.dtype),
                                          Tensor.placeholder([n, h_kv, d], qkv.dtype)])
        else:
            q, k, v = op.split(flat, [h, h + h_kv], axis=1)
        page = self._page_of[layer_id]
        pages = self.pages[page]
        self.pages[page] = op.tensor_ir_inplace_op(
            self._kernel("append", h_kv, int(d)), "owned_kv_append", [pages, k, v, self.tables["slots"]],
            inplace_indices=[0], out=Tensor.placeholder(pages.shape, pages.dtype))
        return op.reshape(self._attend(layer_id, q, s, sm_scale, sinks), [b, s, h, d])

    def attention_shared(self, layer_id: int, q: Tensor, sm_scale: float) -> Tensor:
        """A layer that shares another's keys and values (layout.sources): its q [b, s, heads, d] (rotated)
        over the source layer's pages, which this forward's earlier layer already appended to; nothing
        written. -> [b, s, heads, d]."""
        b, s, h, d = q.shape
        return op.reshape(self._attend(layer_id, op.reshape(q, [b * s, h, d]), s, sm_scale, None), [b, s, h, d])

    def short_conv(self, layer_id: int, x: Tensor, weight: Tensor) -> Tensor:
        """A short causal depthwise convolution (LFM2's conv layers): x [b, s, hidden] appended to the layer's
        pages (its two halves as a one-head key and value: layout.kv_of is (1, hidden / 2)), then each
        token's weight [hidden, taps]-weighted sum over itself and the taps - 1 tokens before it -> [b, s, hidden]."""
        b, s, hidden = x.shape
        h_kv, half = self.layout.kv_of(layer_id)
        if h_kv != 1 or 2 * half != int(hidden):
            raise ValueError(f"layer {layer_id}'s pages hold {h_kv} x {half}, not a conv input of {hidden} channels")
        dtype = self.layout.dtype                   # the pages' (a float16 cache under float32 compute: rounded)
        flat = op.reshape(x if x.dtype == dtype else x.astype(dtype), [b * s, 2, 1, half])
        k, v = (op.reshape(t, [b * s, 1, half]) for t in op.split(flat, 2, axis=1))
        page = self._page_of[layer_id]
        pages = self.pages[page]
        self.pages[page] = op.tensor_ir_inplace_op(
            self._kernel("append", 1, half), "owned_kv_append", [pages, k, v, self.tables["slots"]],
            inplace_indices=[0], out=Tensor.placeholder(pages.shape, pages.dtype))
        t = self.tables
        out = op.tensor_ir_op(self._kernel("conv", half, int(weight.shape[1])), "owned_kv_conv",
                              [self.pages[page], t["page_indptr"], t["page_values"], t["seq_of"], t["positions"],
                               weight if weight.dtype == dtype else weight.astype(dtype)],
                              out=Tensor.placeholder([b * s, hidden], dtype))
        out = op.reshape(out, [b, s, hidden])
        return out if out.dtype == x.dtype else out.astype(x.dtype)

    def recurrent_conv(self, layer_id: int, x: Tensor, weight: Tensor) -> Tensor:
        """A causal depthwise conv over each sequence's inputs (a recurrent layer's first state: its last
        taps - 1 inputs): x [b, s, channels], weight [channels, taps] -> [b, s, channels], in x's dtype."""
        b, s, c = x.shape
        out = self._state_call(layer_id, 0, self._kernel("state_conv", int(c), int(weight.shape[1]), x.dtype),
                               "recurrent_conv", [op.reshape(x, [b * s, c])],
                               [weight if weight.dtype == x.dtype else weight.astype(x.dtype)], [b * s, c], x.dtype)
        return op.reshape(out, [b, s, c])

    def gated_delta(self, layer_id: int, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                    delta: bool = True) -> Tensor:
        """The gated delta rule (a recurrent layer's second state, [hv, dk, dv]): q, k [b, s, hk, dk] (l2-normed,
        q scaled), v [b, s, hv, dv], g (log decay: [b, s, hv], or [b, s, hv, dk] a key channel's, Kimi Linear's
        KDA), beta [b, s, hv], all float32 -> [b, s, hv, dv] float32. Without `delta`, Mamba-2's scan
        (targets/recurrent.py): C, B, x, dt * A, dt as q, k, v, g, beta."""
        b, s, hk, dk = q.shape
        hv, dv = v.shape[2], v.shape[3]
        n, channels = b * s, len(g.shape) == 4
        kernel = self._kernel("gated_delta", int(hk), int(hv), int(dk), int(dv), delta, channels)
        out = self._state_call(layer_id, 1, kernel, "recurrent_kda" if channels else
                               "recurrent_delta" if delta else "recurrent_scan",
                               [op.reshape(q, [n, hk, dk]), op.reshape(k, [n, hk, dk]), op.reshape(v, [n, hv, dv]),
                                op.reshape(g, [n, hv, dk] if channels else [n, hv]), op.reshape(beta, [n, hv])], [],
                               [n, hv, dv], "float32")
        return op.reshape(out, [b, s, hv, dv])

    def selective_scan(self, layer_id: int, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor) -> Tensor:
        """Mamba-1's selective scan (a recurrent layer's second state, [channels, state]): x, dt [b, s, channels]
        (dt after its softplus), A [channels, state] (-exp(A_log)), B, C [b, s, state], all float32 -> y
        [b, s, channels] float32, before D x and the gate (targets/recurrent.py)."""
        b, s, c = x.shape
        n, width = b * s, int(A.shape[1])
        out = self._state_call(layer_id, 1, self._kernel("selective_scan", int(c), width), "recurrent_selective_scan",
                               [op.reshape(x, [n, c]), op.reshape(dt, [n, c]), A, op.reshape(B, [n, width]),
                                op.reshape(C, [n, width])], [], [n, c], "float32")
        return op.reshape(out, [b, s, c])

    def _state_call(self, layer_id: int, which: int, kernel, name: str, before: list, after: list, shape: list,
                    dtype: str) -> Tensor:
        """A recurrent kernel over layer `layer_id`'s state tensor `which`, updated in place: its arguments
        `before`, the state, the tables it reads (q_indptr, state_slots, positions), `after`; -> its output."""
        slot = self._states_of[layer_id][which]
        state, t = self.pages[slot], self.tables
        args = [*before, state, t["q_indptr"], t["state_slots"], t["positions"], *after]
        self.pages[slot], out = op.tensor_ir_inplace_op(
            kernel, name, args, inplace_indices=[len(before), -1],
            out=[Tensor.placeholder(state.shape, state.dtype), Tensor.placeholder(shape, dtype)])
        return out

    def _attend(self, layer_id: int, q: Tensor, s, sm_scale: float, sinks: Tensor | None) -> Tensor:
        """q [tokens, heads, d] over the pages layer `layer_id` reads, its window masked -> [tokens, heads, d]."""
        lay = self.layout
        n, h, d = q.shape
        window = lay.windows[layer_id]
        pages = self.pages[self._page_of[lay.source(layer_id)]]
        # kiln's CPU kernels (decode steps of sliding layers too take the prefill one: a row each) take head sizes
        # in 16s; ALiBi and other sizes take the exactness kernel below
        if _cpu() and not lay.alibi and d % 16 == 0:
            decode = not window and isinstance(s, int) and s == 1
            return self._paged_cpu(q, pages, lay.kv_of(layer_id)[0], sm_scale, sinks, window, decode)
        if lay.softcap:
            raise ValueError("soft-capped attention (attn_logit_softcapping) over the KV cache kiln owns runs on "
                             "CPUs only so far; compile with --kv-cache tvm (or auto)")
        if sinks is None:
            sinks = nn.Tensor.from_const(np.full(h, NO_SINK, np.float32))
        slopes = nn.Tensor.from_const(np.asarray(lay.alibi, np.float32)) if lay.alibi else sinks   # (unread)
        return op.tensor_ir_op(
            self._kernel("attention", sm_scale, window, int(h), lay.kv_of(layer_id)[0], int(d)), "owned_kv_attention",
            [q, pages, self.tables["page_indptr"], self.tables["page_values"],
             self.tables["seq_of"], self.tables["positions"], sinks, slopes],
            out=Tensor.placeholder([n, h, d], q.dtype))

    def _paged_cpu(self, q: Tensor, pages: Tensor, h_kv: int, sm_scale: float, sinks: Tensor | None, window: int,
                   decode: bool) -> Tensor:
        """A layer on the CPU: kiln's paged attention kernels (targets/cpu/attention.py, the ones TVM's
        cache runs in kiln's CPU artifacts; every new token is in the pages, so the prefill kernel's
        causal mask is the whole story, and a sliding layer's window a mask by position: window_rows),
        the sinks taken out of the output by its log-sum-exp: o * sigmoid(lse - sink)."""
        n, h, d = q.shape
        t = self.tables
        args = [q, *([] if decode else [t["q_indptr"]]), pages, t["page_indptr"], t["page_values"],
                t["last_len"], t["rope_offset"], t["positions"]]
        o, lse = op.tensor_ir_op(self._kernel("paged_cpu", sm_scale, int(h), decode, window, h_kv, int(d)),
                                 "owned_kv_paged_attention",
                                 args, out=[Tensor.placeholder([n, h, d], q.dtype),
                                            Tensor.placeholder([n, h], "float32")])
        if sinks is None:
            return o
        keep = op.sigmoid(lse * math.log(2.0) - op.broadcast_to(op.reshape(sinks, [1, h]), lse.shape))  # lse: base 2
        return o * op.reshape(keep, [n, h, 1]).astype(o.dtype)

    def _kernel(self, kind: str, *key):
        """The cache's PrimFuncs, built once per kind (and per scale, window, head counts and head size)."""
        from tvm.target import Target
        found = self._kernels.get((kind, *key))
        if found is not None:
            return found
        lay = self.layout
        if kind == "append":
            func = owned_append(*key, lay.dtype, lay.page_size)
        elif kind == "rope":
            func = _rope_kernel(lay, *key)
        elif kind == "conv":
            func = owned_conv(*key, lay.dtype, lay.page_size, gpu=not _cpu())
        elif kind == "state_conv":
            func = state_conv(*key, gpu=not _cpu())
        elif kind == "selective_scan":
            func = selective_scan(*key, gpu=not _cpu())
        elif kind == "gated_delta":
            *heads, delta, channels = key
            func = gated_delta(*heads, gpu=not _cpu(), delta=delta, channels=channels)
        elif kind == "paged_cpu":
            from kiln.targets.cpu.attention import attention_paged_cpu
            from kiln.targets.cpu.schedule import attention_lanes
            scale, heads, decode, window, h_kv, d = key
            func = attention_paged_cpu(h_kv, heads, d, lay.dtype, lay.page_size, decode=decode,
                                       simd=attention_lanes(Target.current()), window_rows=window,
                                       softcap=lay.softcap)
            func = _bind(func, causal=1, rotary_mode=0, rope_scale=1.0, rope_theta=1.0, sm_scale=scale)
        else:
            scale, window, heads, h_kv, d = key
            gpu = Target.current().kind.name != "llvm"
            func = owned_attention(h_kv, heads, d, lay.dtype, lay.page_size, scale,
                                   window=window, gpu=gpu, alibi=bool(lay.alibi))
        # named by the call (tensor_ir_op's name hint): kernels of two windows or scales are two functions
        func = self._kernels[(kind, *key)] = func.without_attr("global_symbol")
        return func


def _cpu() -> bool:
    from tvm.target import Target
    return Target.current().kind.name == "llvm"


def _bind(func, **values):
    """`func` with its scalar parameters bound by name (call_tir passes tensors only)."""
    from tvm import tirx
    return func.specialize({p: tirx.const(values[p.name], str(p.ty.dtype)) for p in func.params if p.name in values})


def _rope_kernel(lay: OwnedLayout, heads: int, kv_heads: int):
    """The split + rotary kernel TVM's cache would run, with RoPE on: qkv of `heads` query heads and `kv_heads` KV
    heads (a layer's own: Laguna's query heads, Nemotron-NAS's KV heads differ by layer), positions -> q, k, v (on
    the CPU kiln's, as kiln's CPU artifacts swap it into TVM's cache, where it rotates whole heads unscaled)."""
    from tvm.relax.frontend.nn.llm.position_embedding import llama_rope_with_position_map
    r = lay.rope
    rotary = r.get("rotary_dim") or lay.head_dim
    if _cpu() and not r.get("scaling") and rotary == lay.head_dim:
        from kiln.targets.cpu.attention import split_rotary_cpu
        func = split_rotary_cpu(r["theta"], 1.0, lay.head_dim, heads, kv_heads, lay.dtype)
    else:
        func = llama_rope_with_position_map(r["theta"], 1.0, lay.head_dim, heads, kv_heads, lay.dtype,
                                            r.get("scaling") or {}, rotary)
    return _bind(func, apply_rope=1)
