"""CPU schedule for the fused dequantize + NT matmul kernels of 4/8-bit weights.

After compiler/passes/fuse_dequantize_matmul.py and FuseTIR, a quantized nn.Linear is one
PrimFunc with two blocks:

    W[n, k]     = dequantize(planes[n, ...])                   (spatial, reads int codes)
    C[.., m, n] += A[.., m, k] * W[n, k]                        (the NT matmul)

`QuantMatmul` schedules it more than once and branches on the row count at run time (one PrimFunc,
`if rows <= 1: <GEMV> else: <matmul>`, or row_dispatch.dispatch_on_rows's branches):

* 1, 2, 3-4 and 5-8 rows (decode of 1-8 sequences) of kiln's float32 kernels (every format, K a
  multiple of 64): quant_gemv.py's hand-written GEMVs (the scale and min applied per group, not per
  weight; 2-8 rows decode each weight once for every 4 of them; on a znver4 1.5-1.9x the schedules
  below for 4-bit weights at 1-4 rows, 1.05-2.1x for 8- and 16-bit, 1.0-1.5x at 5-8 rows).
* one row of the rest (float16 activations, K not a multiple of 64, groups not of 32s): the
  dequantize is inlined into a GEMV: parallel over tiles of
  gemv_tile_n weight rows (GEMV_TILE_N: per CPU), k vectorised (16 lanes: LLVM loads 2 words, spreads them with one
  vpermd and decodes the 16 nibbles with a variable shift, an and and a convert), vector
  partial sums in registers. Each 4-bit weight is read and decoded exactly once, ~8 vector
  ops per 16 weights: ~17 GB/s of planes per znver5 core, so 2 cores outrun the ~21 GB/s
  memory bandwidth decode is bound by.
* more rows (prefill, batched decode): each W tile (tile_n rows x K) is dequantized once
  into a small buffer that stays in L1 while the tile_m-row register tiles stream past it,
  so decoding costs once per weight instead of once per row tile: 150-190 GFLOP/s per core
  at m = 128, the float matmul's speed (inlining it there, as the float Matmul rule does
  with a producer, runs at 50-60 GFLOP/s). The rows go in blocks whose activations fit in L2
  (A_BLOCK_BYTES), the W tiles decoded once per block. With AVX2's 8 lanes (knobs.outer, the
  default there) the tile is an outer product instead (QuantMatmul._outer): A packed once a call
  into panels of 16 rows, each weight broadcast against 2 vectors of 8 rows, 4 weight rows x 16
  rows of sums in 8 registers over all of K, no lane sums at the end: SmolLM2's 1,024-token prefill
  1.36x, Gemma 3's 1,000-token 1.07x on a Zen 3 (its gate/up kernel 1.10x, q/o and down 1.15-1.30x).
  znver4's AVX-512 takes it too, as 1 vector of 16 rows by 8 weight rows (MATMUL_TILES: its kernels
  1.12-1.34x at 1,024 rows).
"""

from __future__ import annotations

import logging

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.stmt import SBlock, SBlockRealize
from tvm.s_tir.dlight.base import ScheduleRule, get_extent
from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumers, get_index_map
from tvm.target import Target

from ..profile import INT8_DECODE_ATTR
from ..row_dispatch import dispatch_on_rows, static_int
from . import quant_gemv
from .int8_gemv import int8_isa
from .schedule import (_STACK_BYTES, CPUKnobs, _largest_divisor, _pow2_divisor, normalize_matmul, outer_product,
                       row_block, takes_outer, target_mcpu)

logger = logging.getLogger(__name__)

_REDUCE = tirx.IterVar.CommReduce


def quant_schedule_rules(vector_lanes: int = 16, knobs: CPUKnobs | None = None, mcpu: str = "") -> list[ScheduleRule]:
    """Rules to put before the float CPU rules (schedule.cpu_schedule_rules)."""
    return [QuantMatmul(knobs or default_knobs(vector_lanes, mcpu))]


# The one-row GEMV's weight rows per tile where it is not the matmul's tile_n, by LLVM CPU name.
# znver4 (2 cores of an AMD EPYC VM, SmolLM2 batch-1 decode, two rounds each): 1 row against 8
# took its Q4_1 GGUF from 102.2 / 101.9 to 118.0 / 122.3 tok/s and its F16 GGUF from 66.0 / 65.2 to
# 93.5 / 90.3 (2 rows: 64.4 / 67.3, 4: 67.3 / 65.1). 8 stays elsewhere: znver5 measured it best
# (against 4; 1 untried there). `kiln tune` searches gemv_tile_n per kernel on any CPU.
GEMV_TILE_N = {"znver4": 1}


def gemv_tile_n(knobs: CPUKnobs, target: Target) -> int:
    """The one-row GEMV's rows per tile: the knob where set, else the CPU's (GEMV_TILE_N), else tile_n."""
    return knobs.gemv_tile_n or GEMV_TILE_N.get(target_mcpu(target), knobs.tile_n)


# The tiled matmul's accumulator tile (tile_m, tile_n, outer product) with 16 lanes, by LLVM CPU name;
# (2, 8, inner) elsewhere, measured best on znver5 (4-6% over 2 x 4 at m = 1 and 128). znver4 (AVX-512
# on 256-bit units; 2 cores of an AMD EPYC VM, q4m kernels alone at 2,048 rows, GFLOP/s): inner 2 x 4
# gate/up 166 against 154, down 135 against 124 (its 6 x 1,536-float W tile outgrew L1 at 2 x 8; 4 x 3:
# 147 / 137); SmolLM2 Q4_1 in alternating runs: prefill of 1,024 tokens 634 / 617 tok/s against 577 /
# 528. Then (2026-12-03, kernels alone at 1,024 rows, f16 scales, TVM_NUM_THREADS=2, GFLOP/s, inner 2 x 4
# / outer 1 x 8: one vector of 16 rows by 8 weight rows) q4m gate/up 155 / 179, down 123 / 165, qkv 155 /
# 179; q8m 146 / 180, 138 / 177, 152 / 182; q4 147 / 182, 130 / 163, 152 / 174; q8 156 / 184, 134 /
# 173, 167 / 191; q4m at 32 rows 141 / 171, 141 / 156, 145 / 170 (outer 2 x 4, 2 x 6, 1 x 6, 1 x 12,
# 1 x 16 and 4 x 4 within 0-10% below 1 x 8).
MATMUL_TILES = {"znver4": (1, 8, True)}


def default_knobs(vector_lanes: int, mcpu: str = "") -> CPUKnobs:
    """With AVX-512's 32 vector registers the CPU's accumulator tile and form (MATMUL_TILES, else an
    inner-product 2 x 8); the float rule's defaults otherwise, with AVX2's 8 lanes as an outer product
    (QuantMatmul._outer: 2 vectors of 8 rows by 4 weight rows, measured there; NEON's 4 lanes untried
    in it)."""
    if vector_lanes >= 16:
        tile_m, tile_n, outer = MATMUL_TILES.get(mcpu, (2, 8, False))
        return CPUKnobs(vector_lanes=vector_lanes, tile_m=tile_m, tile_n=tile_n, outer=outer)
    return CPUKnobs(vector_lanes=vector_lanes, outer=vector_lanes == 8)


class QuantMatmul(ScheduleRule):
    """Matches a PrimFunc of exactly two blocks: a spatial dequantize reading an integer
    (uint32 / int8 / uint8) plane, or a 16-bit one (float16 / uint16) it widens to float32, and writing
    W[N, K], and one NT matmul reduction reading W as its second operand (A and W both indexed by
    k last; N and K static). Symbolic rows get the GEMV (quant_gemv's where it matches) /
    tiled-matmul branch; static rows the tiled matmul alone. (The single-sequence ``decode``
    entry's one-row kernels never reach here: dlight's get_index_map refuses them and the float
    Matmul rule takes them; the runtime decodes through ``batch_decode``, whose rows are symbolic.)"""

    def __init__(self, knobs: CPUKnobs | None = None) -> None:
        self.knobs = knobs or default_knobs(16)

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or "llvm" not in target.kind.name:
            return None
        if func.attrs is not None and func.attrs.get("tirx.is_scheduled", False):
            return None
        if not is_dequant_matmul(func):
            return None
        try:
            large, rows = self._variant(func, panel=True)
            if static_int(rows) is not None:
                return large
            int8 = func.attrs is not None and bool(func.attrs.get(INT8_DECODE_ATTR, False))
            few = quant_gemv.branches(func, int8_isa(target) if int8 else None)
            if few is not None:             # a float32 kernel of any kiln format: the hand-written GEMVs
                return s_tir.Schedule(dispatch_on_rows(func, few, large.mod["main"]))
            small, _ = self._variant(func, panel=False, tile_n=gemv_tile_n(self.knobs, target))
        except (RuntimeError, ValueError) as err:       # s_tir.ScheduleError is a RuntimeError
            logger.warning("QuantMatmul left a function unscheduled: %s", str(err)[-300:])
            return None
        # One row (batch-1 decode): the GEMV; more rows: the dequantized-tile matmul.
        return s_tir.Schedule(_branch(rows <= 1, small.mod["main"], large.mod["main"]))

    def _variant(self, func: tirx.PrimFunc, panel: bool, tile_n: int | None = None):
        """(schedule, row count expression). panel=False inlines the dequantize into a
        one-row GEMV tile (of `tile_n` weight rows, else the knobs'); panel=True dequantizes each
        W tile into a buffer."""
        sch = s_tir.Schedule(func)
        deq, main, tail = _find_dequant_matmul(sch)
        read_a, read_b, _ = normalize_matmul(sch, main)
        if tail is not None:        # the cast joins the copy out of C, whose block is this schedule's own
            sch.reverse_compute_inline(tail)
        sch.compute_inline(deq)                 # read_b now dequantizes straight into B[S, J, K]
        deq = read_b
        if not panel:
            sch.compute_inline(deq)
        rows = get_extent(sch, sch.get_loops(main)[1])
        count = static_int(rows)
        if panel and takes_outer(self.knobs, count):
            return self._outer(sch, main, deq), rows
        sch.compute_inline(read_a)
        tile_m = self._pad_rows(sch, main, self.knobs.tile_m if panel else 1)
        return self._tile(sch, main, deq if panel else None, tile_m, tile_n or self.knobs.tile_n), rows

    @staticmethod
    def _pad_rows(sch: s_tir.Schedule, main: s_tir.SBlockRV, tile_m: int) -> int:
        """Pad the rows to a multiple of tile_m inside the A loads (no predicate on the tile)."""
        if tile_m > 1:
            try:
                sch.pad_einsum(main, [1, tile_m, 1, 1])
            except RuntimeError:
                tile_m = 1
            for producer in sch.get_producers(main):
                if sch.get(producer).name_hint.endswith("_pad"):
                    sch.compute_inline(producer)
        auto_inline_consumers(sch, main)      # the C reindex (and pad) copies become one block
        return tile_m

    def _tile(self, sch: s_tir.Schedule, main, deq, tile_m: int, tile_n: int) -> s_tir.Schedule:
        knobs = self.knobs
        s, i, j, k = sch.get_loops(main)
        n, k_len = static_int(get_extent(sch, j)), static_int(get_extent(sch, k))
        lanes = _pow2_divisor(k_len or 1, knobs.vector_lanes)
        if n is None or lanes < 4:
            raise ValueError(f"QuantMatmul needs static N and K % 4 == 0 (N={n}, K={k_len})")
        itemsize = tvm_ffi.dtype(sch.get(main).writes[0].source.dtype).itemsize
        col_bytes = tile_m * lanes * itemsize
        tile_n = _largest_divisor(n, tile_n, lambda t: t * col_bytes < _STACK_BYTES)
        rows, block_m = static_int(get_extent(sch, i)), row_block(k_len, tile_m)
        j_o, j_i = sch.split(j, [None, tile_n])
        k_o, k_i = sch.split(k, [None, lanes])
        i_o, i_i = sch.split(i, [None, tile_m])
        # The rows in blocks of block_m (A's block in L2 while the W tiles pass: schedule.A_BLOCK_BYTES)
        if deq is not None and (rows is None or rows > block_m):
            i_b, i_o = sch.split(i_o, [None, block_m // tile_m])
            sch.reorder(i_b, s, j_o, i_o, k_o, i_i, j_i, k_i)
        else:
            sch.reorder(s, j_o, i_o, k_o, i_i, j_i, k_i)
        rf = sch.rfactor(k_i, factor_axis=3)                       # rf[s, i, j, lane]
        *_, s, j_o, i_o, k_o, i_i, j_i, k_i = sch.get_loops(rf)
        sch.reverse_compute_at(main, i_o, preserve_unit_loops=True)
        lane, *spatial = sch.get_loops(main)[len(sch.get_loops(rf)) - 4:]
        sch.reorder(*spatial, lane)
        for consumer in sch.get_consumers(main):      # the copy out of the padded C, per tile
            sch.reverse_compute_at(consumer, i_o, preserve_unit_loops=True)
        if deq is not None:
            _dequantize_per_tile(sch, deq, j_o, lanes)
        sch.parallel(sch.fuse(s, j_o))
        sch.unroll(i_i)
        sch.unroll(j_i)
        sch.vectorize(k_i)
        init = sch.decompose_reduction(rf, k_o)
        sch.vectorize(sch.get_loops(init)[-1])
        sch.decompose_reduction(main, sch.get_loops(main)[-1])
        return sch

    def _outer(self, sch: s_tir.Schedule, main, deq) -> s_tir.Schedule:
        """The tiled matmul as an outer product (knobs.outer; schedule.outer_product: A packed into
        panels of the tile's rows, each weight broadcast against vectors of rows, the sums in registers
        over all of K); the W tile is dequantized once per row block as in _tile. AVX2 (2 cores of a
        Zen 3 EPYC, q8 kernels alone with f16 scales, TVM_NUM_THREADS=2, GFLOP/s, inner-product 2 x 4 /
        this form): 4,096 x 640 at 500 rows 89.3 / 117.8, at 32 rows 74.9 / 92.9, at 12 (padded to 16)
        44.6 / 48.7; 640 x 2,048 at 500 rows 88.5 / 106.5, at 2,048 84.6 / 113.7 (without the L2 row
        blocks 39% slower); 1,536 x 576 at 500 rows 79.2 / 99.2. 3 or 5 weight rows a tile, or 3 vectors
        of rows, within 5% of 4 x 2 either way."""
        def at_weight_tile(j_o, k_len: int) -> None:
            _dequantize_per_tile(sch, deq, j_o, _pow2_divisor(k_len, self.knobs.vector_lanes))
        return outer_product(sch, main, self.knobs, deq, at_weight_tile)


def _dequantize_per_tile(sch: s_tir.Schedule, deq, j_o, lanes: int) -> None:
    """The W tile (tile_n rows of K) dequantized into its buffer once per (s, j_o) of a row block,
    before the block's row tiles, K in vectors of `lanes`: both tiled forms' (_tile, _outer)."""
    sch.compute_at(deq, j_o, preserve_unit_loops=True)
    _, d_kv = sch.split(sch.get_loops(deq)[-1], [None, lanes])
    sch.vectorize(d_kv)


def _branch(cond: tirx.PrimExpr, then_func: tirx.PrimFunc, else_func: tirx.PrimFunc) -> tirx.PrimFunc:
    """One PrimFunc running `then_func`'s body when cond holds, else `else_func`'s (both
    scheduled from the same function, so they share its parameters)."""

    def nested(func: tirx.PrimFunc, name: str) -> SBlockRealize:
        root = func.body.block
        return SBlockRealize([], True, SBlock([], [], [], name, root.body, alloc_buffers=root.alloc_buffers))

    body = tirx.IfThenElse(cond, nested(then_func, "one_row"), nested(else_func, "many_rows"))
    return then_func.with_body(SBlockRealize([], True, SBlock([], [], [], "root", body)))


def is_dequant_matmul(func: tirx.PrimFunc) -> bool:
    """Whether QuantMatmul takes ``func`` (a dequantize + NT matmul kernel)."""
    return _find_dequant_matmul(s_tir.Schedule(func)) is not None


def _find_dequant_matmul(sch: s_tir.Schedule):
    """(dequantize block, matmul block, tail) when the function is that pair, optionally followed by
    one spatial block of the matmul's output alone (tail: a float16 scheme's cast of its float32
    sums; None without), else None."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    kinds = [{iv.iter_type for iv in sch.get(b).iter_vars} for b in blocks]
    reductions = [b for b, k in zip(blocks, kinds) if _REDUCE in k]
    if len(reductions) != 1 or len(blocks) not in (2, 3):
        return None
    main, tail = reductions[0], None
    if len(blocks) == 3:
        if not blocks[1].same_as(main):
            return None
        tail = blocks[2]
        if [r.source for r in sch.get(tail).reads] != [sch.get(main).writes[0].source]:
            return None
    deq = blocks[0]
    mm, dq = sch.get(main), sch.get(deq)
    if len(mm.reads) != 2 or len(mm.writes) != 1 or len(dq.writes) != 1:
        return None
    if not mm.reads[1].source.same_as(dq.writes[0].source):
        return None
    widened = dq.writes[0].source.dtype == "float32"       # f16 / bf16 weights (uint16 bits) widened
    if not any(r.source.dtype in ("uint32", "int8", "uint8") or (widened and r.source.dtype in ("float16", "uint16"))
               for r in dq.reads):
        return None
    k = next(iv.var for iv in mm.iter_vars if iv.iter_type == _REDUCE)
    a_last, b_last = (read.region[-1].min for read in mm.reads)
    if not (a_last.same_as(k) and b_last.same_as(k)) or get_index_map(mm) is None:
        return None
    return deq, main, tail


__all__ = ["GEMV_TILE_N", "MATMUL_TILES", "QuantMatmul", "default_knobs", "gemv_tile_n", "is_dequant_matmul",
           "quant_schedule_rules"]
