"""Paged decode attention for GPUs that keeps many KV loads in flight (one token a sequence).

Why: on an H100 (2026-11-26) TVM's decode kernel (relax/frontend/nn/llm/_decode_kernels.py) took
16.8 us a call for the 8B's 128-token sequences at batch 1, where reading the layer's 0.5 MB of
keys and values takes ~0.2 us: 32 of 4.27 ms a step. A work-group per sequence and KV head (8 at
batch 1) walks the tokens 16 at a time, each step a page-table load, then the K/V rows, then a
barrier, then a shuffle reduction per token and query head, one after another: latency, not
bandwidth.

Here a work-group (a sequence and a KV head, with every query head of its group) splits the
sequence between its warps and those warps never wait on each other until the end. A token's
row is read by `lanes` threads, 16 bytes each (D = 128 float16: 16 lanes, two tokens a warp); a
thread loads `unroll` tokens' keys and values before using any, so each warp keeps
unroll x 2 x 16 bytes a lane in flight; then each query head's score is the lanes' partial dot
products summed across those lanes (tvm_thread_allreduce: warp shuffles on CUDA, shared memory
where a target has none), and each slot (a warp's tokens) keeps its own online softmax. At the
end the slots' (max, sum, output) meet once in shared memory.

Long sequences in a small batch (few work-groups: 8 for the 8B at batch 1) are split: the host
code picks, per call, how many work-groups share each sequence from what it knows (the batch
and the pages it holds: split_count); each writes its share's (max, sum, unnormalised output)
to a workspace and a second kernel merges them. Where nothing is split, one kernel runs.

Measured (H100, 2026-11-27, tools/gpu_checks.py `variants`, 2 of the 8B's layers, 128-token
prompts): 8 us a call at batch 1 against TVM's 17, 9.5 against 18 at 16 sequences, 23.5 against
42.5 at 64, and 17 against 400 at one sequence after a 4,000-token prompt (split); logits within
0.006 of TVM's kernel's.

The function is a drop-in for TVM's: the same name, parameters and results (output [B, H_qo, D],
lse [B, H_qo] in base 2, output 0 and lse -5e4 for a sequence without tokens), rotary_mode
ignored: kiln swaps it in only where the cache applies RoPE before attention
(targets/kiln_attention.py). Its pages must start at their buffer's start (no element offset), as
the cache allocates them.
"""

from __future__ import annotations

import math

import tvm
from tvm import tirx
from tvm.script import tirx as T

from .kernel_memo import parsed_once

WARP = 32
LOG2E = math.log2(math.e)
_EMPTY_MAX = -5e4                  # TVM's initial max: what an empty sequence's lse reads


# Splitting a sequence between work-groups (each writes its share's softmax state to a workspace, a
# second kernel merges them) pays when there are few work-groups and long sequences: at most this
# many work-groups in all, each split at least MIN_SPLIT tokens (a few of its unrolled steps).
TARGET_GROUPS, MIN_SPLIT, MAX_SPLITS = 256, 256, 32


@T.macro
def merge_states(merged, state, out, count, dim):
    """merged = (max, sum, output, sum or 1 where 0) of `count` online-softmax states: state[s] =
    (max, sum), out[s, dim] the unnormalised output; no tokens at all: output 0, max -5e4."""
    merged[0] = T.float32(_EMPTY_MAX)
    for s in T.serial(count):
        merged[0] = T.max(merged[0], state[s, 0])
    merged[1] = T.float32(0)
    merged[2] = T.float32(0)
    for s in T.serial(count):
        w: T.let[T.float32] = T.exp2(state[s, 0] - merged[0])
        merged[1] = merged[1] + state[s, 1] * w
        merged[2] = merged[2] + out[s, dim] * w
    merged[3] = T.if_then_else(merged[1] > T.float32(0), merged[1], T.float32(1))


class SlotWalk:
    """The parts of a work-group's walk that decode and prefill share (targets/prefill_attention.py):
    `warps` x `per_warp` slots, each a row's `lanes` threads of `vec` values, walking its own share
    of the keys `unroll` at a time with its own online softmax over the `group` query heads."""

    def __init__(self, h_kv: int, h_qo: int, d: int, dtype: str, warps: int, unroll: int,
                 softcap: float | None = None) -> None:
        """`softcap`: each score s (scaled, in the log2 domain) becomes C tanh(s / C), C = softcap *
        log2(e): Gemma 2's c tanh(x / c) of the natural-log score."""
        if h_qo % h_kv:
            raise ValueError(f"{h_qo} query heads over {h_kv} KV heads")
        self.group = group = h_qo // h_kv
        vec = 16 // tvm.DataType(dtype).itemsize if dtype in ("float16", "bfloat16", "float32") else 0
        lanes = d // vec if vec and d % vec == 0 else 0
        if not lanes or lanes > WARP or WARP % lanes:
            raise ValueError(f"head dim {d} in {dtype} does not split into 16-byte lanes of a warp")
        self.vec, self.lanes, self.per_warp = vec, lanes, WARP // lanes
        self.slots, self.threads = self.per_warp * warps, WARP * warps
        self.step_tokens = self.slots * unroll             # keys the work-group reads per iteration
        slots, threads = self.slots, self.threads
        cap = None if softcap is None else T.float32(softcap * LOG2E)

        def score(summed):
            return summed if cap is None else cap * T.tanh(summed / cap)

        @T.macro
        def step(q, k_rows, v_rows, scores, part, summed, run_max, run_sum, acc, new_max, first, bound, tx):
            """Keys first + u * slots (u < unroll, those below `bound`), loaded into k_rows / v_rows:
            their scores (each lane's part of the dot product summed over the row's lanes; serial
            loops: TVM lowers one allreduce per statement, nvcc unrolls them; soft-capped if asked),
            then the slot's online softmax."""
            for u in T.serial(unroll):
                for i in T.serial(group):
                    part[0] = T.float32(0)
                    for j in T.unroll(vec):
                        part[0] = part[0] + q[i, j] * T.Cast("float32", k_rows[u, j])
                    with T.sblock("lanes_sum"):
                        T.reads(part[0])
                        T.writes(summed[0])
                        T.attr(T.comm_reducer(lambda a, b: a + b, [T.float32(0)]), "reduce_scope", T.int32(0))
                        T.tvm_thread_allreduce(T.uint32(1), part[0], True, summed[0], tx, dtype="void")
                    scores[u, i] = score(summed[0])
            for i in T.unroll(group):
                new_max[0] = run_max[i]
                for u in T.unroll(unroll):
                    if first + u * slots < bound:
                        new_max[0] = T.max(new_max[0], scores[u, i])
                rescale: T.let[T.float32] = T.exp2(run_max[i] - new_max[0])
                run_sum[i] = run_sum[i] * rescale
                for j in T.unroll(vec):
                    acc[i, j] = acc[i, j] * rescale
                for u in T.unroll(unroll):
                    if first + u * slots < bound:
                        p: T.let[T.float32] = T.exp2(scores[u, i] - new_max[0])
                        run_sum[i] = run_sum[i] + p
                        for j in T.unroll(vec):
                            acc[i, j] = acc[i, j] + p * T.Cast("float32", v_rows[u, j])
                run_max[i] = new_max[0]

        @T.macro
        def share(acc, run_max, run_sum, slot_out, slot_state, i, slot, tx):
            """Query head i's state of every slot in shared memory (a barrier after)."""
            for j in T.unroll(vec):
                slot_out[slot, tx * vec + j] = acc[i, j]
            if tx == 0:
                slot_state[slot, 0] = run_max[i]
                slot_state[slot, 1] = run_sum[i]
            T.tvm_storage_sync("shared")

        @T.macro
        def write(output, lse, merged, slot_out, slot_state, row, head, slot, tx):
            """The slots' states merged (share() first), normalised into output[row, head] and lse."""
            for rep in T.serial((d + threads - 1) // threads):
                dim: T.let[T.int32] = rep * threads + slot * lanes + tx
                if dim < d:
                    merge_states(merged, slot_state, slot_out, slots, dim)
                    output[row, head, dim] = T.Cast(dtype, merged[2] / merged[3])
                    if dim == 0:
                        lse[row, head] = merged[0] + T.log2(merged[3])
            T.tvm_storage_sync("shared")

        @T.macro
        def start(q, run_max, run_sum, acc, Q, row, head0, sm_scale, tx):
            """Query heads head0 .. head0 + group of row `row` scaled into q (log2 domain); the
            slot's online softmax empty."""
            for i in T.unroll(group):
                for j in T.unroll(vec):     # (no float32x8 in CUDA C)
                    q[i, j] = T.Cast("float32", Q[row, head0 + i, tx * vec + j]) * (sm_scale * T.float32(LOG2E))
                run_max[i] = T.float32(_EMPTY_MAX)
                run_sum[i] = T.float32(0)
                for j in T.unroll(vec):
                    acc[i, j] = T.float32(0)

        @T.macro
        def load_paged(k_rows, v_rows, pages, page_values, first, pos, page_size, u, by, tx):
            """Slot u of k_rows / v_rows: the lane's 16 bytes of the key and value at position `pos`
            of the sequence whose pages start at page_values[first]."""
            page: T.let[T.int32] = page_values[first + pos // page_size]
            for j in T.vectorized(vec):
                k_rows[u, j] = pages[page, 0, by, pos % page_size, tx * vec + j]
            for j in T.vectorized(vec):
                v_rows[u, j] = pages[page, 1, by, pos % page_size, tx * vec + j]

        @T.macro
        def blank(k_rows, v_rows, u):
            """Slot u of k_rows / v_rows past the keys: zeros (step() skips them)."""
            for j in T.unroll(vec):
                k_rows[u, j] = T.Cast(dtype, 0)
                v_rows[u, j] = T.Cast(dtype, 0)

        @T.macro
        def finish(output, lse, acc, run_max, run_sum, merged, slot_out, slot_state, row, head0, slot, tx):
            """The slots' states merged, one query head at a time, into output[row] and lse[row]."""
            for i in T.serial(group):
                share(acc, run_max, run_sum, slot_out, slot_state, i, slot, tx)
                write(output, lse, merged, slot_out, slot_state, row, head0 + i, slot, tx)

        self.step, self.share, self.write = step, share, write
        self.start, self.load_paged, self.blank, self.finish = start, load_paged, blank, finish
        self.dtype, self.unroll, self.d = dtype, unroll, d

    def buffers(self):
        """The walk's registers and shared memory, allocated in the enclosing sblock (call it inside
        one while a kernel is parsed): q, k_rows, v_rows, scores, part, summed, run_max, run_sum,
        acc, new_max, merged, slot_out, slot_state."""
        group, vec, unroll, dtype = self.group, self.vec, self.unroll, self.dtype
        local = [((group, vec), "float32"), ((unroll, vec), dtype), ((unroll, vec), dtype),
                 ((unroll, group), "float32"), ((1,), "float32"), ((1,), "float32"), ((group,), "float32"),
                 ((group,), "float32"), ((group, vec), "float32"), ((1,), "float32"), ((4,), "float32")]
        return (*[T.sblock_alloc_buffer(shape, dt, scope="local") for shape, dt in local],
                T.sblock_alloc_buffer((self.slots, self.d), "float32", scope="shared"),
                T.sblock_alloc_buffer((self.slots, 2), "float32", scope="shared"))


@parsed_once()
def decode_attention(h_kv: int, h_qo: int, d: int, dtype: str, page_size: int, sliding_window: bool = False,
                     warps: int = 8, unroll: int = 4, splits: int | None = None,
                     softcap: float | None = None) -> tirx.PrimFunc:
    """The decode kernel for `h_qo` query heads over `h_kv` KV heads of head dim `d` in `page_size`
    pages of `dtype`; `warps` per work-group, `unroll` tokens a slot loads at once. `splits`: how many
    work-groups share a sequence; None: chosen at each call from the batch and the pages it holds
    (split_count). `softcap`: scores soft-capped (Gemma 2; SlotWalk). ValueError when a token's row
    does not split into 16-byte lanes that tile a warp."""
    walk = SlotWalk(h_kv, h_qo, d, dtype, warps, unroll, softcap)
    group = walk.group
    lanes, per_warp, slots, threads = walk.lanes, walk.per_warp, walk.slots, walk.threads
    step = walk.step_tokens
    symbol = "batch_decode_paged_kv" + ("_sliding_window" if sliding_window else "")

    def chunk_len(begin, end, b, length_info):
        pages = end - begin - 1
        if sliding_window:                       # [last page length, window offset, sink size]
            return pages * page_size + length_info[0, b] - length_info[1, b] + length_info[2, b]
        return pages * page_size + length_info[b]

    def seq_offset(t, b, length_info):
        if sliding_window:                       # the sink, then the window
            return T.if_then_else(t < length_info[2, b], t, t - length_info[2, b] + length_info[1, b])
        return t

    def attend(split: bool):
        """One work-group's walk: sequence bx, KV head by, its tokens [lo, hi) (split: share bs of
        n_splits; else all of them); the slots' states merged, then written: normalised to output
        and lse, or (split) as they are to the workspace."""
        @T.macro
        def body(Q, pages, page_table_indptr, page_table_values, length_info, output, lse, ws_o, ws_md,
                 sm_scale, bx, by, bs, n_splits, tz, ty, tx):
            with T.sblock("attn"):
                (q, k_rows, v_rows, scores, part, summed, run_max, run_sum, acc, new_max, merged,
                 slot_out, slot_state) = walk.buffers()
                span = T.sblock_alloc_buffer((2,), "int32", scope="local")        # [lo, hi)

                slot: T.let[T.int32] = tz * per_warp + ty
                begin: T.let[T.int32] = page_table_indptr[bx]
                end: T.let[T.int32] = page_table_indptr[bx + 1]
                length: T.let[T.int32] = T.if_then_else(begin != end, chunk_len(begin, end, bx, length_info), 0)
                if split:
                    share: T.let[T.int32] = T.ceildiv(length, n_splits)
                    span[0] = T.min(bs * share, length)
                    span[1] = T.min(bs * share + share, length)
                else:
                    span[0] = 0
                    span[1] = length
                walk.start(q, run_max, run_sum, acc, Q, bx, by * group, sm_scale, tx)

                for it in T.serial(T.ceildiv(span[1] - span[0], step)):
                    # every load of the unrolled tokens first
                    for u in T.unroll(unroll):
                        t: T.let[T.int32] = span[0] + (it * unroll + u) * slots + slot
                        if t < span[1]:
                            pos: T.let[T.int32] = seq_offset(t, bx, length_info)
                            walk.load_paged(k_rows, v_rows, pages, page_table_values, begin, pos, page_size, u, by, tx)
                        else:
                            walk.blank(k_rows, v_rows, u)
                    walk.step(q, k_rows, v_rows, scores, part, summed, run_max, run_sum, acc, new_max,
                              span[0] + it * unroll * slots + slot, span[1], tx)

                # the slots' states merged, one query head at a time
                if split:                       # the share's state as it is, for the merge kernel
                    for i in T.serial(group):
                        walk.share(acc, run_max, run_sum, slot_out, slot_state, i, slot, tx)
                        for rep in T.serial((d + threads - 1) // threads):
                            dim: T.let[T.int32] = rep * threads + slot * lanes + tx
                            if dim < d:
                                merge_states(merged, slot_state, slot_out, slots, dim)
                                ws_o[bx, bs, by * group + i, dim] = merged[2]
                                if dim == 0:
                                    ws_md[bx, bs, by * group + i, 0] = merged[0]
                                    ws_md[bx, bs, by * group + i, 1] = merged[1]
                        T.tvm_storage_sync("shared")
                else:
                    walk.finish(output, lse, acc, run_max, run_sum, merged, slot_out, slot_state, bx, by * group,
                                slot, tx)
        return body

    whole, share = attend(False), attend(True)

    def n_split(batch, pages):
        return split_count(batch, pages, h_kv, page_size) if splits is None else splits

    @T.prim_func(s_tir=True)
    def kernel(Q_handle: T.handle, pages_handle: T.handle, page_table_indptr_handle: T.handle,
               page_table_values_handle: T.handle, var_length_info: T.handle, k_rope_pos_offset_handle: T.handle,
               q_rope_position_handle: T.handle, output_handle: T.handle, lse_handle: T.handle,
               rotary_mode: T.int32, rope_scale: T.float32, rope_theta: T.float32, sm_scale: T.float32):
        T.func_attr({"tirx.is_scheduled": True, "global_symbol": symbol, "tirx.noalias": True})
        B = T.int32()
        nnz_pages = T.int32()
        max_num_pages = T.int64()          # int64: a large cache's pages pass 2**31 elements
        page_indptr_elem_offset = T.int32()
        page_values_elem_offset = T.int32()
        k_rope_pos_offset_elem_offset = T.int32()
        q_rope_position_elem_offset = T.int32()
        length_info_elem_offset = T.int32()
        Q = T.match_buffer(Q_handle, (B, h_qo, d), dtype)
        # No elem_offset (TVM's kernel takes any): with one, the analyzer cannot prove a row's 16 bytes
        # aligned and the loads become 8 gathers of 2 bytes. The cache allocates each layer's pages
        # whole; a view into them is refused by the argument checks, not read wrongly.
        pages = T.match_buffer(pages_handle, (max_num_pages, 2, h_kv, page_size, d), dtype)
        page_table_indptr = T.match_buffer(page_table_indptr_handle, (B + 1,), "int32",
                                           elem_offset=page_indptr_elem_offset)
        page_table_values = T.match_buffer(page_table_values_handle, (nnz_pages,), "int32",
                                           elem_offset=page_values_elem_offset)
        k_rope_pos_offset = T.match_buffer(k_rope_pos_offset_handle, (B,), "int32",  # noqa: F841 (RoPE: applied before)
                                           elem_offset=k_rope_pos_offset_elem_offset)
        q_rope_position = T.match_buffer(q_rope_position_handle, (B,), "int32",  # noqa: F841
                                         elem_offset=q_rope_position_elem_offset)
        output = T.match_buffer(output_handle, (B, h_qo, d), dtype)
        lse = T.match_buffer(lse_handle, (B, h_qo), "float32")
        length_info = T.match_buffer(var_length_info, (3, B) if sliding_window else (B,), "int32",
                                     elem_offset=length_info_elem_offset)
        # the splits' states (allocated on every call: a few KB where nothing is split)
        ws_o = T.alloc_buffer((B, n_split(B, nnz_pages), h_qo, d), "float32")
        ws_md = T.alloc_buffer((B, n_split(B, nnz_pages), h_qo, 2), "float32")

        if n_split(B, nnz_pages) <= 1:
            for bx in T.thread_binding(B, thread="blockIdx.x"):
                for by in T.thread_binding(h_kv, thread="blockIdx.y"):
                    for tz in T.thread_binding(warps, thread="threadIdx.z"):
                        for ty in T.thread_binding(per_warp, thread="threadIdx.y"):
                            for tx in T.thread_binding(lanes, thread="threadIdx.x"):
                                whole(Q, pages, page_table_indptr, page_table_values, length_info, output, lse,
                                      ws_o, ws_md, sm_scale, bx, by, 0, 1, tz, ty, tx)
        else:
            for bx in T.thread_binding(B, thread="blockIdx.x"):
                for by in T.thread_binding(h_kv, thread="blockIdx.y"):
                    for bs in T.thread_binding(n_split(B, nnz_pages), thread="blockIdx.z"):
                        for tz in T.thread_binding(warps, thread="threadIdx.z"):
                            for ty in T.thread_binding(per_warp, thread="threadIdx.y"):
                                for tx in T.thread_binding(lanes, thread="threadIdx.x"):
                                    share(Q, pages, page_table_indptr, page_table_values, length_info, output,
                                          lse, ws_o, ws_md, sm_scale, bx, by, bs, n_split(B, nnz_pages), tz, ty, tx)
            for bx in T.thread_binding(B, thread="blockIdx.x"):
                for hq in T.thread_binding(h_qo, thread="blockIdx.y"):
                    for dim in T.thread_binding(d, thread="threadIdx.x"):
                        with T.sblock("merge"):
                            T.reads(ws_o[bx, 0:n_split(B, nnz_pages), hq, dim],
                                    ws_md[bx, 0:n_split(B, nnz_pages), hq, 0:2])
                            T.writes(output[bx, hq, dim], lse[bx, hq])
                            merged = T.sblock_alloc_buffer((4,), "float32", scope="local")
                            state = T.decl_buffer((n_split(B, nnz_pages), 2), "float32", data=ws_md.data,
                                                  elem_offset=(bx * n_split(B, nnz_pages) * h_qo + hq) * 2,
                                                  strides=(h_qo * 2, 1))
                            out = T.decl_buffer((n_split(B, nnz_pages), d), "float32", data=ws_o.data,
                                                elem_offset=(bx * n_split(B, nnz_pages) * h_qo + hq) * d,
                                                strides=(h_qo * d, 1))
                            merge_states(merged, state, out, n_split(B, nnz_pages), dim)
                            output[bx, hq, dim] = T.Cast(dtype, merged[2] / merged[3])
                            if dim == 0:
                                lse[bx, hq] = merged[0] + T.log2(merged[3])

    return kernel


def split_count(batch, pages, h_kv: int, page_size: int):
    """How many work-groups share each sequence, from what the host knows at the call: the batch and
    the pages it holds. 1 (no split) unless the sequences average MIN_SPLIT tokens and the batch
    makes fewer than TARGET_GROUPS work-groups."""
    tokens = pages * page_size // T.max(batch, 1)
    return T.max(1, T.min(T.min(tokens // MIN_SPLIT, TARGET_GROUPS // T.max(batch * h_kv, 1)), MAX_SPLITS))


# The KV cache's decode kernels kiln replaces (module names = TVM's global symbols).
_DECODE = {"batch_decode_paged_kv": False, "batch_decode_paged_kv_sliding_window": True}


def replacement(name: str, func: tirx.PrimFunc, softcap: float | None = None) -> tirx.PrimFunc | None:
    """kiln's kernel for TVM's decode kernel `name` (same shapes, read off its buffers; scores
    soft-capped at `softcap`), or None."""
    if name not in _DECODE:
        return None
    q, pages = func.params[0], func.params[1]          # TVM 0.27: buffer params carry shape and dtype
    _, h_qo, d = q.shape
    _, _, h_kv, page_size, _ = pages.shape
    try:
        return decode_attention(int(h_kv), int(h_qo), int(d), str(q.dtype), int(page_size),
                                sliding_window=_DECODE[name], softcap=softcap)
    except ValueError:
        return None


__all__ = ["SlotWalk", "decode_attention", "merge_states", "replacement", "split_count"]
