"""A 4-bit GEMV whose lanes each load a whole group of packed weights in one 128-bit load.

kiln's 4-bit layout (compiler/quant_modules.py) packs a weight row [K] into K / 8 uint32 words,
8 values a word, with one scale per group of 32 values. dlight's GEMV rule splits the reduction
so that each lane of a warp takes 4 consecutive values: two lanes share every packed word, each
load is 32 bits, and a warp's load instruction brings 64 new bytes (read in the CUDA it generates
for the 8B-architecture model, whose batch-1 step it took to 3.87 ms against a 1.88 ms floor on
an H100; issue 10).

Here a lane takes a whole group: 4 words (one 128-bit load, 32 values) and its scale, and the
matching 32 activations (four 128-bit loads of float16); a warp's weight load is 512 contiguous
bytes. Each warp computes `rows_per_warp` output rows (the same activations), warps per block
`warps`, and the lanes' partial sums meet in a cross-lane reduction (warp shuffles).

    [N, K/8] uint32 words + [N, K/32] scales, x [1, 1, K] -> out [1, 1, N]

Matched: a static single-row dequantize-matmul of the q4 layout (dequantize block, matmul block,
elementwise epilogues), K a multiple of 32 x lanes. Anything else: None (the next rule decides).
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

GROUP = 32            # values per scale, per lane per step (4 packed words)
WORDS = GROUP // 8


class WideGEMV:
    """The schedule above, for a function of one row (static, or bound by row_dispatch.one_row)."""

    def __init__(self, lanes: int = 32, warps: int = 4, rows_per_warp: int = 1, unroll: int = 16) -> None:
        self.lanes, self.warps, self.rows_per_warp, self.unroll = lanes, warps, rows_per_warp, unroll

    def apply(self, func, target, _tunable=False):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name == "llvm":
            return None
        try:
            return self._schedule(func)
        except (s_tir.ScheduleError, RuntimeError, ValueError):
            return None

    def _schedule(self, func: tirx.PrimFunc):
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        if len(blocks) < 2:
            return None
        dequant, matmul, *epilogues = blocks
        layout = _q4_layout(sch, dequant, matmul)
        if layout is None:
            return None
        words, n, k = layout
        if k % (GROUP * self.lanes) or n % (self.warps * self.rows_per_warp) or self.rows_per_warp == self.lanes:
            return None
        sch.compute_inline(dequant)
        *unit, rows, red = sch.get_loops(matmul)
        if any(_extent(sch, loop) != 1 for loop in unit):
            return None
        steps, lane, value = sch.split(red, [None, self.lanes, GROUP])
        partial = sch.rfactor(lane, 0)                          # [lanes, 1, 1, N]: each lane's sum
        *unit, rows, steps, lane, value = sch.get_loops(partial)
        block_rows, warp, row = sch.split(rows, [None, self.warps, self.rows_per_warp])
        sch.reorder(block_rows, warp, lane, steps, row, value)
        sch.bind(block_rows, "blockIdx.x")
        sch.bind(warp, "threadIdx.y")
        sch.bind(lane, "threadIdx.x")
        # One group of packed words per lane and step, in one vector load; its activations alike.
        scales = _scales(sch, partial, words)
        x = _activation(sch, partial, words, scales)
        weight_index = _read_index(sch, partial, words)
        packed = sch.cache_read(partial, weight_index, "local")
        sch.compute_at(packed, row)
        sch.vectorize(sch.get_loops(packed)[-1])
        scale = sch.cache_read(partial, _read_index(sch, partial, scales), "local")     # the group's one scale
        sch.compute_at(scale, row)
        acts = sch.cache_read(partial, _read_index(sch, partial, x), "local")
        sch.compute_at(acts, steps)
        _, vec = sch.split(sch.get_loops(acts)[-1], [None, 128 // tvm.DataType(x.dtype).bits])     # 128 bits
        sch.vectorize(vec)
        sch.unroll(value)
        sch.unroll(row)
        # `unroll` steps' loads in flight (a step's body is ~40 statements a row).
        sch.annotate(steps, "pragma_auto_unroll_max_step", self.unroll * 48 * self.rows_per_warp)
        sch.annotate(steps, "pragma_unroll_explicit", 1)
        sch.decompose_reduction(partial, steps)
        sch.set_scope(partial, 0, "local")
        # The lanes' sums: one cross-lane reduction per row, then the epilogues, in the same threads.
        sch.reverse_compute_at(matmul, warp)
        loops = sch.get_loops(matmul)
        inner = loops[[sch.get(l).same_as(sch.get(warp)) for l in loops].index(True) + 1:]   # lanes [and rows]
        lane = next(l for l in inner if _extent(sch, l) == self.lanes)
        if len(inner) == 2:
            sch.reorder(*[l for l in inner if l is not lane], lane)
        sch.bind(lane, "threadIdx.x")
        sch.set_scope(matmul, 0, "local")
        for epilogue in epilogues:
            sch.reverse_compute_at(epilogue, warp)
        return sch


def is_packed_words(buffer) -> bool:
    """Whether `buffer` is kiln's 4-bit packed words (uint32 [N, K / 8])."""
    return buffer.dtype == "uint32" and len(buffer.shape) == 2


def _extent(sch, loop) -> int | None:
    extent = sch.get(loop).extent
    return int(extent) if isinstance(extent, tirx.IntImm) else None


def _q4_layout(sch, dequant, matmul):
    """(the packed-words buffer, N, K) when `dequant` unpacks kiln's q4 words [N, K/8] into [N, K]
    and `matmul` reduces them against one row; else None."""
    deq = sch.get(dequant)
    if len(deq.writes) != 1 or any(iv.iter_type != tirx.IterVar.DataPar for iv in deq.iter_vars):
        return None
    words = next((r.source for r in deq.reads if is_packed_words(r.source)), None)
    out = deq.writes[0].source
    if words is None or len(out.shape) != 2 or not all(isinstance(d, tirx.IntImm) for d in out.shape):
        return None
    n, k = (int(d) for d in out.shape)
    if [int(d) for d in words.shape] != [n, k // 8]:
        return None
    mm = sch.get(matmul)
    if not any(r.source.same_as(out) for r in mm.reads) or sum(iv.iter_type == tirx.IterVar.CommReduce
                                                               for iv in mm.iter_vars) != 1:
        return None
    return words, n, k


def _scales(sch, block, words):
    """The [N, K/32] scales `block` reads beside the packed words."""
    n, k = int(words.shape[0]), int(words.shape[1]) * 8
    found = [r.source for r in sch.get(block).reads if not r.source.same_as(words) and len(r.source.shape) == 2
             and [int(d) for d in r.source.shape] == [n, k // GROUP]]
    if len(found) != 1:
        raise ValueError("not one scale buffer")
    return found[0]


def _activation(sch, block, words, scales):
    """The buffer `block` reads besides the packed words and their scales: the row of activations."""
    rest = [r.source for r in sch.get(block).reads if not r.source.same_as(words) and not r.source.same_as(scales)]
    if len(rest) != 1:
        raise ValueError("not one activation buffer")
    return rest[0]


def _read_index(sch, block, buffer) -> int:
    for i, region in enumerate(sch.get(block).reads):
        if region.source.same_as(buffer):
            return i
    raise ValueError(f"{buffer.name} is not read")
