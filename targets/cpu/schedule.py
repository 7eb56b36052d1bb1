"""dlight-style CPU schedule rules: no matmul, norm or elementwise kernel runs as a scalar loop.

Use ``tvm.s_tir.dlight.ApplyDefaultSchedule(*cpu_schedule_rules())`` under ``with target:``
after FuseTIR; each PrimFunc gets the first rule that matches:

* ``Matmul``: ``C[s, i, j] = sum_k A[s, i, k] * B[s, j, k]`` (``nn.Linear`` after
  FuseTransposeMatmul) plus a fused elementwise epilogue.  Each thread keeps a
  ``tile_m x tile_n`` tile of vectors of k partial sums in registers (rfactor over
  ``k_inner = vector_lanes``): a 1-row call is a GEMV streaming each W row once, a 128-row call
  reuses every W load ``tile_m`` times.  The symbolic rows are padded to ``tile_m`` inside the
  A loads, so the tile has no predicate and its accumulators stay registers.  NN (B[k, j])
  vectorises j instead; a static single row (decode entry) is a plain GEMV.
* ``RowReduction``: reductions over the last axis (RMSNorm, softmax) and their spatial
  neighbours: parallel rows, all blocks computed at the row, reductions vectorised by rfactor.
* ``Elementwise``: all-spatial functions (residual add, silu * mul, rotary, cast, take):
  all inlined, outer loops fused and parallel, the innermost loop vectorised.

``Tuned(rule, lookup)`` gives a knob-taking rule (Matmul here; QuantMatmul, LowBatchGEMV) per-function
knobs from a lookup (the target's tuning database, targets/cpu/tuning.py, written by ``kiln tune``) and
marks each function scheduled that way with the attr ``kiln.tuned_knobs``.

Functions already scheduled (attr ``tirx.is_scheduled``) or matched by no rule are left alone
(they still build, as scalar loops); so are those where a rule hits a schedule error (logged).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.s_tir.dlight.base import ScheduleRule, get_extent
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumers, auto_inline_producers, get_index_map
from tvm.target import Target
from tvm.target.codegen import llvm_cpu_has_features, llvm_get_system_triple, llvm_get_vector_width

from ..row_dispatch import static_int

logger = logging.getLogger(__name__)

# Calls too costly to recompute per element, so blocks using them are never inlined.
_EXPENSIVE_CALLS = ("exp", "exp2", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "pow", "sin", "cos")
_REDUCE, _SPATIAL = tirx.IterVar.CommReduce, tirx.IterVar.DataPar
# LowerTVMBuiltin keeps a CPU buffer on the stack only if its scope is "global" and it is
# smaller than kMaxStackAlloca (1 KB); anything else (any "local" buffer!) becomes a
# TVMBackendAllocWorkspace heap block, which LLVM often cannot keep in registers.  So the
# accumulator tiles stay "global" and under this size.
_STACK_BYTES = 1024

# The tiled matmuls' rows (Matmul's, quant_schedule.QuantMatmul's) are taken in blocks whose activations
# (rows x K float32) fit in this much of L2: every W tile streams all the rows of A past its registers,
# and rows beyond L2 came from L3 or memory once per W tile. 2 Xeon cores (2 MB of L2 each), kernels alone
# with symbolic rows as compiled, GFLOP/s without / with the blocks (3 alternating rounds): q4m 640 x 2048
# (Gemma 3 270M's down projection) at 512 rows 110-114 / 221-237, 576 x 1536 131-141 / 226-243, 3072 x 576
# at 128 rows 197-206 / 208-220, at 16 and 37 rows level; float32 640 x 2048 at 512 rows 112 / 201,
# 576 x 1536 74 / 220. 512 KB: the L2 of most cores kiln meets is 1-2 MB (Zen 4, Sapphire Rapids,
# Cortex-X), and A shares it with the W tile and C.
A_BLOCK_BYTES = 512 * 1024


@dataclass(frozen=True)
class CPUKnobs:
    """Tile sizes shared by the CPU rules (defaults tuned on 2-core znver5, AVX-512, f32)."""

    vector_lanes: int = 16  # elements per SIMD vector: 16 f32 on AVX-512, 8 on AVX2
    tile_m: int = 2  # matmul register tile: A rows sharing each W load
    tile_n: int = 4  # matmul register tile: W rows sharing each A load (see _STACK_BYTES)
    unroll_k: int = 1  # extra unroll of the k_outer loop (1 = none)
    # QuantMatmul's one-row GEMV: W rows per tile; 0 = the rule's default for the CPU (quant_schedule.py)
    gemv_tile_n: int = 0
    # the tiled matmuls as outer products: tile_n weight rows broadcast against tile_m vectors of
    # (packed) A rows, no lane sums (outer_product; QuantMatmul's default on AVX2, the float Matmul's
    # where tuned)
    outer: bool = False

    def __post_init__(self) -> None:
        for name in ("vector_lanes", "tile_m", "tile_n", "unroll_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"CPUKnobs.{name} must be a positive int, got {value!r}")
        if not isinstance(self.gemv_tile_n, int) or not 0 <= self.gemv_tile_n <= 24:
            raise ValueError(f"CPUKnobs.gemv_tile_n must be an int in 0..24, got {self.gemv_tile_n!r}")
        if not isinstance(self.outer, bool):
            raise ValueError(f"CPUKnobs.outer must be a bool, got {self.outer!r}")
        if self.vector_lanes < 2 or self.vector_lanes & (self.vector_lanes - 1):
            raise ValueError(f"CPUKnobs.vector_lanes must be a power of two >= 2, got {self.vector_lanes}")
        if self.tile_m * self.tile_n > 24:
            raise ValueError(f"tile_m * tile_n = {self.tile_m * self.tile_n} accumulators would spill the "
                             "vector registers (32 on AVX-512, 16 on AVX2); keep it <= 24")


def vector_bits(target: Target) -> int:
    """The widest SIMD register of an llvm target's CPU, in bits. On x86 from its features (TVM 0.27's
    llvm_get_vector_width says 512 for every x86 CPU, haswell, znver3 and generic alike: AVX2 hosts
    were scheduled for AVX-512's 16 lanes and 2 x 8 tile, 32 vectors of accumulators in 16 registers,
    2.5x slower prefill matmuls on a znver3); elsewhere LLVM's answer (128 for NEON)."""
    triple = str(target.attrs["mtriple"]) if "mtriple" in target.attrs else llvm_get_system_triple()
    if triple.startswith(("x86_64", "i686", "i386")):
        if llvm_cpu_has_features("avx512f", target):
            return 512
        return 256 if llvm_cpu_has_features("avx", target) else 128
    return llvm_get_vector_width(target)


def vector_lanes_for_target(target: Target, dtype_bits: int = 32) -> int:
    """SIMD lanes of ``dtype_bits``-wide elements for an llvm target (16 for f32 on AVX-512, 8 on AVX2)."""
    bits = vector_bits(target)
    return max(bits // dtype_bits, 4) if bits > 0 else 128 // dtype_bits


def attention_lanes(target: Target) -> int:
    """float32 lanes kiln's CPU attention kernels take (attention.py's `simd`): 16 on AVX-512, 8 on AVX2;
    NEON's 4 taken as 8 (32 registers)."""
    return min(16, max(8, vector_lanes_for_target(target)))


def target_mcpu(target: Target) -> str:
    """The target's LLVM CPU name ("" where it names none): the key of the per-CPU tile tables."""
    return str(target.attrs["mcpu"]) if "mcpu" in target.attrs else ""


def cpu_schedule_rules(vector_lanes: int = 16, knobs: CPUKnobs | None = None) -> list[ScheduleRule]:
    """The CPU rules in the order ApplyDefaultSchedule should try them (most specific first).

    ``knobs`` sets every size; without it, ``CPUKnobs(vector_lanes=vector_lanes)``."""
    if knobs is not None and vector_lanes not in (16, knobs.vector_lanes):
        raise ValueError(f"vector_lanes={vector_lanes} conflicts with knobs.vector_lanes="
                         f"{knobs.vector_lanes}; set it in the knobs only")
    from .rowwise import Elementwise, RowReduction
    knobs = knobs or CPUKnobs(vector_lanes=vector_lanes)
    return [Matmul(knobs), RowReduction(knobs), Elementwise(knobs)]


# ----------------------------------------------------------------------------- shared helpers


class KilnCPURule(CPUScheduleRule):
    """Common gatekeeping of kiln's CPU rules: llvm target, not yet scheduled; a schedule error
    means no match (logged). Subclasses implement ``schedule(sch)``, returning None on no match."""

    def __init__(self, knobs: CPUKnobs | None = None) -> None:
        self.knobs = knobs or CPUKnobs()

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        if func.attrs is not None and func.attrs.get("tirx.is_scheduled", False):
            return None
        try:
            return self.schedule(s_tir.Schedule(func))
        except (RuntimeError, ValueError) as err:  # s_tir.ScheduleError is a RuntimeError
            logger.warning("%s left a function unscheduled: %s", type(self).__name__, str(err)[-300:])
            return None

    def schedule(self, sch: s_tir.Schedule) -> s_tir.Schedule | None:
        raise NotImplementedError


def normalize_matmul(sch: s_tir.Schedule, main) -> tuple:
    """Rewrite a matmul block to C[S, I, J] += A[S, I, K] * B[S, J, K] (dlight's gpu Matmul
    recipe); returns the reindex blocks (read_a, read_b, write_c) for the caller to inline."""
    read_a, read_b = sch.reindex(main, ("read", 0)), sch.reindex(main, ("read", 1))
    write_c = sch.reindex(main, ("write", 0))
    block_map, a_map, b_map, c_map = get_index_map(sch.get(main))
    sch.transform_layout(read_a, ("write", 0), a_map)
    sch.transform_layout(read_b, ("write", 0), b_map)
    sch.transform_layout(write_c, ("read", 0), c_map)
    sch.transform_block_layout(main, block_map)
    return read_a, read_b, write_c


def row_block(k_len: int, tile_m: int) -> int:
    """Rows of A (float32, K wide) in A_BLOCK_BYTES: a power of two, a multiple of tile_m."""
    rows = max(A_BLOCK_BYTES // (4 * k_len), tile_m)
    return max(1 << (rows.bit_length() - 1), tile_m) // tile_m * tile_m


def takes_outer(knobs: "CPUKnobs", rows: int | None) -> bool:
    """Whether a tiled matmul over `rows` rows (None: symbolic) takes the outer-product form: where
    knobs.outer and the rows fill at least one panel (fewer static rows keep the inner tile)."""
    return knobs.outer and (rows is None or rows >= knobs.tile_m * knobs.vector_lanes)


def outer_product(sch: s_tir.Schedule, main, knobs: "CPUKnobs", weights=None,
                  at_weight_tile: Callable[[s_tir.LoopRV, int], None] | None = None) -> s_tir.Schedule:
    """An NT matmul (main: C[s, i, j] += A[s, i, k] * W[s, j, k], normalized) as outer products: a tile
    of knobs.tile_n weight rows, each weight broadcast against knobs.tile_m vectors of rows of A, the
    tile_m x tile_n vector sums in registers over all of K and no lanes to sum at the end (an inner-
    product tile ends each tile with its lane sums and leaves registers idle). A is packed first, once
    a call, into panels of the tile's rows ([rows / rt, K, rt]: each k's rt values one contiguous vector
    load; pad_einsum's padded copy of A given that layout); the rows go in L2-sized blocks (row_block).
    `weights`: main's producer of W (QuantMatmul's dequantize), not A's; at_weight_tile(j_o, K) then
    places it per weight tile. Both the float Matmul and QuantMatmul take it (knobs.outer)."""
    lanes, vectors = knobs.vector_lanes, knobs.tile_m
    rt = lanes * vectors                       # rows of A a register tile takes
    sch.pad_einsum(main, [1, rt, 1, 1])
    auto_inline_consumers(sch, main)
    # the copy of A[S, I, K] padded to whole tiles (pad_einsum's) packs A
    pack = next(p for p in sch.get_producers(main) if weights is None or not p.same_as(weights))
    for producer in sch.get_producers(pack):
        sch.compute_inline(producer)
    sch.transform_layout(pack, ("write", 0), lambda s, i, k: (s, i // rt, k, i % rt))
    s, i, k = sch.get_loops(pack)
    i_o, i_i = sch.split(i, [None, rt])
    sch.reorder(s, i_o, k, i_i)
    sch.parallel(sch.fuse(s, i_o))
    s, i, j, k = sch.get_loops(main)
    n, k_len = static_int(get_extent(sch, j)), static_int(get_extent(sch, k))
    if n is None or k_len is None:
        raise ValueError(f"the outer-product matmul needs static N and K (N={n}, K={k_len})")
    tile_n = _largest_divisor(n, knobs.tile_n)
    j_o, j_i = sch.split(j, [None, tile_n])
    i_o, i_i = sch.split(i, [None, rt])
    # The rows in blocks of block_m (their panels in L2 while the W tiles pass: A_BLOCK_BYTES)
    i_b, i_o = sch.split(i_o, [None, row_block(k_len, rt) // rt])
    sch.reorder(i_b, s, j_o, i_o, k, j_i, i_i)
    acc = sch.cache_write(main, 0, "local")
    sch.reverse_compute_at(acc, i_o, preserve_unit_loops=True)
    sch.transform_layout(main, ("write", 0), lambda s, i, j: (s, j, i))     # a weight row's sums: vectors
    for consumer in sch.get_consumers(acc):      # the copy out of the padded C, per tile
        sch.reverse_compute_at(consumer, i_o, preserve_unit_loops=True)
    if at_weight_tile is not None:
        at_weight_tile(j_o, k_len)
    sch.parallel(sch.fuse(s, j_o))
    sch.unroll(j_i)
    i_v, i_l = sch.split(i_i, [vectors, lanes])
    sch.unroll(i_v)
    sch.vectorize(i_l)
    init = sch.decompose_reduction(main, k)
    sch.vectorize(sch.get_loops(init)[-1])
    return sch


def _largest_divisor(n: int, limit: int, ok: Callable[[int], bool] = lambda d: True) -> int:
    """Largest d <= limit dividing n (and passing ``ok``); 1 if none."""
    return next((d for d in range(min(limit, n), 0, -1) if n % d == 0 and ok(d)), 1)


def _pow2_divisor(n: int, limit: int) -> int:  # vector widths must be powers of two
    return _largest_divisor(n, limit, lambda d: d & (d - 1) == 0)


def _root_blocks(sch: s_tir.Schedule) -> list[s_tir.SBlockRV]:
    return sch.get_child_blocks(sch.get_sblock("root"))


def _is_reduction(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> bool:
    return any(iv.iter_type == _REDUCE for iv in sch.get(block).iter_vars)


def _vectorize_inner(sch: s_tir.Schedule, loop: s_tir.LoopRV, lanes: int) -> s_tir.LoopRV:
    """Vectorise ``loop`` by the largest power of two <= lanes dividing its static extent;
    returns the outer remainder loop (``loop`` itself when nothing could be vectorised)."""
    width = _pow2_divisor(static_int(get_extent(sch, loop)) or 1, lanes)
    if width < 2:
        return loop
    outer, inner = sch.split(loop, [None, width])
    sch.vectorize(inner)
    return outer


def _schedule_spatial_block(sch: s_tir.Schedule, block: s_tir.SBlockRV, lanes: int) -> None:
    """A stand-alone spatial block: vectorised innermost loop, all other loops fused, parallel."""
    loops = sch.get_loops(block)
    if loops:
        outer = _vectorize_inner(sch, loops[-1], lanes)
        sch.parallel(sch.fuse(*loops[:-1], outer) if len(loops) > 1 else outer)


def _inline_all(sch: s_tir.Schedule, keep: Callable[[s_tir.SBlockRV], bool] = lambda b: False) -> None:
    """Inline (into consumers, else into the producer) every block not ``keep``-ed, to fixpoint."""

    def inline_one() -> bool:
        for block in _root_blocks(sch):
            if keep(block):
                continue
            for primitive in (sch.compute_inline, sch.reverse_compute_inline):
                try:
                    primitive(block)
                    return True
                except RuntimeError:
                    pass
        return False

    while inline_one():
        pass


def _has_expensive_call(stmt: tirx.Stmt) -> bool:
    """Whether a block body calls exp/rsqrt/...; anything but a single store counts as costly."""
    if not isinstance(stmt, tirx.BufferStore):
        return True
    stack = [stmt.value]
    while stack:
        expr = stack.pop()
        if isinstance(expr, ir.Call):
            if expr.op.name.rsplit(".", 1)[-1] in _EXPENSIVE_CALLS:
                return True
            stack.extend(expr.args)
        stack.extend(getattr(expr, f) for f in ("a", "b", "value", "condition", "true_value", "false_value")
                     if isinstance(getattr(expr, f, None), ir.Expr))
    return False


# ----------------------------------------------------------------------------- Matmul


class Matmul(KilnCPURule):
    """Register-blocked, vectorised, parallel matmul with its epilogue computed at the tile.

    Matches a PrimFunc with exactly one reduction block ``C[s, i, j] += A[s, i, k] * B[s, j, k]``
    (batch and unit axes are fused by dlight's index maps) whose A and B are contiguous along
    k (NT), or whose B is contiguous along j (NN), and only spatial blocks around it.
    N and K must be static; the rows (i) may be symbolic.
    """

    def schedule(self, sch: s_tir.Schedule) -> s_tir.Schedule | None:
        blocks = _root_blocks(sch)
        kinds = [{iv.iter_type for iv in sch.get(b).iter_vars} for b in blocks]
        reductions = [b for b, k in zip(blocks, kinds) if _REDUCE in k]
        if len(reductions) != 1 or any(k - {_SPATIAL, _REDUCE} for k in kinds):
            return None
        main = reductions[0]
        layout = _matmul_layout(sch.get(main))
        if layout == "gemv":  # static single row: C[.., j] = sum_k A[.., k] * B[j, k]
            auto_inline_producers(sch, main)
            auto_inline_consumers(sch, main)
            *spatial, k = sch.get_loops(main)
            j = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
            return self._schedule_nt(sch, main, [], None, j, k)
        if layout is None:
            return None
        normalize_matmul(sch, main)
        auto_inline_producers(sch, main)  # the reindex copies and any elementwise prologue
        if layout == "nn":
            return self._schedule_nn(sch, main)
        # The outer-product form (knobs.outer) where tuned: off by default here. AVX2 (2 Zen 3 cores,
        # kernels alone at 500 rows, GFLOP/s, inner 2 x 4 / outer 2 x 4 / outer 2 x 6): SmolLM2's
        # 3,072 x 576 164.8 / 167.8 / 173.0, 576 x 1,536 151.2 / 161.7 / 166.3, 960 x 576 165.8 /
        # 168.2 / 168.2 (QuantMatmul's gained 1.1-1.3x: its inner tile also dequantizes); its sums, one
        # chain over K, 5x further from float64 (1.6e-6 relative against 2.8e-7).
        if takes_outer(self.knobs, static_int(get_extent(sch, sch.get_loops(main)[1]))):
            return outer_product(sch, main, self.knobs)
        tile_m = self._pad_rows(sch, main, self.knobs.tile_m)
        s, i, j, k = sch.get_loops(main)
        return self._schedule_nt(sch, main, [s], (i, tile_m), j, k)

    def _schedule_nt(self, sch, main, outer: list, rows: tuple | None, j, k) -> s_tir.Schedule | None:
        """Tile (rows x j) in registers, each a vector of k partial sums; ``rows`` is the
        symbolic row loop and its tile, None for a single static row (GEMV)."""
        knobs = self.knobs
        n, k_len = static_int(get_extent(sch, j)), static_int(get_extent(sch, k))
        lanes = _pow2_divisor(k_len or 1, knobs.vector_lanes)
        if n is None or lanes < 4:
            return None
        # tile_m x tile_n vectors of partial sums, kept under the stack limit (so in registers).
        dtype = tvm_ffi.dtype(sch.get(main).writes[0].source.dtype)
        col_bytes = (rows[1] if rows else 1) * lanes * dtype.itemsize
        tile_n = _largest_divisor(n, knobs.tile_n, lambda t: t * col_bytes < _STACK_BYTES)
        n_rows = static_int(get_extent(sch, rows[0])) if rows else 1
        j_o, j_i = sch.split(j, [None, tile_n])
        k_o, k_i = sch.split(k, [None, lanes])
        row_tile = list(sch.split(rows[0], [None, rows[1]])) if rows else []  # [i_o, i_i]
        blocks = []          # the rows in blocks of block_m (A's block in L2 while the W tiles pass)
        block_m = row_block(k_len, rows[1]) if rows else 1
        if rows and rows[1] > 1 and (n_rows is None or n_rows > block_m):     # (not a GEMV copy's 1-row tiles)
            i_b, row_tile[0] = sch.split(row_tile[0], [None, block_m // rows[1]])
            blocks = [i_b]
        # The W tile (tile_n rows of W) stays in L1 while the row tiles stream past it.
        sch.reorder(*blocks, *outer, j_o, *row_tile[:1], k_o, *row_tile[1:], j_i, k_i)
        rf = sch.rfactor(k_i, factor_axis=len(sch.get(main).writes[0].region))  # rf[.., lane]
        loops = sch.get_loops(rf)
        tile, depth = loops[len(blocks) + len(outer) + bool(rows)], len(blocks) + len(outer) + 1 + bool(rows)
        sch.reverse_compute_at(main, tile, preserve_unit_loops=True)
        lane, *spatial = sch.get_loops(main)[depth:]
        sch.reorder(*spatial, lane)  # then sum each accumulator's lanes
        self._epilogue_at_tile(sch, main, tile)
        parallel = loops[len(blocks):depth - bool(blocks)]      # blocked: the row tiles run serially in a task
        sch.parallel(sch.fuse(*parallel) if len(parallel) > 1 else parallel[0])
        k_o, *inner, k_i = loops[depth:]
        if knobs.unroll_k > 1 and (k_len // lanes) % knobs.unroll_k == 0:
            k_o, k_u = sch.split(k_o, [None, knobs.unroll_k])
            sch.unroll(k_u)
        for loop in inner:
            sch.unroll(loop)
        sch.vectorize(k_i)
        init = sch.decompose_reduction(rf, k_o)
        sch.vectorize(sch.get_loops(init)[-1])
        sch.decompose_reduction(main, sch.get_loops(main)[-1])
        return sch

    def _schedule_nn(self, sch: s_tir.Schedule, main: s_tir.SBlockRV) -> s_tir.Schedule | None:
        """4 rows x 2 vectors of columns: broadcast A[i, k] times a vector of B[k, j]."""
        n = static_int(get_extent(sch, sch.get_loops(main)[2]))
        lanes = _pow2_divisor(n or 1, self.knobs.vector_lanes)
        if n is None or lanes < 4:
            return None
        tile_m, tile_v = self._pad_rows(sch, main, 4), _largest_divisor(n // lanes, 2)
        s, i, j, k = sch.get_loops(main)
        i_o, i_i = sch.split(i, [None, tile_m])
        j_o, j_v, j_l = sch.split(j, [None, tile_v, lanes])
        sch.reorder(s, j_o, i_o, k, i_i, j_v, j_l)
        self._epilogue_at_tile(sch, main, i_o)
        sch.parallel(sch.fuse(s, j_o, i_o))
        sch.unroll(i_i)
        sch.unroll(j_v)
        sch.vectorize(j_l)
        init = sch.decompose_reduction(main, k)
        sch.vectorize(sch.get_loops(init)[-1])
        return sch

    @staticmethod
    def _pad_rows(sch: s_tir.Schedule, main: s_tir.SBlockRV, tile_m: int) -> int:
        """Pad the rows to a multiple of ``tile_m`` inside the A loads (``A[i] if i < m else
        0``): without a predicate on the tile its accumulators compact to registers.  Returns
        the row tile used: 1 when the rows fuse two symbolic axes (b * m), which pad_einsum
        cannot pad."""
        if tile_m > 1:
            try:
                sch.pad_einsum(main, [1, tile_m, 1, 1])
            except RuntimeError:
                tile_m = 1
            auto_inline_producers(sch, main)
        auto_inline_consumers(sch, main)  # the C reindex copy and the epilogue become one block
        return tile_m

    def _epilogue_at_tile(self, sch: s_tir.Schedule, main: s_tir.SBlockRV, tile: s_tir.LoopRV) -> None:
        """Run the (single, fused) epilogue right after each tile, C staying in registers;
        several consumers run afterwards as parallel loops over C in memory."""
        consumers = sch.get_consumers(main)
        if len(consumers) != 1:
            for consumer in consumers:
                _schedule_spatial_block(sch, consumer, self.knobs.vector_lanes)
            return
        sch.reverse_compute_at(consumers[0], tile, preserve_unit_loops=True)
        _vectorize_inner(sch, sch.get_loops(consumers[0])[-1], self.knobs.vector_lanes)


def _matmul_layout(block: s_tir.SBlock) -> str | None:
    """'nt' if A and B are both contiguous along k, 'nn' if B is contiguous along j, 'gemv'
    for an NT product with no row axis at all (static m = 1: A has only unit axes and k)."""
    reduce_vars = [iv.var for iv in block.iter_vars if iv.iter_type == _REDUCE]
    if len(block.reads) != 2 or len(block.writes) != 1 or len(reduce_vars) != 1:
        return None
    k = reduce_vars[0]
    a_last, b_last = (read.region[-1].min for read in block.reads)
    if get_index_map(block) is None:
        a_vars = {v for r in block.reads[0].region for v in tirx.analysis.undefined_vars(r.min)}
        unit = {iv.var for iv in block.iter_vars if static_int(iv.dom.extent) == 1}
        only_k = all(v.same_as(k) or any(v.same_as(u) for u in unit) for v in a_vars)
        k_last = block.iter_vars[-1].var.same_as(k)  # the GEMV path takes the last loop as k
        return "gemv" if only_k and k_last and a_last.same_as(k) and b_last.same_as(k) else None
    if a_last.same_as(k) and b_last.same_as(k):
        return "nt"
    return "nn" if isinstance(b_last, tirx.Var) and b_last.same_as(block.writes[0].region[-1].min) else None


__all__ = ["CPUKnobs", "KilnCPURule", "Matmul", "cpu_schedule_rules", "normalize_matmul", "target_mcpu",
           "vector_lanes_for_target"]
