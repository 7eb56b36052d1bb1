"""Prefill attention for GPUs: a work-group per query token and KV head.

Why: on an H100 (2026-11-27, tools/gpu_checks.py measure8b) TVM's ragged prefill kernel
(relax/frontend/nn/llm/_prefill_kernels.py) took 22.7 of a 16 x 128-token prefill's 168 ms of
GPU time on the 8B model: 0.71 ms a layer for ~2.2 GFLOP, 3 TFLOP/s. It runs 16 work-groups per
KV head (128 on 132 SMs, 4 warps each), each walking tiles of 32 query rows one after another,
every tile over every key of its sequence (the causal mask applied, the masked tiles still
loaded and multiplied), a barrier around each 32-key step.

Here each query token is a decode step over its own causal prefix (targets/decode_attention.py's
walk): a work-group per (token, KV head) with all the group's query heads, its warps' slots each
walking a share of the keys with their own online softmax, 16-byte loads, `unroll` tokens' keys
and values in flight, one merge in shared memory at the end. The keys a token cannot see are
never read, and 2,048 tokens make 16,384 work-groups for the 8B's 8 KV heads. The keys and values
of a 128-token sequence (64 KB a head) stay in L2 for the work-groups that share them.

The same walk reads the cache's pages for `batch_prefill_paged_kv` (new tokens over a sequence's
cached ones: chunked prefill of long prompts, prefix-cache hits), where TVM's kernel has the same
16 work-groups a KV head.

The functions are drop-ins for TVM's `batch_prefill_ragged_kv` and `batch_prefill_paged_kv`: the
same names, parameters and results (output [tokens, H_qo, D], lse [tokens, H_qo] in base 2),
rotary_mode ignored (kiln swaps them in only where the cache applies RoPE before attention:
targets/kiln_attention.py); causal masks as TVM does, key < kv_len - q_len + row + 1.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .kernel_memo import parsed_once
from .decode_attention import SlotWalk

SEARCH_STEPS = 31              # binary search for a token's sequence: any int32 batch


@parsed_once()
def prefill_attention(h_kv: int, h_qo: int, d: int, dtype: str, warps: int = 4, unroll: int = 2,
                      page_size: int | None = None, softcap: float | None = None) -> tirx.PrimFunc:
    """The ragged prefill kernel for `h_qo` query heads over `h_kv` KV heads of head dim `d` (with
    `page_size`: the paged one); `warps` per work-group, `unroll` keys a slot loads at once;
    `softcap`: scores soft-capped (Gemma 2; decode_attention.SlotWalk). ValueError when a row does
    not split into 16-byte lanes that tile a warp."""
    walk = SlotWalk(h_kv, h_qo, d, dtype, warps, unroll, softcap)
    group = walk.group
    vec, lanes, per_warp, slots = walk.vec, walk.lanes, walk.per_warp, walk.slots

    paged = page_size is not None

    def kv_length(indptr, length_info, b):
        if paged:                               # full pages, then the last page's tokens
            pages = indptr[b + 1] - indptr[b]
            return T.if_then_else(pages > 0, (pages - 1) * page_size + length_info[b], 0)
        return indptr[b + 1] - indptr[b]

    # keys: k [tokens, h_kv, d] (ragged) or the pages [n, 2, h_kv, page_size, d]; values: v or the
    # page table's values; indptr: kv_indptr or the page table's indptr; length_info: paged only.
    @T.macro
    def attend(q_in, q_indptr, keys, values, indptr, length_info, output, lse, causal, sm_scale, batch, token,
               by, tz, ty, tx):
        with T.sblock("attn"):
            T.reads()                   # (what it reads depends on the token's sequence, found inside)
            T.writes()
            (q, k_rows, v_rows, scores, part, summed, run_max, run_sum, acc, new_max, merged,
             slot_out, slot_state) = walk.buffers()
            seq = T.sblock_alloc_buffer((2,), "int32", scope="local")          # search bounds [lo, hi)

            # the token's sequence: the last b with q_indptr[b] <= token
            seq[0] = 0
            seq[1] = batch
            for _ in T.serial(SEARCH_STEPS):
                if seq[1] - seq[0] > 1:
                    mid: T.let[T.int32] = (seq[0] + seq[1]) // 2
                    if q_indptr[mid] <= token:
                        seq[0] = mid
                    else:
                        seq[1] = mid
            b: T.let[T.int32] = seq[0]
            q_len: T.let[T.int32] = q_indptr[b + 1] - q_indptr[b]
            kv_len: T.let[T.int32] = kv_length(indptr, length_info, b)
            base: T.let[T.int32] = indptr[b]
            # causal: the keys up to the token's own position (the last q_len keys are the queries')
            end: T.let[T.int32] = T.if_then_else(
                causal > 0, T.max(T.min(kv_len - q_len + (token - q_indptr[b]) + 1, kv_len), 0), kv_len)
            slot: T.let[T.int32] = tz * per_warp + ty

            walk.start(q, run_max, run_sum, acc, q_in, token, by * group, sm_scale, tx)

            for it in T.serial(T.ceildiv(end, walk.step_tokens)):
                for u in T.unroll(unroll):
                    t: T.let[T.int32] = (it * unroll + u) * slots + slot
                    if t < end:
                        if paged:
                            walk.load_paged(k_rows, v_rows, keys, values, base, t, page_size, u, by, tx)
                        else:
                            for j in T.vectorized(vec):
                                k_rows[u, j] = keys[base + t, by, tx * vec + j]
                            for j in T.vectorized(vec):
                                v_rows[u, j] = values[base + t, by, tx * vec + j]
                    else:
                        walk.blank(k_rows, v_rows, u)
                walk.step(q, k_rows, v_rows, scores, part, summed, run_max, run_sum, acc, new_max,
                          it * unroll * slots + slot, end, tx)

            walk.finish(output, lse, acc, run_max, run_sum, merged, slot_out, slot_state, token, by * group, slot, tx)

    @T.macro
    def grid(q, q_indptr, keys, values, indptr, length_info, output, lse, causal, sm_scale, batch, tokens):
        """A work-group per (token, KV head)."""
        for token in T.thread_binding(tokens, thread="blockIdx.x"):
            for by in T.thread_binding(h_kv, thread="blockIdx.y"):
                for tz in T.thread_binding(warps, thread="threadIdx.z"):
                    for ty in T.thread_binding(per_warp, thread="threadIdx.y"):
                        for tx in T.thread_binding(lanes, thread="threadIdx.x"):
                            attend(q, q_indptr, keys, values, indptr, length_info, output, lse, causal, sm_scale,
                                   batch, token, by, tz, ty, tx)

    if paged:
        @T.prim_func(s_tir=True)
        def kernel(var_q: T.handle, var_q_indptr: T.handle, var_pages: T.handle, var_page_indptr: T.handle,
                   var_page_values: T.handle, var_length_info: T.handle, var_k_rope_pos_offset: T.handle,
                   var_q_rope_position: T.handle, var_output: T.handle, var_lse: T.handle, causal: T.int32,
                   rotary_mode: T.int32, rope_scale: T.float32, rope_theta: T.float32, sm_scale: T.float32):
            T.func_attr({"tirx.is_scheduled": True, "global_symbol": "batch_prefill_paged_kv", "tirx.noalias": True})
            batch_size = T.int32()
            total_len = T.int32()
            nnz_pages = T.int32()
            max_num_pages = T.int64()          # int64: a large cache's pages pass 2**31 elements
            q_indptr_elem_offset = T.int32()
            page_indptr_elem_offset = T.int32()
            page_values_elem_offset = T.int32()
            length_info_elem_offset = T.int32()
            k_rope_pos_offset_elem_offset = T.int32()
            q_rope_position_elem_offset = T.int32()
            q = T.match_buffer(var_q, (total_len, h_qo, d), dtype)
            q_indptr = T.match_buffer(var_q_indptr, (batch_size + 1,), "int32", elem_offset=q_indptr_elem_offset)
            # No elem_offset, as the decode kernel's (targets/decode_attention.py): 16-byte loads.
            pages = T.match_buffer(var_pages, (max_num_pages, 2, h_kv, page_size, d), dtype)
            page_indptr = T.match_buffer(var_page_indptr, (batch_size + 1,), "int32", elem_offset=page_indptr_elem_offset)
            page_values = T.match_buffer(var_page_values, (nnz_pages,), "int32", elem_offset=page_values_elem_offset)
            length_info = T.match_buffer(var_length_info, (batch_size,), "int32", elem_offset=length_info_elem_offset)
            k_rope_pos_offset = T.match_buffer(var_k_rope_pos_offset, (batch_size,), "int32",  # noqa: F841
                                               elem_offset=k_rope_pos_offset_elem_offset)
            q_rope_position = T.match_buffer(var_q_rope_position, (total_len,), "int32",  # noqa: F841
                                             elem_offset=q_rope_position_elem_offset)
            output = T.match_buffer(var_output, (total_len, h_qo, d), dtype)
            lse = T.match_buffer(var_lse, (total_len, h_qo), "float32")
            grid(q, q_indptr, pages, page_values, page_indptr, length_info, output, lse, causal, sm_scale,
                 batch_size, total_len)
    else:
        @T.prim_func(s_tir=True)
        def kernel(var_q: T.handle, var_q_indptr: T.handle, var_k: T.handle, var_v: T.handle, var_kv_indptr: T.handle,
                   var_q_rope_position: T.handle, var_k_rope_pos_offset: T.handle, var_output: T.handle,
                   var_lse: T.handle, causal: T.int32, rotary_mode: T.int32, rope_scale: T.float32,
                   rope_theta: T.float32, sm_scale: T.float32):
            T.func_attr({"tirx.is_scheduled": True, "global_symbol": "batch_prefill_ragged_kv", "tirx.noalias": True})
            batch_size = T.int32()
            qo_len = T.int32()
            kv_len = T.int32()
            q_indptr_elem_offset = T.int32()
            kv_indptr_elem_offset = T.int32()
            q_rope_position_elem_offset = T.int32()
            k_rope_pos_offset_elem_offset = T.int32()
            q = T.match_buffer(var_q, (qo_len, h_qo, d), dtype)
            q_indptr = T.match_buffer(var_q_indptr, (batch_size + 1,), "int32", elem_offset=q_indptr_elem_offset)
            k = T.match_buffer(var_k, (kv_len, h_kv, d), dtype)
            v = T.match_buffer(var_v, (kv_len, h_kv, d), dtype)
            kv_indptr = T.match_buffer(var_kv_indptr, (batch_size + 1,), "int32", elem_offset=kv_indptr_elem_offset)
            q_rope_position = T.match_buffer(var_q_rope_position, (qo_len,), "int32",  # noqa: F841 (RoPE: applied before)
                                             elem_offset=q_rope_position_elem_offset)
            k_rope_pos_offset = T.match_buffer(var_k_rope_pos_offset, (batch_size,), "int32",  # noqa: F841
                                               elem_offset=k_rope_pos_offset_elem_offset)
            output = T.match_buffer(var_output, (qo_len, h_qo, d), dtype)
            lse = T.match_buffer(var_lse, (qo_len, h_qo), "float32")
            grid(q, q_indptr, k, v, kv_indptr, kv_indptr, output, lse, causal, sm_scale, batch_size, qo_len)

    return kernel


def prefill_replacement(name: str, func: tirx.PrimFunc, softcap: float | None = None) -> tirx.PrimFunc | None:
    """kiln's kernel for TVM's `batch_prefill_ragged_kv` or `batch_prefill_paged_kv` (shapes read
    off its buffers; scores soft-capped at `softcap`), or None."""
    if name not in ("batch_prefill_ragged_kv", "batch_prefill_paged_kv"):
        return None
    q = func.params[0]
    _, h_qo, d = q.shape
    page_size = None
    if name == "batch_prefill_ragged_kv":
        k, v = func.params[2], func.params[3]
        _, h_kv, d_v = v.shape
        if int(d) != int(d_v) or int(k.shape[2]) != int(d):
            return None                                 # MLA-like head dims: TVM's kernel
    elif name == "batch_prefill_paged_kv":
        _, _, h_kv, page_size, d_kv = func.params[2].shape
        if int(d_kv) != int(d) or len(func.params[5].shape) != 1:
            return None
        page_size = int(page_size)
    try:
        return prefill_attention(int(h_kv), int(h_qo), int(d), str(q.dtype), page_size=page_size, softcap=softcap)
    except ValueError:
        return None
