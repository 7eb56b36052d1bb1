"""Row-wise CPU rules: ``RowReduction`` (RMSNorm, softmax: reductions over the last axis with their
spatial neighbours) and ``Elementwise`` (all-spatial functions); see schedule.py for the set."""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import get_extent

from ..row_dispatch import static_int
from .schedule import (_REDUCE, KilnCPURule, _has_expensive_call, _inline_all, _is_reduction, _root_blocks,
                       _schedule_spatial_block, _vectorize_inner)

# ----------------------------------------------------------------------------- RowReduction


class RowReduction(KilnCPURule):
    """Reductions over the innermost axis of each row, with their spatial producers/consumers.

    Matches when every reduction block is ``S..S R`` over a contiguously read last axis and all
    blocks share the output's leading (row) loops.  Cheap spatial blocks are inlined; blocks
    calling exp/rsqrt (softmax's exp, RMSNorm's per-row rsqrt) stay computed once per row.
    """

    def schedule(self, sch: s_tir.Schedule) -> s_tir.Schedule | None:
        infos = normalize_prim_func(sch)
        if not infos or all(info.is_injective() for info in infos):
            return None
        kinds = [info.dom_kind() for info in infos]
        if any("R" in kind and kind != "S" * (len(kind) - 1) + "R" for kind in kinds):
            return None  # only S..S R reductions (one reduce axis, innermost)
        lanes = self.knobs.vector_lanes
        _inline_all(sch, keep=lambda b: _is_reduction(sch, b) or _has_expensive_call(sch.get(b).body))
        blocks = _root_blocks(sch)
        reductions = [b for b in blocks if _is_reduction(sch, b)]
        rows = _row_rank(sch, blocks, reductions)
        if rows is None or not all(_reads_row_contiguously(sch.get(b)) or _is_expert_matmul(sch.get(b))
                                   for b in reductions):
            return None
        # Vector partial sums first: rfactor wants the reduction alone in its loop nest.
        rf_blocks = [rf for rf in (self._rfactor(sch, b, lanes) for b in reductions) if rf is not None]
        blocks = _root_blocks(sch)
        if rows:  # one parallel row loop holding every block (a single static row has none)
            out_loops = sch.get_loops(blocks[-1])
            row = sch.fuse(*out_loops[:rows]) if rows > 1 else out_loops[0]
            sch.parallel(row)
            for block in reversed(blocks[:-1]):
                sch.compute_at(block, row, preserve_unit_loops=True)
        for block in blocks:
            inner = sch.get_loops(block)[1 if rows else 0:]  # the loops inside the row
            if inner and not _is_reduction(sch, block):
                _vectorize_inner(sch, sch.fuse(*inner) if len(inner) > 1 else inner[0], lanes)
        for rf in rf_blocks:
            if rows:  # compute_at put the lane loop outside k_outer: swap them
                lane, *_, k_outer = sch.get_loops(rf)[1:]
                sch.reorder(k_outer, lane)
            else:
                *_, k_outer, lane = sch.get_loops(rf)
            sch.vectorize(lane)
            init = sch.decompose_reduction(rf, k_outer)
            sch.vectorize(sch.get_loops(init)[-1])
        return sch

    @staticmethod
    def _rfactor(sch: s_tir.Schedule, block: s_tir.SBlockRV, lanes: int) -> s_tir.SBlockRV | None:
        """Split the row reduction into ``lanes`` vector partial sums; returns the rf block."""
        extent = static_int(get_extent(sch, sch.get_loops(block)[-1]))
        if extent is None or extent % lanes or extent <= lanes:
            return None
        _, k_i = sch.split(sch.get_loops(block)[-1], [None, lanes])
        try:
            rf = sch.rfactor(k_i, factor_axis=len(sch.get(block).writes[0].region))
        except RuntimeError:
            return None  # a combiner rfactor does not know (argmax): stays a serial loop
        return rf


def _is_expert_matmul(block: s_tir.SBlock) -> bool:
    """models/moe.py's gathered expert matmul: each output element (token, expert slot, row) a dot product
    whose weight row is read through the router's index (not contiguously in the loops RowReduction sees,
    but a row all the same): RowReduction's schedule, one parallel loop over the outputs and the dot in
    vector partial sums. A random-weight Qwen3-MoE of 8 layers (hidden 1024, 32 experts of 512, top 4,
    q4f32; 2-core EPYC): decode 75.7 -> 8.9 ms a step (its expert matmuls 71.0 -> 6.1 ms; unscheduled,
    they ran serial scalar loops), prefill of 64 tokens 157 tok/s after. Over a symbolic token count
    expert_matmul.py's GroupedExpertMatmul takes them first (grouped by expert, or the GEMV) and keeps
    this schedule for the formats its GEMV does not take; the single-sequence decode entry's static
    token stays here."""
    return block.name_hint.startswith("expert_matmul")


def _row_rank(sch: s_tir.Schedule, blocks: list, reductions: list) -> int | None:
    """How many leading loops (the rows) every block shares with the output block; None if
    a block does not cover the rows."""

    def same(a, b) -> bool:
        if isinstance(a, int) or isinstance(b, int):
            return static_int(a) == static_int(b)
        return tvm_ffi.structural_equal(a, b)

    out_extents = [get_extent(sch, loop) for loop in sch.get_loops(blocks[-1])]
    rows = min(len(sch.get(b).iter_vars) - 1 for b in reductions)  # all S..S R after normalising
    rows = max(0, min(rows, len(out_extents) - 1))
    for block in blocks:
        extents = [get_extent(sch, loop) for loop in sch.get_loops(block)][:rows]
        if len(extents) < rows or not all(map(same, extents, out_extents)):
            return None
    return rows


def _reads_row_contiguously(block: s_tir.SBlock) -> bool:
    """Every read that depends on the reduce var indexes it in its last dimension."""
    k = next(iv.var for iv in block.iter_vars if iv.iter_type == _REDUCE)
    for read in block.reads:
        uses = any(v.same_as(k) for r in read.region for v in tirx.analysis.undefined_vars(r.min))
        if uses and not read.region[-1].min.same_as(k):
            return False
    return True


# ----------------------------------------------------------------------------- Elementwise


class Elementwise(KilnCPURule):
    """All-spatial functions: everything inlined, then parallel + vectorised per output.

    Matches residual adds, silu * mul, rotary, casts, reshapes and take (embedding gather).
    """

    def schedule(self, sch: s_tir.Schedule) -> s_tir.Schedule | None:
        infos = normalize_prim_func(sch)
        if not infos or not all(info.is_injective() for info in infos):
            return None
        _inline_all(sch, keep=lambda b: _has_expensive_call(sch.get(b).body) and _read_repeatedly(sch, b))
        for block in _root_blocks(sch):
            _schedule_spatial_block(sch, block, self.knobs.vector_lanes)
        return sch


def _read_repeatedly(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> bool:
    """Whether a consumer reads the block's output with some of its own axes left out of the indices
    (every value read for several outputs: RoPE's cos and sin tables, read by every head), so that
    inlining it would recompute each value that many times."""
    written = sch.get(block).writes[0].source
    for consumer in sch.get_consumers(block):
        body = sch.get(consumer)
        axes = [iv.var for iv in body.iter_vars
                if not (isinstance(iv.dom.extent, tirx.IntImm) and iv.dom.extent.value == 1)]
        for region in body.reads:
            if region.source.same_as(written):
                used = [u for r in region.region for u in tirx.analysis.undefined_vars(r.min)]
                if any(not any(v.same_as(u) for u in used) for v in axes):
                    return True
    return False


__all__ = ["Elementwise", "RowReduction"]
