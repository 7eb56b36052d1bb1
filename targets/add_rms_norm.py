"""Recognising the fused add + RMSNorm kernel (compiler/passes/fuse_add_rms_norm.py) in a schedule.

Its blocks: ``T_add`` (spatial, writes the sum ``y``, an output), ``T_multiply_red`` (the sum of
squares of each row of ``y``), ``rsqrt`` and ``T_rms_norm`` (spatial), all over the same leading
row loops. Shared by the CPU rule (targets/cpu/fused_schedule.py) and the GPU rule (targets/gpu.py).
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.base import get_extent

REDUCE = tirx.IterVar.CommReduce


# The GPU rule's elements a thread reads and writes at once (at most 128 bits): 4 at most, the widest
# vector Metal and WGSL have (TVM's CUDA also printed a float32x8 broadcast nvcc refuses).
VECTOR_LANES = (4, 2)


def gpu_row_split(width: int | None, bits: int, max_threads: int) -> tuple[int, int]:
    """(threads, vector lanes) the GPU rule splits a row of `width` elements of `bits` between: what the
    MMA GEMV's norm prologue (targets/norm_prologue.py) copies to sum the squares in the same order."""
    vec = next((v for v in VECTOR_LANES if width and width % v == 0 and v * bits <= 128), 1)
    return min(256, max_threads, -(-width // vec) if width else 256), vec


def match_add_norm(sch: s_tir.Schedule, blocks: list, params) -> tuple | None:
    """(reduction block, row count) if ``blocks`` are a spatial block writing an output (a param),
    one S..S R row reduction over that output and spatial blocks, all over the same leading
    rows; else None."""
    stmts = [sch.get(b) for b in blocks]
    kinds = [[iv.iter_type for iv in s.iter_vars] for s in stmts]
    reductions = [i for i, k in enumerate(kinds) if REDUCE in k]
    if len(blocks) < 3 or len(reductions) != 1 or reductions[0] == 0 or REDUCE in kinds[0]:
        return None
    red = stmts[reductions[0]]
    if kinds[reductions[0]][-1] != REDUCE or kinds[reductions[0]].count(REDUCE) != 1:
        return None
    k = red.iter_vars[-1].var
    if len(red.reads) != 1 or not red.reads[0].region[-1].min.same_as(k):
        return None
    y = stmts[0].writes[0].source
    if not red.reads[0].source.same_as(y) or not any(y.same_as(p) for p in params):
        return None  # the reduction must read the first block's output, the sum (a param)
    rows = len(red.iter_vars) - 1
    if rows < 1:
        return None
    extents = [[get_extent(sch, loop) for loop in sch.get_loops(b)] for b in blocks]
    want = extents[reductions[0]][:rows]
    for ext in extents:
        if len(ext) < rows or any(not _same(a, b) for a, b in zip(ext[:rows], want)):
            return None
    return blocks[reductions[0]], rows


def _same(a, b) -> bool:
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int) and a == b
    return tvm_ffi.structural_equal(a, b)
