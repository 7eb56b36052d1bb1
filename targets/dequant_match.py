"""Recognise kiln's quantized matmul exactly: a `dequantize` of one weight format into an `NT_matmul`,
optionally followed by a cast of the sums; what the hand-written GEMVs (targets/q4_gemv.py,
targets/mma_gemv.py on CUDA, targets/cpu/quant_gemv.py on a CPU) compute in place of a schedule.

One matcher for every target: the format is found by comparing the dequantize's value with
compiler/quant_modules.py's `dequantize_element` for each kind (either code form), so a kernel's
arithmetic can only be taken where it is the function's. Each GEMV then checks the sizes, dtypes and
rows its kernel takes.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm_ffi import structural_equal

from kiln.compiler.quant_modules import FLOAT_KINDS, KINDS, QuantFormat, dequantize_element

from .row_dispatch import static_int


HEAD = ("dequantize", "NT_matmul")      # the first blocks of every function matched here


def silu_glu(gate, up):
    """silu(gate) * up as the legalized ops compute it (float16: gate * sigmoid(gate), then * up)."""
    return gate * tirx.sigmoid(gate) * up


# Gated activations a GEMV may compute as its epilogue (compiler/passes/fuse_dequantize_matmul.py's
# `glu_epilogue`): name -> the output's element from the cast sums' element k and k + N / 2.
EPILOGUES = {"silu_glu": silu_glu}


@dataclass(frozen=True)
class DequantMatmul:
    kind: str                   # one of quant_modules.KINDS
    group: int                  # values a scale covers (16-bit floats: none; 0)
    n: int                      # weight rows (the output's last dim)
    k: int                      # weight columns (the activations' last dim)
    planes: tuple               # the function's buffers: codes, scale, min (None where the format has none)
    x: tirx.Buffer              # activations [rows, 1, K] (or [1, rows, K]: see match_dequant_matmul)
    sums: tirx.Buffer           # the matmul's output
    out: tirx.Buffer            # the function's output: sums, or the cast of them
    rows: tirx.PrimExpr         # x's rows dim (a symbolic size, or an IntImm)
    epilogue: str | None = None  # an EPILOGUES name: out is its output [rows, 1, N / 2], from the cast sums


def match_dequant_matmul(func: tirx.PrimFunc, dtype: str, kinds=KINDS, rows_second: bool = False,
                         epilogues=()) -> DequantMatmul | None:
    """The function's format and buffers if it is a `kinds` weight dequantized to `dtype` (float32 on
    a CPU, float16 on a GPU), multiplied by activations [rows, 1, K] (of `dtype`, each product
    widened to the sums' dtype where that differs), else None. `rows_second`: [1, rows, K] too, the
    output [1, rows, N] (a prefill's: one sequence's positions; the same memory as [rows, 1, K], for
    kernels that view it so, row_dispatch.over_params). `epilogues`: EPILOGUES names the caller
    computes; the cast sums may then feed one of them, whose output is the function's."""
    sch, rvs, blocks = root_blocks(func)
    if tuple(b.name_hint for b in blocks[:2]) != HEAD or (len(blocks) > 3 and not epilogues):
        return None
    deq, mm = blocks[:2]
    weight = deq.writes[0].source
    reads = [r.source for r in deq.reads]
    if weight.dtype != dtype:
        return None
    n, k = (static_int(d) for d in weight.shape)
    if n is None or k is None:
        return None
    v_n, v_k = (iv.var for iv in deq.iter_vars)
    found = weight_format(deq.body.value, reads, n, k, dtype, v_n, v_k, kinds)
    if found is None:
        return None
    kind, group, planes = found
    x = next((r.source for r in mm.reads if not r.source.same_as(weight)), None)
    sums = mm.writes[0].source
    if x is None or x.dtype != dtype or len(x.shape) != 3 or len(sums.shape) != 3:
        return None
    axis = 1 if rows_second and static_int(x.shape[0]) == 1 and static_int(x.shape[1]) != 1 else 0
    rows = x.shape[axis]
    if static_int(x.shape[1 - axis]) != 1 or static_int(x.shape[2]) != k:
        return None
    i0, i1, i2, vk = (iv.var for iv in mm.iter_vars)
    if not structural_equal(mm.body.value, sums[i0, i1, i2] + x[i0, i1, vk].astype(sums.dtype)
                            * weight[i2, vk].astype(sums.dtype)):
        return None
    out = sums
    if len(blocks) >= 3:
        cast = blocks[2]
        out = cast.writes[0].source
        c0, c1, c2 = (iv.var for iv in cast.iter_vars)
        if len(out.shape) != 3 or not structural_equal(cast.body.value, sums[c0, c1, c2].astype(out.dtype)):
            return None
    fixed = static_int(rows)
    same_rows = out.shape[axis].same_as(rows) or (fixed is not None and static_int(out.shape[axis]) == fixed)
    if not same_rows or static_int(out.shape[1 - axis]) != 1 or static_int(out.shape[2]) != n:
        return None
    if len(blocks) > 3:                                   # an epilogue after the cast
        found = epilogue_of(sch, rvs[3:], out, n, epilogues) if axis == 0 and n % 2 == 0 else None
        if found is None:
            return None
        name, out = found
        return DequantMatmul(kind, group, n, k, planes, x, sums, out, rows, name)
    return DequantMatmul(kind, group, n, k, planes, x, sums, out, rows)


def has_epilogue(func: tirx.PrimFunc) -> bool:
    """Whether `func` is dequantize -> NT_matmul -> a cast -> an EPILOGUES entry over the cast sums,
    whatever the weight's format (what only an epilogue-taking rule schedules whole)."""
    if not isinstance(func, tirx.PrimFunc):
        return False
    sch, rvs, blocks = root_blocks(func)
    if len(blocks) < 4 or tuple(b.name_hint for b in blocks[:2]) != HEAD or len(blocks[2].writes) != 1:
        return False
    sums = blocks[2].writes[0].source
    n = static_int(sums.shape[-1]) if len(sums.shape) == 3 else None
    return n is not None and n % 2 == 0 and epilogue_of(sch, rvs[3:], sums, n, tuple(EPILOGUES)) is not None


def root_blocks(func: tirx.PrimFunc):
    """(a Schedule of func, its root's child block RVs, those blocks)."""
    sch = s_tir.Schedule(func)
    rvs = sch.get_child_blocks(sch.get_sblock("root"))
    return sch, rvs, [sch.get(b) for b in rvs]


def epilogue_of(sch: s_tir.Schedule, rvs, sums, n: int, epilogues):
    """(name, output) where the blocks `rvs` after the cast, inlined into the last of them, compute
    one of `epilogues` (EPILOGUES) from the cast `sums` [rows, 1, n] into an output [rows, 1, n / 2];
    else None (`sch` is then changed: a copy for matching only)."""
    try:
        for rv in rvs[:-1]:
            sch.compute_inline(rv)
    except s_tir.ScheduleError:
        return None
    last = sch.get(rvs[-1])
    if len(last.iter_vars) != 3 or len(last.writes) != 1 or any(not r.source.same_as(sums) for r in last.reads) \
            or any(iv.iter_type != tirx.IterVar.DataPar for iv in last.iter_vars):
        return None
    out = last.writes[0].source
    v0, v1, v2 = (iv.var for iv in last.iter_vars)
    if len(out.shape) != 3 or static_int(out.shape[2]) != n // 2 or not structural_equal(out.shape[0], sums.shape[0]):
        return None
    name = next((e for e in epilogues if structural_equal(
        last.body.value, EPILOGUES[e](sums[v0, v1, v2], sums[v0, v1, v2 + n // 2]))), None)
    return None if name is None else (name, out)


def weight_format(value, reads: list, n: int, k: int, dtype: str, v_n, v_k, kinds=KINDS):
    """(kind, group, planes: codes, scale, min or None) if `value` (W[v_n, v_k] of an n x k weight, in
    `dtype`) is kiln's dequantize of one of `kinds` over the buffers `reads` (in the order the
    dequantize reads them), else None."""
    if not 1 <= len(reads) <= 3:
        return None
    planes = tuple(reads + [None, None])[:3]
    codes, scale, minimum = planes
    group = 0
    if scale is not None:
        groups = static_int(scale.shape[1]) if len(scale.shape) == 2 else None
        if not groups or k % groups or static_int(scale.shape[0]) != n:
            return None
        group = k // groups
        if minimum is not None and [static_int(d) for d in minimum.shape] != [n, groups]:
            return None
    kind = next((kind for kind in kinds
                 if _is_format(kind, group, dtype, value, planes, len(reads), v_n, v_k)), None)
    return None if kind is None else (kind, group, planes)


def param_order(func: tirx.PrimFunc, m: DequantMatmul, x: tirx.Buffer | None = None, more=()) -> list[int] | None:
    """For each of func's params, its place among the matched buffers in a kernel's order (codes,
    scale, min where the format has them, x, out, then `more`); None unless func's params are exactly
    those. `x`: the activations' buffer where func computes m.x itself (targets/norm_prologue.py)."""
    roles = [b for b in (*m.planes, m.x if x is None else x, m.out, *more) if b is not None]
    order = [next((i for i, b in enumerate(roles) if b.same_as(p)), None) for p in func.params]
    return None if None in order or sorted(order) != list(range(len(roles))) else order


def placed(kernel: tirx.PrimFunc, order: list[int]) -> tirx.PrimFunc:
    """`kernel` (params in a kernel's order) with its params where param_order says func has them."""
    return tirx.PrimFunc([kernel.params[i] for i in order], kernel.body, attrs=kernel.attrs)


def _is_format(kind: str, group: int, dtype: str, value, planes, count: int, v_n, v_k) -> bool:
    """Whether `value` is dequantize_element's for `kind` (either code form) over these planes (codes,
    scale, min; the first `count` present)."""
    if (kind in FLOAT_KINDS) != (group == 0) or (group and group % 8):
        return False
    codes, scale, minimum = planes
    fmt = QuantFormat(kind, group or 32, scale.dtype if scale is not None else dtype)
    if count != len(fmt.plane_names) or codes.dtype != fmt.planes(1, fmt.group_size)["qweight"][1]:
        return False
    return any(structural_equal(value, dequantize_element(fmt, dtype, codes, scale, minimum, v_n, v_k, by_bits))
               for by_bits in (False, True))
