"""A tensor-core matmul for a few dozen rows: small tiles, so that every SM gets thread blocks.

dlight's tensor-core matmul (MatmulTensorization) gives each thread block a 128-row x 128-column
tile of C. A decode step of 16-64 sequences has one such row of tiles, N / 128 thread blocks: 32
for a 4096-column projection on an H100's 132 SMs. Measured (H100, 8B-architecture q4f16): a decode
step took 22 ms at 16 sequences and 24 ms at 64, the weights streamed at ~250 GB/s of 3,000.

NarrowTensorCoreMatmul tiles `16 * warp_rows * frag_rows` rows x `16 * warp_cols * frag_cols`
columns (default 16 x 32: a 4096-column projection gets 128 blocks per 16 rows), one warp per
(warp_row, warp_col), each warp `frag_rows x frag_cols` 16x16x16 wmma fragments (float16 in,
float32 sums), K in steps of `16 * k_frags` staged through shared memory, double-buffered, with
the weights' dequantize computed as they are staged. It is LowBatchGEMV's branch for 5-64 rows
(targets/gpu.py) with 32 x 32 tiles (warp_rows=2, warp_cols=2): on an H100 (tools/gpu_checks.py
`variants`, 2 layers of the 8B model) the matmuls of a decode step took 0.71 ms at 16 rows and
1.03 at 64 against 1.43 and 1.44 on dlight's tiles, logits identical. Rows past the last tile are
padded (pad_einsum: their loads read 0, their stores are skipped). It builds only for CUDA
(sm_70+) with working Tensorize, and refuses (None) elsewhere.

Split K (`target_blocks`): those tiles still stream the weights at a tenth of the bandwidth (H100,
2026-11-27: 134 us a call for the 8B's down projection at 16 rows, 11 us of bytes). A 4096-column
projection has 128 column tiles, one thread block per SM, and each block waits on one K step's
loads (~1 KB of weights) at a time: latency. With `target_blocks`, K is cut into `split_count`
slices (rfactor), so that about that many blocks run: each writes its slice's float32 sums to a
workspace [slices, 1, rows, N] and a second kernel adds the slices in order (deterministic) and
applies the epilogue. The workspace is a parameter of the kernel, not an allocation inside it
(targets/workspace_outputs.py: Relax plans it like any tensor, so CUDA graphs replay over it).
"""

from __future__ import annotations

import copy

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.s_tir.dlight.gpu.matmul import (auto_inline_consumer_chain, auto_inline_producers, check_sm_version,
                                        get_in_out_dtypes, get_index_map, get_reduction_blocks)

from .workspace_outputs import lift_workspace

GROUP = 32         # 4-bit values per scale: 4 packed words (compiler/quant_modules.py)
WARP = 32          # threads per warp
VECTOR = 4         # elements per thread per staged copy (float16: 8 bytes)
FRAG = 16          # the wmma fragment's side
MIN_SLICE_STEPS = 4   # split K: each slice at least this many K steps (the pipeline's prologue pays)
SUM_THREADS = 256     # split K: threads per block of the kernel adding the slices


def is_packed_words(buffer) -> bool:
    """Whether `buffer` is kiln's 4-bit packed words (uint32 [N, K / 8])."""
    return buffer.dtype == "uint32" and len(buffer.shape) == 2


class NarrowTensorCoreMatmul(GPUScheduleRule):
    """`group_loads`: the 4-bit weights are staged a group of 32 values per thread, its 4 packed words
    in one 128-bit load (otherwise a thread stages VECTOR values, a 16-bit slice of a word); needs
    the B tile (columns x K step) to hold 32 values for each thread of the block."""

    def __init__(self, warp_rows: int = 1, warp_cols: int = 2, frag_rows: int = 1, frag_cols: int = 1,
                 k_frags: int = 4, group_loads: bool = False, target_blocks: int = 0) -> None:
        self.warp_rows, self.warp_cols = warp_rows, warp_cols
        self.frag_rows, self.frag_cols, self.k_frags = frag_rows, frag_cols, k_frags
        self.group_loads = group_loads
        self.target_blocks = target_blocks          # 0: K is not split

    def without_workspace(self) -> "NarrowTensorCoreMatmul":
        """The same tiles, K not split (LowBatchGEMV: where a workspace would be planned too large)."""
        unsplit = copy.copy(self)
        unsplit.target_blocks = 0
        return unsplit

    def split_count(self, n: int, k: int) -> int:
        """K slices for an N x K weight: the most (a power of 2) with at most target_blocks blocks
        over one row of tiles, each slice at least MIN_SLICE_STEPS K steps."""
        step, tiles, count = FRAG * self.k_frags, -(-n // self.cols), 1
        while (tiles * count * 2 <= self.target_blocks and k % (step * count * 2) == 0
               and k // (count * 2) >= MIN_SLICE_STEPS * step):
            count *= 2
        return count

    @property
    def rows(self) -> int:
        """Rows of C per thread block."""
        return FRAG * self.warp_rows * self.frag_rows

    @property
    def cols(self) -> int:
        """Columns of C per thread block."""
        return FRAG * self.warp_cols * self.frag_cols

    def apply(self, func, target, _tunable):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        if target.kind.name != "cuda" or check_sm_version(str(target.attrs.get("arch", ""))) < 70:
            return None
        if func.attrs is not None and "dlight.do_not_tensorize" in func.attrs:
            return None
        from .gpu import tensorize_works
        if not tensorize_works():
            return None
        try:
            sch = self._schedule(func)
        except (RuntimeError, AssertionError):   # not a matmul, or one this tiling does not fit
            return None
        if sch is None or not self.target_blocks:
            return sch
        return lift_workspace(sch.mod["main"])            # the slices' sums become a parameter

    def _schedule(self, func) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        packed = _reads_packed_words(sch)
        found = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
        if found is None:
            return None
        main = found[0]

        # C[S, I, J] += A[S, I, K] * B[S, J, K], the layout the fragments take.
        staged_a, staged_b = sch.reindex(main, ("read", 0)), sch.reindex(main, ("read", 1))
        staged_c = sch.reindex(main, ("write", 0))
        maps = get_index_map(sch.get(main))
        if maps is None:
            return None
        whole, a_map, b_map, c_map = maps
        sch.transform_layout(staged_a, ("write", 0), a_map)
        sch.transform_layout(staged_b, ("write", 0), b_map)
        sch.transform_layout(staged_c, ("read", 0), c_map)
        sch.transform_block_layout(main, whole)
        in_dtype, out_dtype = get_in_out_dtypes(sch.get(main))
        if in_dtype != "float16" or out_dtype not in ("float16", "float32"):
            return None
        k_step = FRAG * self.k_frags
        sch.pad_einsum(main, [1, self.rows, self.cols, k_step])
        batch, i, j, k = sch.get_loops(main)
        slices, sums = 1, None
        if self.target_blocks:
            slices = self.split_count(int(sch.get(j).extent), int(sch.get(k).extent))
        if slices > 1:
            sums, (k_slice, k) = main, sch.split(k, [slices, None])
            main = sch.rfactor(k_slice, 0)      # [slices, 1, rows, N] float32, summed by `sums`
            batch, i, j, k_slice, k = sch.get_loops(main)
            sch.reorder(k_slice, batch, i, j, k)

        # Fragment loops innermost; the rest: blocks over (row tile, column tile), warps, fragments.
        i, i_frag = sch.split(i, [None, FRAG])
        j, j_frag = sch.split(j, [None, FRAG])
        k, k_frag = sch.split(k, [None, FRAG])
        sch.reorder(i, j, k, i_frag, j_frag, k_frag)
        tile = sch.blockize(i_frag)
        i_block, i_warp, i_rep = sch.split(i, [None, self.warp_rows, self.frag_rows])
        j_block, j_warp, j_rep = sch.split(j, [None, self.warp_cols, self.frag_cols])
        k_outer, k_inner = sch.split(k, [None, self.k_frags])
        sch.reorder(i_block, j_block, i_warp, j_warp, k_outer, k_inner, i_rep, j_rep)
        sch.bind(batch, "blockIdx.z")
        if sums is not None:
            sch.bind(k_slice, "blockIdx.y")
        sch.bind(sch.fuse(i_block, j_block), "blockIdx.x")
        warp = sch.fuse(i_warp, j_warp)
        sch.bind(warp, "threadIdx.y")
        warps = self.warp_rows * self.warp_cols
        # Stage k_outer's slice of A and B in shared memory, loads and the stage after them pipelined.
        group = (self.group_loads and packed and self.cols % warps == 0 and k_step % GROUP == 0
                 and self.cols // warps * (k_step // GROUP) == WARP)
        # (group_loads: B's register stage is its packed words' 128-bit load, the same place in the order.)
        sch.annotate(k_outer, "software_pipeline_order", [0, 3, 1, 4, 5, 2, 6])
        sch.annotate(k_outer, "software_pipeline_stage", [0, 0, 0, 0, 0, 1, 1])
        sch.annotate(k_inner, "software_pipeline_order", [0, 1, 2])
        sch.annotate(k_inner, "software_pipeline_stage", [0, 0, 1])

        def stage(operand: int, group: bool = False):
            copy = sch.cache_read(tile, operand, "shared.dyn")
            sch.compute_at(copy, k_outer)
            if group:        # a warp per cols / warps columns; a lane per group of 32 values of one
                col, kk = sch.get_loops(copy)[-2:]
                ty, col = sch.split(col, [warps, None])
                kg, vec = sch.split(kk, [None, GROUP])
                tx = sch.fuse(col, kg)
                _, vec = sch.split(vec, [None, 4])     # 8 stores of 4 (64 bits): nvcc refuses TVM's uint32x8
            else:
                flat = sch.fuse(*sch.get_loops(copy)[-2:])
                _, ty, tx, vec = sch.split(flat, [None, warps, WARP, VECTOR])
            sch.bind(ty, "threadIdx.y")
            sch.bind(tx, "threadIdx.x")
            sch.vectorize(vec)
            sch.storage_align(copy, 0, axis=-2, factor=16, offset=8)      # no bank conflicts
            if not group:
                sch.annotate(copy, "tirx.manifest_shared_memory_local_stage", 1)
            sch.annotate(copy, "double_buffer_scope", 0)
            auto_inline_producers(sch, copy)                               # dequantize as it stages
            if group:
                words = next(i for i, r in enumerate(sch.get(copy).reads) if is_packed_words(r.source))
                words_local = sch.cache_read(copy, words, "local")        # the group's 4 words
                sch.compute_at(words_local, tx)
                sch.vectorize(sch.get_loops(words_local)[-1])
            return copy

        stage(0)
        stage(1, group)
        frag_a = sch.cache_read(tile, 0, "wmma.matrix_a")
        frag_b = sch.cache_read(tile, 1, "wmma.matrix_b")
        sch.compute_at(frag_a, k_inner)
        sch.compute_at(frag_b, k_inner)
        # C's tile in static shared memory: in the dynamic pool beside the float16 stages, TVM's
        # merged allocation aliased it at small tiles and lowering failed ("tvm_access_ptr element
        # type must match the source buffer", float16 vs float32).
        out_shared = sch.cache_write(tile, 0, "shared")
        sch.storage_align(out_shared, 0, -2, 16, 4)
        acc = sch.cache_write(tile, 0, "wmma.accumulator")
        sch.reverse_compute_at(acc, warp)
        sch.reverse_compute_at(out_shared, warp)
        r, c = sch.get_loops(acc)[-2:]
        r_outer, r_frag = sch.split(r, [None, FRAG])
        c_outer, c_frag = sch.split(c, [None, FRAG])
        sch.reorder(r_outer, c_outer, r_frag, c_frag)
        init = sch.decompose_reduction(tile, k_outer)
        init_inner = sch.get_child_blocks(init)[0]

        intrins = _intrinsics(out_dtype)
        for frag, intrin in ((frag_a, "load_a"), (frag_b, "load_b")):
            r, c = sch.get_loops(frag)[-2:]
            r_outer, r_frag = sch.split(r, [None, FRAG])
            c_outer, c_frag = sch.split(c, [None, FRAG])
            sch.reorder(r_outer, c_outer, r_frag, c_frag)
            sch.unroll(r_outer)
            sch.unroll(c_outer)
            sch.tensorize(r_frag, intrins[intrin])
        sch.tensorize(sch.get_loops(init_inner)[-2], intrins["init"])
        sch.tensorize(sch.get_loops(acc)[-2], intrins["store"])
        sch.tensorize(sch.get_loops(main)[-3], intrins["compute"])

        if sums is None:
            auto_inline_consumer_chain(sch, out_shared)                    # the epilogue, then C
        flat = sch.fuse(*sch.get_loops(out_shared)[-2:])
        _, tx, vec = sch.split(flat, [None, WARP, VECTOR])
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vec)
        if sums is not None:            # a thread per output: the slices added in order, the epilogue
            total = sch.cache_write(sums, 0, "local")
            auto_inline_consumer_chain(sch, total)
            bx, tx = sch.split(sch.fuse(*sch.get_loops(total)), [None, SUM_THREADS])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            sch.compute_at(sums, tx)
        return sch


def _reads_packed_words(sch) -> bool:
    """Whether some block of the function reads kiln's 4-bit packed words (uint32 [N, K / 8])."""
    blocks = sch.get_child_blocks(get_root_block(sch))
    return any(is_packed_words(r.source) for b in blocks for r in sch.get(b).reads)


def _intrinsics(out_dtype: str) -> dict[str, str]:
    from .gpu import load_tensor_core_intrinsics
    load_tensor_core_intrinsics()                     # quickly, before the import below
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group
    return get_wmma_intrin_group(load_scope="shared.dyn", store_scope="shared", in_dtype="float16",
                                 out_dtype=out_dtype, trans_b=True)
