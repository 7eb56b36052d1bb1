"""CPU schedule rules for the kernels kiln's own passes emit; tried before schedule.py's rules.

* ``AddRMSNorm``: the two-output ``y = x + r; n = rms_norm(y, w)`` kernel from
  compiler/passes/fuse_add_rms_norm.py.  rowwise.py's RowReduction cannot take it: its first
  block writes an output (y), and ``compute_at`` refuses to move output blocks.  Here every block
  is instead moved *under* the first block's row loop (``reverse_compute_at``): one parallel loop
  over the rows; inside it the vectorised add, the sum of squares as 16 vector partial sums
  (rfactor), rsqrt once per row and the vectorised scale, the row staying in L1 throughout.
* ``LowBatchGEMV``: the matmul copies low_batch_gemv.py tagged
  ``"kiln.gemv": R``, run only when the rows are <= R: schedule.py's Matmul with a one-row
  register tile over 6 weight rows (1 on znver4; ``gemv_knobs``; no row padding, no ``A[i] if i < m`` select in
  the inner loop), rows and column tiles one parallel loop, k vectorised.  Padding the rows to R
  and unrolling them (a 4x3 tile) measured slower than this at 1 and 4 rows.
"""

from __future__ import annotations

import logging

from tvm import s_tir, tirx
from tvm.s_tir.dlight.base import ScheduleRule, get_extent
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.target import Target

from ..add_rms_norm import REDUCE, match_add_norm
from .low_batch_gemv import GEMV_ATTR
from .schedule import CPUKnobs, KilnCPURule, Matmul

logger = logging.getLogger(__name__)


def cpu_fused_schedule_rules(vector_lanes: int = 16, mcpu: str = "") -> list[ScheduleRule]:
    """The rules for kiln-emitted kernels, to list ahead of ``cpu_schedule_rules`` (``mcpu``: the
    target's LLVM CPU name, which picks the GEMV's tile)."""
    return [LowBatchGEMV(gemv_knobs(vector_lanes, mcpu)), AddRMSNorm(CPUKnobs(vector_lanes=vector_lanes))]


# The float GEMV's weight rows per tile where it is not 6, by LLVM CPU name. 6 is the best of
# 1x4/1x6/1x8/1x12 and a padded 4x3 at 1-4 rows on SmolLM2's projection shapes (znver5, cold
# weights). znver4 (2 cores of an AMD EPYC VM, SmolLM2 q0f32 batch-1 decode, alternating runs):
# 1 row 54.0 / 54.3 tok/s, 2: 41.5 / 42.7, 4: 45.5 / 45.0, 6: 45.1 / 45.8; at 4 sequences
# 172.1 / 175.8 against 6's 134.5 / 135.2. `kiln tune` searches tile_n per GEMV copy on any CPU.
FLOAT_GEMV_TILE_N = {"znver4": 1}


def gemv_knobs(vector_lanes: int = 16, mcpu: str = "") -> CPUKnobs:
    """A one-row tile over FLOAT_GEMV_TILE_N's weight rows for ``mcpu`` (6 where it has none)."""
    return CPUKnobs(vector_lanes=vector_lanes, tile_m=1, tile_n=FLOAT_GEMV_TILE_N.get(mcpu, 6))


class AddRMSNorm(KilnCPURule):
    """A row reduction whose producer block writes an output: ``y = x + r`` then rms_norm(y).

    Matches a PrimFunc whose first block is spatial, with exactly one reduction block
    ``S..S R`` reading its rows contiguously, every block covering the same leading row loops.
    """

    def schedule(self, sch: s_tir.Schedule) -> s_tir.Schedule | None:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        match = match_add_norm(sch, blocks, sch.mod["main"].params)
        return None if match is None else self._schedule(sch, blocks, *match)

    def _schedule(self, sch: s_tir.Schedule, blocks: list, reduction, rows: int) -> s_tir.Schedule:
        lanes = self.knobs.vector_lanes
        k_len = get_extent(sch, sch.get_loops(reduction)[-1])
        rf = None
        if isinstance(k_len, int) and k_len % lanes == 0 and k_len > lanes:
            _, k_i = sch.split(sch.get_loops(reduction)[-1], [None, lanes])
            rf = sch.rfactor(k_i, factor_axis=len(sch.get(reduction).writes[0].region))  # rf[row.., lane]
        first, *rest = blocks
        row_loops = sch.get_loops(first)[:rows]
        row = sch.fuse(*row_loops) if rows > 1 else row_loops[0]
        for block in ([rf] if rf is not None else []) + rest:
            sch.reverse_compute_at(block, row)  # no unit loops left under the row
        sch.parallel(row)
        for block in [first, *rest]:
            inner = sch.get_loops(block)[1:]
            if inner and not any(iv.iter_type == REDUCE for iv in sch.get(block).iter_vars):
                _vectorize(sch, sch.fuse(*inner) if len(inner) > 1 else inner[0], lanes)
        if rf is not None:
            lane, k_outer = sch.get_loops(rf)[1:]  # in the rf block's iter order: lane, then k_outer
            sch.reorder(k_outer, lane)
            sch.vectorize(lane)
            init = sch.decompose_reduction(rf, k_outer)
            sch.vectorize(sch.get_loops(init)[-1])
        return sch


def _vectorize(sch: s_tir.Schedule, loop, lanes: int) -> None:
    """Vectorise ``loop`` by the largest power of two <= lanes dividing its static extent."""
    extent = get_extent(sch, loop)
    if not isinstance(extent, int):
        return
    width = next((w for w in (lanes, lanes // 2, lanes // 4, 2) if w >= 2 and extent % w == 0), 1)
    if width > 1:
        sch.vectorize(sch.split(loop, [None, width])[1])


class LowBatchGEMV(CPUScheduleRule):
    """Matmuls tagged ``"kiln.gemv"``: schedule.py's Matmul with ``knobs`` (``gemv_knobs()``
    unless a tuning database gives others through ``Tuned``)."""

    def __init__(self, knobs: CPUKnobs | None = None) -> None:
        self.knobs = knobs or gemv_knobs()

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or func.attrs is None or GEMV_ATTR not in func.attrs:
            return None
        return Matmul(self.knobs).apply(func, target, tunable)
