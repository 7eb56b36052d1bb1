"""CPU attention kernels for TVM's paged KV cache: blocked, vectorised, parallel.

TVM 0.27's CPU kernels (``_attention_prefill_ragged_cpu``, ``_attention_prefill_cpu``,
``_attention_decode_cpu``) are scalar loops over one thread: they took 47% of a
128-token SmolLM2 prefill and 40% of a decode step. These are drop-in replacements with
the same signatures (attention_pass.py swaps them into the module):

* Work is split over threads by (kv head, block of query rows) for prefill and by
  (sequence, kv head, split of the pages) for decode, a kv head's query heads together (each key
  and value read once for them), the splits merged after (flash-decoding).
* Keys are read a block at a time (``block_k`` rows of a ragged prefill, one page of the
  paged cache). With many query rows the block is transposed into ``Kt[d, block_k]``, so
  ``S = q . K^T`` is a sum of broadcast-q times key-vector FMAs (no horizontal reductions);
  a decode row instead takes one dot product per key row and query head (lanes-wide partial
  sums, then summed by halves), cheaper than transposing a page for a few rows.
* Softmax is online (flash-attention style): running max ``m`` and sum ``l`` per row,
  the output rescaled by ``exp2(m_old - m_new)`` per block; ``O += P V`` vectorises over
  the head dimension.
* ``exp2`` is a polynomial (``fast_exp2``, relative error 2.3e-7): LLVM turns a vector
  ``exp`` into one libm call per lane, which cost more than the dot products.

* Blocks follow the CPU's vector registers (``simd``: float32 lanes, 16 on AVX-512, 8 on AVX2 and
  taken as 8 on NEON): a ragged block is 4 registers of keys wide, its 2 rows' scores 8 registers;
  the paged prefill takes its rows 4 at a time over a page (one row's page of scores had been one
  dependent chain of multiply-adds); ``O += P V`` runs a chunk of the head dim at a time (2 rows x
  4 registers, 4 rows x 2), its sums in registers over the block's keys (Gemma 3's head dim of 256
  had 32 registers of sums a row pair, spilled: a load and a store per multiply-add); and a causal
  prefill's row blocks go to the threads light and heavy alternately (``_balanced``).
  Measured on 2 cores of an AMD EPYC (Zen 3, AVX2), Gemma 3 270M's shape (4 query heads, 1 kv head,
  head dim 256), kernels alone, medians of 7 alternating rounds: ragged, 512 causal tokens, 29.6 ->
  79.9 GFLOP/s; paged, 489 new rows over 511 cached, 80.4 -> 144.0 (111.8 with AVX-512's blocks on
  the same host). Results equal before and after to 2e-7. Decode's ``O += P V`` takes chunks of up
  to 8 registers (a head dim of 64 in one, as before): Gemma 3's shape, one sequence at 1,000 cached
  tokens, 80.8 -> 65.9 us a call, results identical. Unmeasured on an AVX-512 host, where a head
  dim of 64 (SmolLM2) builds the ragged and decode kernels as before and 256 gets the chunks.

Scores are in the log2 domain (``q . k * sm_scale * log2(e)``) and ``lse = m + log2(l)``,
the convention TVM's merge kernel expects. Only RoPE applied before the cache
(``rotary_mode == 0``) is supported; the kernels assert it. The sliding-window decode and
prefill over the cache are replaced too (``sliding``: TVM's [3, batch] length_info, the window's
rows counted, TVM's cross mask in prefill). Key and value head dims must be equal and a multiple of
the vector lanes.
"""

from __future__ import annotations

import math

import tvm_ffi
from tvm import tirx
from tvm.script import tirx as T

from ..kernel_memo import parsed_once
from .lanes import add, fold16
from .prefetch import prefetch_read

LOG2E = math.log2(math.e)
QUAD = 4                   # paged prefill: query rows whose scores (and output sums) are computed together
NEG = -1e30                # masked score; finite so that NEG - NEG stays 0
EMPTY_LSE = -5e4           # lse of a row with no keys (TVM's kernels use the same)
# 2^t = e^(t ln2): Taylor terms of e^u up to u^6; |u| <= ln2/2 after rounding, error ~2e-7.
_EXP_COEFFS = [1.0 / math.factorial(k) for k in range(7)]


def _poly(u):
    acc = T.float32(_EXP_COEFFS[-1])
    for c in reversed(_EXP_COEFFS[:-1]):
        acc = T.float32(c) + u * acc
    return acc


@T.macro(hygienic=False)
def fast_exp2(buf, row, n, tmp):
    """buf[row, j] = 2^buf[row, j] for j < n (vectorised; inputs below -126 flush to ~0).

    Written as separate vectorised stores: a let-bound value inside T.vectorized is
    broadcast from lane 0 by TVM 0.27's vectoriser (every lane got the same result)."""
    for j in T.vectorized(n):
        buf[row, j] = T.max(buf[row, j], T.float32(-126.0))
    for j in T.vectorized(n):
        tmp[j] = T.floor(buf[row, j] + T.float32(0.5))
    for j in T.vectorized(n):
        buf[row, j] = (buf[row, j] - tmp[j]) * T.float32(math.log(2.0))
    for j in T.vectorized(n):
        buf[row, j] = _poly(buf[row, j]) * T.reinterpret(
            "float32", T.shift_left(T.Cast("int32", tmp[j]) + 127, 23))


@T.macro(hygienic=False)
def fold_row(S, i, n, tmp, combine):
    """tmp[0] = combine over S[i, :n] (n 16, 32 or 64), by halves in vectors: a max exactly as a
    serial loop's; a sum in another order."""
    if n == 64:
        for j in T.vectorized(32):
            tmp[j] = combine(S[i, j], S[i, j + 32])
        for j in T.vectorized(16):
            tmp[j] = combine(tmp[j], tmp[j + 16])
    elif n == 32:
        for j in T.vectorized(16):
            tmp[j] = combine(S[i, j], S[i, j + 16])
    else:
        for j in T.vectorized(16):
            tmp[j] = S[i, j]
    fold16(tmp, 0, combine)


@T.macro(hygienic=False)
def add_weighted_values(O, o0, S, s0, rows, scale, keys, value, d, chunk, oacc):
    """O[o0 + r] = O[o0 + r] * scale[r] + sum over j < keys of value(S[s0 + r, j], j, column), for
    r < rows (the output rows of one block of keys; `value(p, j, c)`: p times value row j's column
    c). A chunk of the head dim at a time: rows x chunk sums (oacc) stay in registers over the
    block's keys, each value vector loaded once for all the rows (the whole head dim's sums of
    Gemma 3's 256 spilled, a load and a store per multiply-add)."""
    for dc in T.serial(d // chunk):
        for r in T.unroll(rows):
            for dd in T.vectorized(chunk):
                oacc[r, dd] = O[o0 + r, dc * chunk + dd] * scale[r]
        for j in T.serial(keys):
            for r in T.unroll(rows):
                for dd in T.vectorized(chunk):
                    oacc[r, dd] = oacc[r, dd] + value(S[s0 + r, j], j, dc * chunk + dd)
        for r in T.unroll(rows):
            for dd in T.vectorized(chunk):
                O[o0 + r, dc * chunk + dd] = oacc[r, dd]


def _valid(j, valid_cols):
    """Whether column j counts: j < valid_cols, or valid_cols(j) where it is a function."""
    return valid_cols(j) if callable(valid_cols) else j < valid_cols


@T.macro(hygienic=False)
def online_softmax_block(S, i, n, valid_cols, m, l, mi, tmp, alpha_buf, cap):
    """Turn row i of scores S into probabilities against the running max/sum (m, l at mi).

    Columns j >= valid_cols get probability 0 (valid_cols a function of j: those it is false for).
    Leaves alpha_buf[0] = exp2(m_old - m_new),
    the factor by which the row's previous output must be scaled. `cap` > 0 soft-caps the
    scores first, cap * tanh(s / cap) (Gemma 2; in the log2 domain: the model's cap * log2 e);
    `cap` is a Python float: 0.0 leaves them alone (the branch is dropped as the kernel is parsed;
    compared as TIR constants, TVM folded 0.0 > 0.0 in some parses and not others, so one module
    printed two ways and compiler/lib_cache.py's key differed between two compiles in one process)."""
    if cap > 0.0:
        for j in T.serial(n):
            S[i, j] = T.float32(cap) * T.tanh(S[i, j] / T.float32(cap))
    # Masked columns first (they may hold stale page memory, even NaN), then the max. T.Select, not
    # T.if_then_else: a select of two vectors; an if_then_else (a guarded load) was split into a
    # branch a lane (decode at 1,024 tokens, SmolLM2's shape, 30 layers' caches on huge pages, 2
    # Zen 3 threads: 83-85 us a call with it, 70-74 with the select).
    for j in T.vectorized(n):
        S[i, j] = T.Select(_valid(j, valid_cols), S[i, j], T.float32(NEG))
    if n in (16, 32, 64):
        fold_row(S, i, n, tmp, T.max)
        alpha_buf[1] = T.max(m[mi], tmp[0])
    else:
        alpha_buf[1] = m[mi]
        for j in T.serial(n):
            alpha_buf[1] = T.max(alpha_buf[1], S[i, j])
    for j in T.vectorized(n):
        S[i, j] = S[i, j] - alpha_buf[1]
    fast_exp2(S, i, n, tmp)
    for j in T.vectorized(n):           # exact zeros: fast_exp2 flushes to 2^-126, not 0
        S[i, j] = T.Select(_valid(j, valid_cols), S[i, j], T.float32(0.0))
    alpha_buf[0] = T.exp2(m[mi] - alpha_buf[1])
    if n in (16, 32, 64):
        fold_row(S, i, n, tmp, add)
        alpha_buf[2] = tmp[0]
    else:
        alpha_buf[2] = T.float32(0.0)
        for j in T.serial(n):
            alpha_buf[2] = alpha_buf[2] + S[i, j]
    l[mi] = l[mi] * alpha_buf[0] + alpha_buf[2]
    m[mi] = alpha_buf[1]


def fast_exp2_kernel(lanes: int = 16):
    """fast_exp2 as a PrimFunc, in place over a [n, lanes] float32 buffer (for tests and benchmarks)."""

    @T.prim_func
    def exp2_inplace(a: T.handle):
        n = T.int32()
        A = T.match_buffer(a, (n, lanes), "float32")
        for i in T.serial(n):
            tmp = T.alloc_buffer((lanes,), "float32")
            fast_exp2(A, i, lanes, tmp)

    return exp2_inplace


@parsed_once()
def attention_prefill_ragged_cpu(h_kv: int, h_q: int, d: int, dtype: str, lanes: int = 16,
                                 block_q: int = 32, block_k: int | None = None, softcap: float | None = None,
                                 simd: int = 16):
    """Self-attention of a prefill's new tokens (same signature as TVM's ragged CPU kernel).
    `softcap`: the model's attention logit soft-cap (None: none). `simd`: float32 lanes of the CPU's
    vector registers (16 on AVX-512, 8 on AVX2 and NEON): a block of 4 registers' keys by default,
    and 4 registers' values a row, so that 2 rows' sums fill half of them."""
    group = h_q // h_kv
    cap = _log2_cap(softcap)
    _check(h_q, h_kv, d, lanes)
    block_k = block_k or 4 * simd
    chunk = _value_chunk(d, simd, 4)

    @T.prim_func
    def batch_prefill_ragged_kv(
        var_q: T.handle, var_q_indptr: T.handle, var_k: T.handle, var_v: T.handle, var_kv_indptr: T.handle,
        var_q_rope_position: T.handle, var_k_rope_pos_offset: T.handle, var_output: T.handle,
        var_lse: T.handle, causal: T.int32, rotary_mode: T.int32, rope_scale: T.float32,
        rope_theta: T.float32, sm_scale: T.float32,
    ):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        batch_size = T.int32()
        qo_len = T.int32()
        kv_len = T.int32()
        output = T.match_buffer(var_output, (qo_len, h_q, d), dtype)
        lse = T.match_buffer(var_lse, (qo_len, h_q), "float32")
        q_indptr_elem_offset = T.int32()
        kv_indptr_elem_offset = T.int32()
        q_rope_position_elem_offset = T.int32()
        k_rope_pos_offset_elem_offset = T.int32()
        q = T.match_buffer(var_q, (qo_len, h_q, d), dtype)
        q_indptr = T.match_buffer(var_q_indptr, (batch_size + 1,), "int32", elem_offset=q_indptr_elem_offset)
        k = T.match_buffer(var_k, (kv_len, h_kv, d), dtype)
        v = T.match_buffer(var_v, (kv_len, h_kv, d), dtype)
        kv_indptr = T.match_buffer(var_kv_indptr, (batch_size + 1,), "int32", elem_offset=kv_indptr_elem_offset)
        q_rope_position = T.match_buffer(var_q_rope_position, (qo_len,), "int32",
                                         elem_offset=q_rope_position_elem_offset)
        k_rope_pos_offset = T.match_buffer(var_k_rope_pos_offset, (batch_size,), "int32",
                                           elem_offset=k_rope_pos_offset_elem_offset)
        assert rotary_mode == 0, "kiln's CPU attention needs RoPE applied before the KV cache"

        for b in T.serial(batch_size):
            q0: T.let[T.int32] = q_indptr[b]
            qn: T.let[T.int32] = q_indptr[b + 1] - q_indptr[b]
            k0: T.let[T.int32] = kv_indptr[b]
            kn: T.let[T.int32] = kv_indptr[b + 1] - kv_indptr[b]
            n_qt: T.let[T.int32] = (qn + block_q - 1) // block_q
            for task in T.parallel(h_kv * n_qt):
                Qs = T.alloc_buffer((group * block_q, d), "float32")
                O = T.alloc_buffer((group * block_q, d), "float32")
                m = T.alloc_buffer((group * block_q,), "float32")
                l = T.alloc_buffer((group * block_q,), "float32")
                Kt = T.alloc_buffer((d, block_k), "float32")
                S = T.alloc_buffer((block_q, block_k), "float32")
                acc = T.alloc_buffer((2, block_k), "float32")
                oacc = T.alloc_buffer((2, chunk), "float32")
                tmp = T.alloc_buffer((block_k,), "float32")
                scal = T.alloc_buffer((3,), "float32")
                alpha = T.alloc_buffer((2,), "float32")
                hk: T.let[T.int32] = task // n_qt
                r0: T.let[T.int32] = _balanced(task % n_qt, n_qt) * block_q
                rows: T.let[T.int32] = T.min(block_q, qn - r0)
                kv_end: T.let[T.int32] = T.if_then_else(causal > 0, T.min(kn, kn - qn + r0 + rows), kn)
                for gi in T.serial(group * block_q):
                    for dd in T.vectorized(d):
                        Qs[gi, dd] = T.if_then_else(
                            gi % block_q < rows,
                            T.Cast("float32", q[q0 + r0 + T.min(gi % block_q, rows - 1),
                                                hk * group + gi // block_q, dd]) * sm_scale * T.float32(LOG2E),
                            T.float32(0.0))
                        O[gi, dd] = T.float32(0.0)
                    m[gi] = T.float32(NEG)
                    l[gi] = T.float32(0.0)
                for kb in T.serial((kv_end + block_k - 1) // block_k):
                    c0: T.let[T.int32] = kb * block_k
                    for dd in T.serial(d):
                        for j in T.vectorized(block_k):
                            Kt[dd, j] = T.Cast("float32", k[k0 + T.min(c0 + j, kn - 1), hk, dd])
                    for g in T.serial(group):
                        # rows in pairs: each key and value vector loaded once for both, twice the
                        # independent multiply-adds (a row past `rows` is zeros, computed, not kept)
                        for i2 in T.serial((rows + 1) // 2):
                            for r, j in T.grid(2, block_k):
                                acc[r, j] = T.float32(0.0)
                            for dd in T.serial(d):
                                for r in T.unroll(2):
                                    for j in T.vectorized(block_k):
                                        acc[r, j] = acc[r, j] + Qs[g * block_q + 2 * i2 + r, dd] * Kt[dd, j]
                            for r in T.unroll(2):
                                for j in T.vectorized(block_k):
                                    S[2 * i2 + r, j] = acc[r, j]
                            for r in T.serial(2):
                                if 2 * i2 + r < rows:
                                    online_softmax_block(
                                        S, 2 * i2 + r, block_k,
                                        T.if_then_else(causal > 0, T.min(kn, kn - qn + r0 + 2 * i2 + r + 1), kn) - c0,
                                        m, l, g * block_q + 2 * i2 + r, tmp, scal, cap)
                                    alpha[r] = scal[0]
                                else:
                                    for j in T.vectorized(block_k):
                                        S[2 * i2 + r, j] = T.float32(0.0)
                                    alpha[r] = T.float32(0.0)
                            add_weighted_values(O, g * block_q + 2 * i2, S, 2 * i2, 2, alpha,
                                                T.min(block_k, kv_end - c0), _rows_of(v, k0 + c0, hk), d, chunk, oacc)
                for g in T.serial(group):
                    for i in T.serial(rows):
                        for dd in T.vectorized(d):
                            output[q0 + r0 + i, hk * group + g, dd] = T.Cast(
                                dtype, O[g * block_q + i, dd] / T.max(l[g * block_q + i], T.float32(1e-30)))
                        lse[q0 + r0 + i, hk * group + g] = T.if_then_else(
                            l[g * block_q + i] > T.float32(0.0),
                            m[g * block_q + i] + T.log2(l[g * block_q + i]), T.float32(EMPTY_LSE))

    return batch_prefill_ragged_kv


def _balanced(t, count):
    """The t-th of `count` causal row blocks in the order that balances threads: 0, count - 1, 1,
    count - 2, ... (T.parallel hands each thread a contiguous run of tasks, and a causal block's
    keys grow with its index: in index order one of 2 threads had 3/4 of the work)."""
    return T.if_then_else(t % 2 == 0, t // 2, count - 1 - t // 2)


def _last_rows(length_info, b, sliding: bool):
    """The rows of sequence b's last page in use (length_info is [3, batch] for the sliding kernels)."""
    return length_info[0, b] if sliding else length_info[b]


def _sliding_rows(length_info, b, kn, first, lo=None):
    """Which rows j of the page whose first row is `first` a sliding-window kernel counts: the
    attention sink's (physical rows before length_info[2, b]) and the window's (from its first row
    length_info[1, b] on), before kn (the rows in the pages), and of those only the ones at logical
    row >= lo (TVM's logical rows: the sink's, then the window's, numbered on from the sink's end).
    The rows between the sink and the window hold memory the window left, possibly NaN."""
    sink, offset = length_info[2, b], length_info[1, b]
    if lo is None:                  # every row of the sink and the window
        return lambda j: tirx.all(first + j < kn, tirx.any(first + j < sink, first + j >= offset))
    return lambda j: tirx.all(first + j < kn, tirx.any(tirx.all(first + j < sink, first + j >= lo),
                                                       first + j >= offset + T.max(lo - sink, 0)))


def _window_first(causal, kv_len, window: int, r):
    """TVM's sliding-window cross mask (_causal_or_sliding_cross_mask): the first of the cache's kv_len
    logical rows that new row r sees, with `causal` (its window's other r + 1 rows are new ones)."""
    return T.if_then_else(causal > 0, T.max(kv_len - T.max(window - r - 1, 0), 0), 0)


def _page_seen(length_info, b, pg, page_size: int, lo, sliding: bool, window_rows: int = 0):
    """Whether a block of new rows whose first row sees logical rows from lo on reads page pg: a
    sliding window's page with none of the sink's rows that ends before that row is skipped (with
    window_rows, lo is the first token the block's first row sees)."""
    if window_rows:
        return (pg + 1) * page_size > lo
    if not sliding:
        return True
    sink, offset = length_info[2, b], length_info[1, b]
    return tirx.any(pg * page_size < sink, (pg + 1) * page_size > offset + T.max(lo - sink, 0))


def _prefill_cols(causal, length_info, b, kn, qn, r0, i, first, kv_len, window: int, sliding: bool,
                  window_rows: int = 0):
    """The columns of the page whose first row is `first` that new row r0 + i of sequence b sees (qn new
    rows, kn rows in the pages): a count, causal as TVM masks; sliding, a predicate (_sliding_rows from
    TVM's cross mask's first row, _window_first); window_rows, a predicate: the row's last window_rows
    tokens, itself included."""
    if window_rows:
        end = kn - qn + r0 + i + 1
        return lambda j: tirx.all(first + j < end, first + j >= end - window_rows)
    if sliding:
        return _sliding_rows(length_info, b, kn, first, _window_first(causal, kv_len, window, r0 + i))
    return T.if_then_else(causal > 0, T.min(kn, kn - qn + r0 + i + 1), kn) - first


def _rows_of(v, row0, hk):
    """value(p, j, c) for add_weighted_values: p times column c of row row0 + j of v's kv head hk."""
    return lambda p, j, c: p * T.Cast("float32", v[row0 + j, hk, c])


def _page_rows(pages, page_no, hk, length_info, b, kn, first, sliding: bool):
    """value(p, j, c) for add_weighted_values over a cache page's value rows (the page whose first row
    is `first`); sliding, 0 for a row the window and its sink leave out (selected, not multiplied by
    0: the row may hold NaN, and NaN times 0 is NaN). T.if_then_else, unlike the softmax's masks: its
    condition is the row's, one branch a row (a T.Select blended every vector: Gemma 3's sliding decode
    kernel 3-6% slower)."""
    def value(p, j, c):
        product = p * T.Cast("float32", pages[page_no, 1, hk, j, c])
        if not sliding:
            return product
        return T.if_then_else(_sliding_rows(length_info, b, kn, first)(j), product, T.float32(0))
    return value


@parsed_once()
def attention_paged_cpu(h_kv: int, h_q: int, d: int, dtype: str, page_size: int, decode: bool,
                        lanes: int = 16, block_q: int = 16, softcap: float | None = None, sliding: bool = False,
                        window: int = 0, simd: int = 16, window_rows: int = 0):
    """Attention of new query rows over the paged cache (TVM's prefill or decode CPU signature).

    ``decode=True``: one row per sequence (Q is [batch, h_q, d]): attention_decode_cpu. Otherwise
    rows come ragged through q_indptr, tasks are (query head, block of rows), and `causal` masks
    as TVM does (column < kv_len - q_len + row + 1).

    ``sliding`` (prefill): TVM's ``batch_prefill_paged_kv_cpu_sliding_window``, the new rows against
    the cached rows of a sliding-window layer, length_info [3, batch] as in the decode kernel. Its
    `causal` is TVM's cross mask for a window of ``window`` tokens (a compile-time constant of TVM's
    kernel): new row r sees the last window - r - 1 of the cache's logical rows (sink, then window),
    the other r + 1 of its window being new rows (the ragged kernel's); without `causal` it sees them
    all. A block of rows skips the pages before the first row it sees.

    ``window_rows`` (prefill, causal): a sliding layer of the KV cache kiln owns (models/owned_kv.py), every
    token in the pages in order and the new rows the last qn of them: row r sees the `window_rows` tokens
    up to itself (transformers' kv_idx > q_idx - sliding_window), whatever the chunk."""
    if window_rows and (decode or sliding):
        raise ValueError("window_rows is the paged prefill kernel's own masking; it takes neither decode nor sliding")
    if decode:
        return attention_decode_cpu(h_kv, h_q, d, dtype, page_size, lanes, softcap, sliding=sliding, simd=simd)
    if sliding and window <= 0:
        raise ValueError("the sliding-window prefill needs the window's size")
    group = h_q // h_kv
    _check(h_q, h_kv, d, lanes)
    rows_per_task = block_q
    cap = _log2_cap(softcap)
    chunk = _value_chunk(d, simd, 2)

    @T.macro(hygienic=False)
    def attend(q_row0, rows, qn, causal, b, h, group, page_size, rows_per_task, d, dtype, cap, sliding, window, chunk,
               window_rows):
        """Rows q_row0 .. q_row0 + rows of head h of sequence b against its pages."""
        hk: T.let[T.int32] = h // group
        p0: T.let[T.int32] = page_indptr[b]
        kn: T.let[T.int32] = T.if_then_else(page_indptr[b + 1] > p0,
                                     (page_indptr[b + 1] - p0 - 1) * page_size + _last_rows(length_info, b, sliding), 0)
        kv_end: T.let[T.int32] = kn if sliding else T.if_then_else(
            causal > 0, T.min(kn, kn - qn + (q_row0 - q_first) + rows), kn)
        # sliding: the cache's logical rows (the sink's, then the window's) and the first one row q_row0 sees
        kv_len: T.let[T.int32] = (T.if_then_else(kn > 0, kn - length_info[1, b] + length_info[2, b], 0)
                                  if sliding else kn)
        lo0: T.let[T.int32] = (_window_first(causal, kv_len, window, q_row0 - q_first) if sliding else
                               T.max(kn - qn + (q_row0 - q_first) + 1 - window_rows, 0) if window_rows > 0 else 0)
        Qs = T.alloc_buffer((rows_per_task, d), "float32")
        O = T.alloc_buffer((rows_per_task, d), "float32")
        m = T.alloc_buffer((rows_per_task,), "float32")
        l = T.alloc_buffer((rows_per_task,), "float32")
        Kt = T.alloc_buffer((d, page_size), "float32")
        S = T.alloc_buffer((rows_per_task, page_size), "float32")
        acc = T.alloc_buffer((QUAD, page_size), "float32")
        oacc = T.alloc_buffer((QUAD, chunk), "float32")
        alpha = T.alloc_buffer((QUAD,), "float32")
        tmp = T.alloc_buffer((page_size,), "float32")
        scal = T.alloc_buffer((3,), "float32")
        for i in T.serial(rows_per_task):         # rows past `rows`: zeros (computed, not kept)
            for dd in T.vectorized(d):
                Qs[i, dd] = T.if_then_else(
                    i < rows, T.Cast("float32", q[q_row0 + T.min(i, rows - 1), h, dd]) * sm_scale * T.float32(LOG2E),
                    T.float32(0.0))
                O[i, dd] = T.float32(0.0)
            m[i] = T.float32(NEG)
            l[i] = T.float32(0.0)
        for pg in T.serial((kv_end + page_size - 1) // page_size):
            if _page_seen(length_info, b, pg, page_size, lo0, sliding, window_rows):
                page_no: T.let[T.int32] = page_values[p0 + pg]
                for dd in T.serial(d):
                    for j in T.vectorized(page_size):
                        Kt[dd, j] = T.Cast("float32", pages[page_no, 0, hk, j, dd])
                # rows QUAD at a time: each key and value vector loaded once for them, QUAD times the
                # independent multiply-adds (one row's page of scores was one chain: latency-bound)
                for i4 in T.serial((rows + QUAD - 1) // QUAD):
                    for r, j in T.grid(QUAD, page_size):
                        acc[r, j] = T.float32(0.0)
                    for dd in T.serial(d):
                        for r in T.unroll(QUAD):
                            for j in T.vectorized(page_size):
                                acc[r, j] = acc[r, j] + Qs[i4 * QUAD + r, dd] * Kt[dd, j]
                    for r in T.unroll(QUAD):
                        for j in T.vectorized(page_size):
                            S[i4 * QUAD + r, j] = acc[r, j]
                    for r in T.serial(QUAD):
                        if i4 * QUAD + r < rows:
                            online_softmax_block(
                                S, i4 * QUAD + r, page_size,
                                _prefill_cols(causal, length_info, b, kn, qn, q_row0 - q_first, i4 * QUAD + r,
                                              pg * page_size, kv_len, window, sliding, window_rows),
                                m, l, i4 * QUAD + r, tmp, scal, cap)
                            alpha[r] = scal[0]
                        else:
                            for j in T.vectorized(page_size):
                                S[i4 * QUAD + r, j] = T.float32(0.0)
                            alpha[r] = T.float32(0.0)
                    add_weighted_values(O, i4 * QUAD, S, i4 * QUAD, QUAD, alpha,
                                        T.min(page_size, kv_end - pg * page_size),
                                        _page_rows(pages, page_no, hk, length_info, b, kn, pg * page_size, sliding),
                                        d, chunk, oacc)
        for i in T.serial(rows):
            for dd in T.vectorized(d):
                output[q_row0 + i, h, dd] = T.Cast(dtype, O[i, dd] / T.max(l[i], T.float32(1e-30)))
            lse[q_row0 + i, h] = T.if_then_else(l[i] > T.float32(0.0), m[i] + T.log2(l[i]),
                                                T.float32(EMPTY_LSE))

    @T.prim_func
    def batch_prefill_paged_kv(
        var_q: T.handle, var_q_indptr: T.handle, var_pages: T.handle, var_page_indptr: T.handle,
        var_page_values: T.handle, var_length_info: T.handle, var_k_rope_pos_offset: T.handle,
        var_q_rope_position: T.handle, var_output: T.handle, var_lse: T.handle, causal: T.int32,
        rotary_mode: T.int32, rope_scale: T.float32, rope_theta: T.float32, sm_scale: T.float32,
    ):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        batch_size = T.int32()
        total_len = T.int32()
        nnz_pages = T.int32()
        max_num_pages = T.int32()
        q_indptr_elem_offset = T.int32()
        page_indptr_elem_offset = T.int32()
        page_values_elem_offset = T.int32()
        k_rope_pos_offset_elem_offset = T.int32()
        q_rope_position_elem_offset = T.int32()
        length_info_elem_offset = T.int32()
        q = T.match_buffer(var_q, (total_len, h_q, d), dtype)
        q_indptr = T.match_buffer(var_q_indptr, (batch_size + 1,), "int32", elem_offset=q_indptr_elem_offset)
        pages = T.match_buffer(var_pages, (max_num_pages, 2, h_kv, page_size, d), dtype)
        page_indptr = T.match_buffer(var_page_indptr, (batch_size + 1,), "int32", elem_offset=page_indptr_elem_offset)
        page_values = T.match_buffer(var_page_values, (nnz_pages,), "int32", elem_offset=page_values_elem_offset)
        length_info = T.match_buffer(var_length_info, (3, batch_size) if sliding else (batch_size,), "int32",
                                     elem_offset=length_info_elem_offset)
        k_rope_pos_offset = T.match_buffer(var_k_rope_pos_offset, (batch_size,), "int32",
                                           elem_offset=k_rope_pos_offset_elem_offset)
        q_rope_position = T.match_buffer(var_q_rope_position, (total_len,), "int32",
                                         elem_offset=q_rope_position_elem_offset)
        output = T.match_buffer(var_output, (total_len, h_q, d), dtype)
        lse = T.match_buffer(var_lse, (total_len, h_q), "float32")
        assert rotary_mode == 0, "kiln's CPU attention needs RoPE applied before the KV cache"
        for b in T.serial(batch_size):
            q_first: T.let[T.int32] = q_indptr[b]
            qn: T.let[T.int32] = q_indptr[b + 1] - q_indptr[b]
            n_qt: T.let[T.int32] = (qn + block_q - 1) // block_q
            for task in T.parallel(h_q * n_qt):
                attend(q_first + task % n_qt * block_q, T.min(block_q, qn - task % n_qt * block_q), qn, causal,
                       b, task // n_qt, group, page_size, rows_per_task, d, dtype, cap, sliding, window, chunk,
                       window_rows)

    return batch_prefill_paged_kv


SPLITS = 4                 # decode: each (sequence, kv head)'s pages split between this many tasks
LINE_BYTES = 64            # a cache line: decode prefetches the next page's rows a line at a time


def attention_decode_cpu(h_kv: int, h_q: int, d: int, dtype: str, page_size: int, lanes: int = 16,
                         softcap: float | None = None, splits: int = SPLITS, sliding: bool = False,
                         simd: int = 16):
    """Decode attention over the paged cache (TVM's decode CPU signature): one query row per sequence.

    A task per (sequence, kv head, split of its pages): the kv head's `group` query heads together,
    so each key and value row is read once for all of them (a task per query head read a kv head's
    pages `group` times: at 2,048 tokens of SmolLM2's cache, 1 MB a kv head, from memory each time);
    the splits keep both cores busy at one sequence of 3 kv heads. Each task leaves its rows'
    unnormalised output, running max and sum; a second loop merges a row's splits (flash-decoding).

    While a task reads a page it prefetches the next page's rows, one key and value row per key row:
    a model's KV cache is read from memory every step (all its layers outgrow the caches), and the
    hardware prefetchers stop at each page's edge. SmolLM2 Q4_1 on 2 znver4 cores, attention a
    layer in the model: 8 sequences at 1,000 tokens 0.70 ms against 0.82 / 0.95; batch-1 decode at
    2,000 tokens 94-95 tok/s against 73-88; short contexts level. (Stop 45 measured no gain from a
    next-page prefetch on the kernel alone: called again and again on one layer's pages, it finds
    them cached. Time it in the model, or over more pages than the caches hold.) The prefetches go
    into L2 (prefetch_read's into_l1=False): 30 layers' caches, one sequence, 2 znver4 cores, alternating
    builds, us a call into L1 / into L2: SmolLM2's shape at 1,024 tokens 71.0 / 44.5 (35 GB/s of KV),
    at 4,096 402 / 260, at 256 level (cached); Gemma 3's (1 kv head, head dim 256) at 1,000 128.5 / 83.2;
    an 8B's (8 kv heads, 128) at 1,024 495 / 350. Outputs identical. SmolLM2 Q4_1 in the model
    (compare_revisions, prompt 1,024, 3 rounds): decode 125.4 -> 138.6 tok/s (per round 1.29, 1.03, 1.04);
    4 sequences 184.5 -> 233.5 (1.27x).

    ``sliding``: TVM's sliding-window decode (``batch_decode_paged_kv_cpu_sliding_window``: Mistral,
    Gemma 2 and 3, Qwen2's and others' sliding layers): length_info is [3, batch] (the last page's
    rows, the window's first row in the pages, the attention sink's rows) and the rows that count
    are the sink's (before it) and the window's (from its first row on); the pages are the same.
    Gemma 3 270M (15 of its 18 layers slide), 600-token prompt, 2 Sapphire Rapids cores, alternating
    against TVM's scalar kernel: decode 40.7 -> 71.2 tok/s."""
    group = h_q // h_kv
    per_line = LINE_BYTES // tvm_ffi.dtype(dtype).itemsize     # elements a cache line

    def counted(length_info, b, kn, first):
        """Which rows of the page whose first row is `first` count (kn: the rows in the pages)."""
        return _sliding_rows(length_info, b, kn, first) if sliding else kn - first

    lines = max(1, d // per_line)
    _check(h_q, h_kv, d, lanes)
    cap = _log2_cap(softcap)
    chunk = _value_chunk(d, simd, 8)

    @T.prim_func
    def batch_decode_paged_kv(
        var_q: T.handle, var_pages: T.handle, var_page_indptr: T.handle, var_page_values: T.handle,
        var_length_info: T.handle, var_k_rope_pos_offset: T.handle, var_q_rope_position: T.handle,
        var_output: T.handle, var_lse: T.handle, rotary_mode: T.int32, rope_scale: T.float32,
        rope_theta: T.float32, sm_scale: T.float32,
    ):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        batch_size = T.int32()
        output = T.match_buffer(var_output, (batch_size, h_q, d), dtype)
        lse = T.match_buffer(var_lse, (batch_size, h_q), "float32")
        nnz_pages = T.int32()
        max_num_pages = T.int32()
        page_indptr_elem_offset = T.int32()
        page_values_elem_offset = T.int32()
        k_rope_pos_offset_elem_offset = T.int32()
        q_rope_position_elem_offset = T.int32()
        length_info_elem_offset = T.int32()
        q = T.match_buffer(var_q, (batch_size, h_q, d), dtype)
        pages = T.match_buffer(var_pages, (max_num_pages, 2, h_kv, page_size, d), dtype)
        page_indptr = T.match_buffer(var_page_indptr, (batch_size + 1,), "int32",
                                     elem_offset=page_indptr_elem_offset)
        page_values = T.match_buffer(var_page_values, (nnz_pages,), "int32", elem_offset=page_values_elem_offset)
        length_info = T.match_buffer(var_length_info, (3, batch_size) if sliding else (batch_size,), "int32",
                                     elem_offset=length_info_elem_offset)
        T.match_buffer(var_k_rope_pos_offset, (batch_size,), "int32", elem_offset=k_rope_pos_offset_elem_offset)
        T.match_buffer(var_q_rope_position, (batch_size,), "int32", elem_offset=q_rope_position_elem_offset)
        assert rotary_mode == 0, "kiln's CPU attention needs RoPE applied before the KV cache"
        part_o = T.alloc_buffer((batch_size * h_kv * splits, group, d), "float32")
        part_m = T.alloc_buffer((batch_size * h_kv * splits, group), "float32")
        part_l = T.alloc_buffer((batch_size * h_kv * splits, group), "float32")
        for task in T.parallel(batch_size * h_kv * splits):
            b: T.let[T.int32] = task // (h_kv * splits)
            hk: T.let[T.int32] = task // splits % h_kv
            p0: T.let[T.int32] = page_indptr[b]
            n_pages: T.let[T.int32] = page_indptr[b + 1] - p0
            kn: T.let[T.int32] = T.if_then_else(n_pages > 0,
                                                (n_pages - 1) * page_size + _last_rows(length_info, b, sliding), 0)
            per: T.let[T.int32] = (n_pages + splits - 1) // splits
            pg0: T.let[T.int32] = T.min(task % splits * per, n_pages)
            Qs = T.alloc_buffer((group, d), "float32")
            O = T.alloc_buffer((group, d), "float32")
            m = T.alloc_buffer((group,), "float32")
            l = T.alloc_buffer((group,), "float32")
            dacc = T.alloc_buffer((group, lanes), "float32")
            S = T.alloc_buffer((group, page_size), "float32")
            oacc = T.alloc_buffer((1, chunk), "float32")
            tmp = T.alloc_buffer((page_size,), "float32")
            scal = T.alloc_buffer((3,), "float32")
            for g in T.serial(group):
                for dd in T.vectorized(d):
                    Qs[g, dd] = T.Cast("float32", q[b, hk * group + g, dd]) * sm_scale * T.float32(LOG2E)
                    O[g, dd] = T.float32(0.0)
                m[g] = T.float32(NEG)
                l[g] = T.float32(0.0)
            for pg in T.serial(T.min(pg0 + per, n_pages) - pg0):
                page_no: T.let[T.int32] = page_values[p0 + pg0 + pg]
                next_no: T.let[T.int32] = page_values[p0 + T.min(pg0 + pg + 1, n_pages - 1)]
                # scores: a dot product per key row and query head (lanes-wide partial sums, then summed),
                # each key vector loaded once for the group
                for j in T.serial(page_size):
                    # the next page's key and value row j asked for now (a read, into L2: prefetch_read)
                    for kv in T.unroll(2):
                        for line in T.unroll(lines):
                            T.evaluate(prefetch_read(T.address_of(pages[next_no, kv, hk, j, line * per_line]),
                                                     into_l1=False))
                    for g in T.serial(group):
                        for ll in T.vectorized(lanes):
                            dacc[g, ll] = T.float32(0.0)
                    for dv in T.serial(d // lanes):
                        for g in T.serial(group):
                            for ll in T.vectorized(lanes):
                                dacc[g, ll] = dacc[g, ll] + Qs[g, dv * lanes + ll] * T.Cast(
                                    "float32", pages[page_no, 0, hk, j, dv * lanes + ll])
                    for g in T.serial(group):           # each head's lanes summed by halves
                        for ll in T.vectorized(lanes // 2):
                            dacc[g, ll] = dacc[g, ll] + dacc[g, ll + lanes // 2]
                        for ll in T.vectorized(lanes // 4):
                            dacc[g, ll] = dacc[g, ll] + dacc[g, ll + lanes // 4]
                        S[g, j] = (dacc[g, 0] + dacc[g, 2]) + (dacc[g, 1] + dacc[g, 3])
                for g in T.serial(group):
                    online_softmax_block(S, g, page_size, counted(length_info, b, kn, (pg0 + pg) * page_size),
                                         m, l, g, tmp, scal, cap)
                    add_weighted_values(O, g, S, g, 1, scal, T.min(page_size, kn - (pg0 + pg) * page_size),
                                        _page_rows(pages, page_no, hk, length_info, b, kn, (pg0 + pg) * page_size,
                                                   sliding), d, chunk, oacc)
            for g in T.serial(group):
                for dd in T.vectorized(d):
                    part_o[task, g, dd] = O[g, dd]
                part_m[task, g] = m[g]
                part_l[task, g] = l[g]
        for row in T.parallel(batch_size * h_q):
            # a query head's splits merged: the largest max, the others' sums and outputs scaled to it
            base: T.let[T.int32] = (row // h_q * h_kv + row % h_q // group) * splits
            g: T.let[T.int32] = row % h_q % group
            acc = T.alloc_buffer((d,), "float32")
            ms = T.alloc_buffer((3,), "float32")      # 0 max, 1 sum, 2 a split's scale
            ms[0] = T.float32(NEG)
            for sp in T.serial(splits):
                ms[0] = T.max(ms[0], part_m[base + sp, g])
            ms[1] = T.float32(0.0)
            for dd in T.vectorized(d):
                acc[dd] = T.float32(0.0)
            for sp in T.serial(splits):
                ms[2] = T.exp2(part_m[base + sp, g] - ms[0])
                ms[1] = ms[1] + part_l[base + sp, g] * ms[2]
                for dd in T.vectorized(d):
                    acc[dd] = acc[dd] + part_o[base + sp, g, dd] * ms[2]
            for dd in T.vectorized(d):
                output[row // h_q, row % h_q, dd] = T.Cast(dtype, acc[dd] / T.max(ms[1], T.float32(1e-30)))
            lse[row // h_q, row % h_q] = T.if_then_else(ms[1] > T.float32(0.0), ms[0] + T.log2(ms[1]),
                                                        T.float32(EMPTY_LSE))

    return batch_decode_paged_kv


@parsed_once()
def split_rotary_cpu(theta: float, scale: float, d: int, h_q: int, h_kv: int, dtype: str):
    """Split fused qkv into q, k, v and apply RoPE (rotate-half) to q and k: TVM's ``fused_rope``.

    Same signature and arithmetic as TVM's default-scaling kernel (freq = pos * scale /
    theta^(2i/d), cos and sin in float32), but cos/sin are computed once per token and
    frequency, not once per element: TVM's evaluates pow, cos and sin (three libm calls)
    for each of the (h_q + h_kv) * d elements of a token."""
    half = d // 2
    fused = h_q + 2 * h_kv

    @T.macro(hygienic=False)
    def rotate(dst, dst_head, src_head, s, cs, sn, half):
        for i in T.vectorized(half):
            dst[s, dst_head, i] = T.Cast(dtype, T.Cast("float32", qkv[s, src_head, i]) * cs[i]
                                         - T.Cast("float32", qkv[s, src_head, i + half]) * sn[i])
            dst[s, dst_head, i + half] = T.Cast(dtype, T.Cast("float32", qkv[s, src_head, i + half]) * cs[i]
                                                + T.Cast("float32", qkv[s, src_head, i]) * sn[i])

    @T.prim_func
    def fused_rope(var_qkv: T.handle, var_position_map: T.handle, var_q: T.handle, var_k: T.handle,
                   var_v: T.handle, apply_rope: T.int64):
        T.func_attr({"op_pattern": 8, "tirx.noalias": True, "tirx.is_scheduled": True})
        seq_len = T.int32()
        position_map_elem_offset = T.int32()
        qkv = T.match_buffer(var_qkv, (seq_len, fused, d), dtype)
        q = T.match_buffer(var_q, (seq_len, h_q, d), dtype)
        k = T.match_buffer(var_k, (seq_len, h_kv, d), dtype)
        v = T.match_buffer(var_v, (seq_len, h_kv, d), dtype)
        position_map = T.match_buffer(var_position_map, (seq_len,), "int32", elem_offset=position_map_elem_offset)
        for s in T.parallel(seq_len):
            cs = T.alloc_buffer((half,), "float32")
            sn = T.alloc_buffer((half,), "float32")
            for i in T.serial(half):
                cs[i] = T.cos(T.Cast("float32", position_map[s]) * T.float32(scale)
                              / T.pow(T.float32(theta), T.Cast("float32", i * 2) / T.float32(d)))
                sn[i] = T.sin(T.Cast("float32", position_map[s]) * T.float32(scale)
                              / T.pow(T.float32(theta), T.Cast("float32", i * 2) / T.float32(d)))
            if apply_rope > T.int64(0):
                for h in T.serial(h_q):
                    rotate(q, h, h, s, cs, sn, half)
                for h in T.serial(h_kv):
                    rotate(k, h, h_q + h, s, cs, sn, half)
            else:
                for h, i in T.grid(h_q, d):
                    q[s, h, i] = qkv[s, h, i]
                for h, i in T.grid(h_kv, d):
                    k[s, h, i] = qkv[s, h_q + h, i]
            for h, i in T.grid(h_kv, d):
                v[s, h, i] = qkv[s, h_q + h_kv + h, i]

    return fused_rope


def _log2_cap(softcap: float | None) -> float:
    """The soft-cap in the kernels' log2 score domain (0: none)."""
    return float(softcap) * LOG2E if softcap else 0.0


def _value_chunk(d: int, simd: int, vectors: int) -> int:
    """The head-dim values O += P V keeps in registers a row: up to `vectors` SIMD registers of `simd`
    floats, the most that divide d (fewer than a register where none does)."""
    sizes = [v * simd for v in range(vectors, 0, -1)] + [16, 8, 4, 2, 1]
    return next(c for c in sizes if c <= d and d % c == 0)


def _check(h_q: int, h_kv: int, d: int, lanes: int) -> None:
    if h_q % h_kv or d % lanes:
        raise ValueError(f"kiln CPU attention needs h_q % h_kv == 0 and head_dim % {lanes} == 0 "
                         f"(got h_q={h_q}, h_kv={h_kv}, head_dim={d})")


__all__ = ["attention_prefill_ragged_cpu", "attention_paged_cpu", "fast_exp2", "fast_exp2_kernel", "split_rotary_cpu"]
