"""Kernels of the KV cache kiln owns (models/owned_kv.py): attention over a layer's pages by each
query's position, with an optional attention sink per head.

One kernel serves prefill, decode and verify alike: the forward's keys are appended to the pages
first (TVM's transpose-append kernel, in place), then each query row (token t, head h) attends to
its sequence's keys at positions lo..p, where p is the row's own position (causal) and lo is
p - window + 1 on a sliding layer (transformers' `kv_idx > q_idx - sliding_window`), 0 on a full
one. A key's position is its index in the sequence (the owned cache keeps every token, in page
order), so any chunk of any length is masked exactly, which TVM's cache cannot do for mixed
sliding layers (runtime/sliding_window.py).

    out[t, h] = sum_j e^(s_j - m) v_j / (sum_j e^(s_j - m) + e^(sink_h - m)),   s_j = scale q.k_j

The sink (gpt-oss, Flint, Granite SWA: a learned logit per head in every softmax that takes a
share of the weight and gives no value) is an input [heads] float32; a model without sinks passes
NO_SINK, whose share is 0. Softmax runs in float32 whatever the cache's dtype.

The page tables (runtime/owned_kv.py builds them) are int32 views into one staged buffer, hence
their elem_offsets:
    page_indptr [batch + 1]   each sequence's first entry in page_values
    page_values [entries]     page ids, each sequence's in token order
    seq_of      [tokens]      each query row's sequence (its index in the batch)
    positions   [tokens]      each query row's position in its sequence
    slots       [tokens]      where the append writes each new token: page id * page_size + row

A first kernel, written for exactness: one query row and head per loop iteration (a CPU thread's
task; a GPU thread, one block a token), its keys in turn. Fast schedules are future work.
"""

from __future__ import annotations

from tvm.script import tirx as T

from .kernel_memo import parsed_once

NO_SINK = -1.0e30          # a sink logit whose share of any softmax is 0
_NEG = -3.0e38             # the running maximum before the first key
_FULL = 1 << 30            # the "window" of a full layer: every earlier key


@parsed_once()
def owned_attention(h_kv: int, h_q: int, d: int, dtype: str, page_size: int, sm_scale: float,
                    window: int = 0, gpu: bool = False, alibi: bool = False):
    """The attention kernel of one layer kind: `window` tokens (itself included) on a sliding
    layer, 0 on a full one. Arguments: q [tokens, h_q, d], the layer's pages, page_indptr,
    page_values, seq_of, positions, sinks [h_q] float32, slopes [h_q] float32 (read with `alibi`
    only: a model without passes any [h_q] float32, its sinks), out [tokens, h_q, d]. ALiBi adds
    slope_h * (j - p) to the score of the key at position j (BLOOM, MPT: BLOOM's bias by key
    position differs from it by a constant a row, which the softmax removes)."""
    if h_q % h_kv:
        raise ValueError(f"{h_q} query heads do not group over {h_kv} KV heads")
    group = h_q // h_kv
    span = window if window > 0 else _FULL
    scale = float(sm_scale)

    @T.macro
    def row(t, h, q, pages, page_indptr, page_values, seq_of, positions, sinks, slopes, out, acc, st):
        p = positions[t]
        lo = T.max(p - (span - 1), 0)
        base = page_indptr[seq_of[t]]
        for dd in T.serial(d):
            acc[dd] = T.float32(0.0)
        st[0] = T.float32(_NEG)                 # running maximum
        st[1] = T.float32(0.0)                  # running sum of e^(s - max)
        for j in T.serial(p + 1 - lo):
            st[2] = T.float32(0.0)
            for dd in T.serial(d):
                st[2] = st[2] + T.Cast("float32", q[t, h, dd]) * T.Cast(
                    "float32", pages[page_values[base + (lo + j) // page_size], 0, h // group,
                                     (lo + j) % page_size, dd])
            st[2] = st[2] * T.float32(scale)
            if alibi:
                st[2] = st[2] + slopes[h] * T.Cast("float32", lo + j - p)
            st[3] = T.max(st[0], st[2])                                 # the new maximum
            st[4] = T.exp(st[0] - st[3])                                # the old terms' rescale
            st[5] = T.exp(st[2] - st[3])                                # this key's weight
            st[1] = st[1] * st[4] + st[5]
            for dd in T.serial(d):
                acc[dd] = acc[dd] * st[4] + st[5] * T.Cast(
                    "float32", pages[page_values[base + (lo + j) // page_size], 1, h // group,
                                     (lo + j) % page_size, dd])
            st[0] = st[3]
        st[1] = st[1] + T.exp(sinks[h] - st[0])
        for dd in T.serial(d):
            out[t, h, dd] = T.Cast(dtype, acc[dd] / st[1])

    @T.prim_func
    def owned_kv_attention(var_q: T.handle, var_pages: T.handle, var_page_indptr: T.handle,
                           var_page_values: T.handle, var_seq_of: T.handle, var_positions: T.handle,
                           var_sinks: T.handle, var_slopes: T.handle, var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        n, num_pages, b1, entries = T.int32(), T.int64(), T.int32(), T.int32()
        o1, o2, o3, o4 = T.int32(), T.int32(), T.int32(), T.int32()
        q = T.match_buffer(var_q, (n, h_q, d), dtype)
        pages = T.match_buffer(var_pages, (num_pages, 2, h_kv, page_size, d), dtype)
        page_indptr = T.match_buffer(var_page_indptr, (b1,), "int32", elem_offset=o1)
        page_values = T.match_buffer(var_page_values, (entries,), "int32", elem_offset=o2)
        seq_of = T.match_buffer(var_seq_of, (n,), "int32", elem_offset=o3)
        positions = T.match_buffer(var_positions, (n,), "int32", elem_offset=o4)
        sinks = T.match_buffer(var_sinks, (h_q,), "float32")
        slopes = T.match_buffer(var_slopes, (h_q,), "float32")
        out = T.match_buffer(var_out, (n, h_q, d), dtype)
        if gpu:                     # a block a token, a thread a head
            for t in T.thread_binding(n, thread="blockIdx.x"):
                for h in T.thread_binding(h_q, thread="threadIdx.x"):
                    acc = T.alloc_buffer((d,), "float32", scope="local")
                    st = T.alloc_buffer((6,), "float32", scope="local")
                    row(t, h, q, pages, page_indptr, page_values, seq_of, positions, sinks, slopes, out, acc, st)
        else:                       # a task a token and head
            for task in T.parallel(n * h_q):
                acc = T.alloc_buffer((d,), "float32")
                st = T.alloc_buffer((6,), "float32")
                row(task // h_q, task % h_q, q, pages, page_indptr, page_values, seq_of, positions, sinks, slopes,
                    out, acc, st)

    return owned_kv_attention


@parsed_once()
def owned_append(h_kv: int, d: int, dtype: str, page_size: int):
    """The forward's new keys and values written into a layer's pages at their slots (TVM's
    transpose-append kernel: pages, k [tokens, h_kv, d], v, slots; called in place)."""
    from tvm.relax.frontend.nn.llm._page_kernels import _kv_cache_transpose_append
    return _kv_cache_transpose_append(h_kv, d, dtype, page_size)


@parsed_once()
def owned_conv(half: int, taps: int, dtype: str, page_size: int, gpu: bool = False):
    """A short causal depthwise convolution over a layer's pages (LFM2's conv layers): each token's input
    (2 x `half` channels) was appended as a one-head key (its first half) and value (its second), so the
    conv reads the `taps` - 1 tokens before it from the pages, as attention reads keys, and forks, prefix
    hits and pops hold for it as for attention.

        out[t, c] = sum_j w[c, j] * x[p - (taps - 1) + j, c]       (x before position 0: 0)

    Arguments: the pages, page_indptr, page_values, seq_of, positions, w [2 half, taps], out [tokens, 2 half].
    On GPUs a block a token, its threads over the channels."""
    hidden = 2 * half
    threads = min(256, hidden)
    rounds = -(-hidden // threads)

    @T.macro
    def channel(t, c, pages, page_indptr, page_values, seq_of, positions, w, out, acc):
        p = positions[t]
        base = page_indptr[seq_of[t]]
        acc[0] = T.float32(0.0)
        for j in T.serial(taps):
            if p - (taps - 1) + j >= 0:
                acc[0] = acc[0] + T.Cast("float32", w[c, j]) * T.Cast(
                    "float32", pages[page_values[base + (p - (taps - 1) + j) // page_size], c // half, 0,
                                     (p - (taps - 1) + j) % page_size, c % half])
        out[t, c] = T.Cast(dtype, acc[0])

    @T.prim_func
    def owned_kv_conv(var_pages: T.handle, var_page_indptr: T.handle, var_page_values: T.handle,
                      var_seq_of: T.handle, var_positions: T.handle, var_w: T.handle, var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        n, num_pages, b1, entries = T.int32(), T.int64(), T.int32(), T.int32()
        o1, o2, o3, o4 = T.int32(), T.int32(), T.int32(), T.int32()
        pages = T.match_buffer(var_pages, (num_pages, 2, 1, page_size, half), dtype)
        page_indptr = T.match_buffer(var_page_indptr, (b1,), "int32", elem_offset=o1)
        page_values = T.match_buffer(var_page_values, (entries,), "int32", elem_offset=o2)
        seq_of = T.match_buffer(var_seq_of, (n,), "int32", elem_offset=o3)
        positions = T.match_buffer(var_positions, (n,), "int32", elem_offset=o4)
        w = T.match_buffer(var_w, (hidden, taps), dtype)
        out = T.match_buffer(var_out, (n, hidden), dtype)
        if gpu:
            for t in T.thread_binding(n, thread="blockIdx.x"):
                for ci in T.thread_binding(threads, thread="threadIdx.x"):
                    for co in T.serial(rounds):
                        acc = T.alloc_buffer((1,), "float32", scope="local")
                        if co * threads + ci < hidden:
                            channel(t, co * threads + ci, pages, page_indptr, page_values, seq_of, positions, w,
                                    out, acc)
        else:
            for t in T.parallel(n):
                for c in T.serial(hidden):
                    acc = T.alloc_buffer((1,), "float32")
                    channel(t, c, pages, page_indptr, page_values, seq_of, positions, w, out, acc)

    return owned_kv_conv
