"""Kernels that pick their schedule by the rows they are called with, inside the kernel.

A matmul over a symbolic row count (``batch_size`` in batch_decode, ``seq_len`` in prefill) runs
at 1 row and at thousands. One schedule cannot serve both: a tiled matmul wastes a decode step's
bandwidth, a GEMV wastes a prefill's arithmetic. Scheduled twice (or more) from the same
PrimFunc, the schedules' bodies become the branches of one body::

    if rows <= 1: <GEMV for 1 row> elif rows <= 4: <GEMV for 4 rows> else: <matmul>

The branch sits at the top of the PrimFunc, outside every loop: on a GPU it is host code picking
which kernel to launch; on a CPU, one compare per call. Used by the CPU's low-batch GEMV copies
(targets/cpu/low_batch_gemv.py) and the GPU's (targets/gpu.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import tvm
from tvm import ir, s_tir, tirx

from .workspace_outputs import WORKSPACE_ATTR, workspace_count


def output_rows(func: tirx.PrimFunc) -> tirx.PrimExpr | None:
    """The product of all dims but the last of ``func``'s output (its last param), if symbolic."""
    if not func.params or getattr(func.params[-1], "shape", None) is None:
        return None
    shape = list(func.params[-1].shape)
    if len(shape) < 2 or is_static(shape[:-1]):
        return None
    rows = shape[0]
    for dim in shape[1:-1]:
        rows = rows * dim
    return rows


def is_static(shape) -> bool:
    return all(isinstance(d, tirx.IntImm) for d in shape)


def static_int(dim) -> int | None:
    """A dimension's or loop extent's value when it is a constant, else None."""
    return int(dim) if isinstance(dim, (int, tirx.IntImm)) else None


def is_scheduled(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False))


def same_params(a: tirx.PrimFunc, b: tirx.PrimFunc) -> bool:
    """Both were scheduled from one function (schedules keep its param vars), so bodies swap; `b`
    may add workspace parameters after them (targets/workspace_outputs.py)."""
    extra = workspace_count(b) - workspace_count(a)
    return (len(a.params) + extra == len(b.params) and extra >= 0
            and all(p.same_as(q) for p, q in zip(a.params, b.params)))


def dispatch_on_rows(func: tirx.PrimFunc, branches: Sequence[tuple[int, tirx.PrimFunc]],
                     otherwise: tirx.PrimFunc, thread_invariant: bool = False) -> tirx.PrimFunc:
    """``func`` whose body runs the first of ``branches`` (max rows, scheduled copy) whose bound
    covers the call's rows, else ``otherwise``'s body. Every function given shares ``func``'s params.

    ``thread_invariant`` (GPU kernels): the condition is marked the same for every thread, without
    which TVM's ThreadSync refuses the barriers inside the branches ("Cannot insert syncs inside
    condition")."""
    rows = output_rows(func)
    if rows is None:
        raise ValueError("dispatch_on_rows: the function's output rows are static")
    if not all(same_params(func, f) for f in (otherwise, *(copy for _, copy in branches))):
        raise ValueError("dispatch_on_rows: the schedules do not share the function's params")
    body = otherwise.body
    for max_rows, copy in reversed(list(branches)):
        cond = rows <= max_rows
        body = tirx.IfThenElse(tirx.op.tvm_thread_invariant(cond) if thread_invariant else cond, copy.body, body)
    root = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "root", body))
    # Workspace parameters of any schedule follow the function's own (targets/workspace_outputs.py).
    workspace = [p for f in (*(copy for _, copy in branches), otherwise)
                 for p in f.params[len(func.params):]]
    merged = func.with_body(root)
    if workspace:
        merged = tirx.PrimFunc([*func.params, *workspace], root, func.ret_type, func.attrs)
        merged = merged.with_attr(WORKSPACE_ATTR, len(workspace))
    # The bodies were scheduled from one function, so they define the same loop and block vars.
    return own_vars(merged)


def shares_allocations(func: tirx.PrimFunc, copy: tirx.PrimFunc) -> bool:
    """Whether ``copy`` (a copy of ``func`` scheduled apart) still holds a buffer ``func`` allocates,
    the same object: one body cannot define it in two branches (CompactBufferRegion: "duplicate
    definitions"). A fused epilogue's intermediate that neither schedule inlined stays shared so
    (Qwen2-MoE's sigmoid-gated shared expert)."""
    accessed = tvm.get_global_func("s_tir.analysis.detect_buffer_access_lca")
    ours = [b for b in accessed(func).keys() if not any(b.same_as(p) for p in func.params)]
    theirs = accessed(copy).keys()
    return any(b.same_as(c) for b in ours for c in theirs)


def own_vars(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every loop and block var defined once (ConvertSSA, through a throwaway module):
    for a body holding copies of one schedule's statements (branches, twins)."""
    gv = tvm.ir.GlobalVar("main")
    return s_tir.transform.ConvertSSA()(tvm.IRModule({gv: func}))[gv]


def _unit_dims_moved(bound: tirx.Buffer, original: tirx.Buffer) -> bool:
    """Whether `bound` is dense `original` (no strides, offset 0) with only its unit dims moved."""
    def sizes(buf):
        return [d for d in buf.shape if static_int(d) != 1]
    if list(original.strides) or static_int(original.elem_offset) != 0 or static_int(bound.elem_offset) != 0:
        return False
    if bound.dtype != original.dtype or len(sizes(bound)) != len(sizes(original)):
        return False
    if len(bound.shape) == len(original.shape) and all(
            a.same_as(b) or static_int(a) == static_int(b) is not None for a, b in zip(bound.shape, original.shape)):
        return False        # the same shape: a region of the original
    return all(a.same_as(b) or (static_int(a) is not None and static_int(a) == static_int(b))
               for a, b in zip(sizes(bound), sizes(original)))


def one_row(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with its row count bound to 1, its buffers static in the rows (rules that only take
    a static row apply: dlight's GEMV); None unless the output's rows are one symbolic size."""
    out = func.params[-1]
    dims = [d for d in out.shape[:-1] if not isinstance(d, tirx.IntImm)]
    if len(dims) != 1 or not isinstance(dims[0], tirx.Var) or list(out.strides):
        return None
    one = tirx.IntImm(str(dims[0].ty.dtype), 1)
    shape = [one if d.same_as(dims[0]) else d for d in out.shape]
    # Every other field is the original's own object: specialize binds only what differs.
    bound = tirx.decl_buffer(shape, out.dtype, name=out.name, elem_offset=out.elem_offset, strides=out.strides)
    return func.specialize({out: bound})


def over_params(func: tirx.PrimFunc, scheduled: tirx.PrimFunc, name: str = "one_row") -> tirx.PrimFunc | None:
    """``scheduled`` (a schedule of ``one_row(func)``) as a body over ``func``'s own params, so that
    it can be a branch of dispatch_on_rows: each buffer the binding replaced is declared a
    match_buffer view of the original's first row (TVM's LowerMatchBuffer maps its accesses back).
    None where a replaced buffer has a symbolic offset or strides (a view the match cannot express).
    A replaced buffer whose shape is the original's with its unit dims moved ([rows, 1, K] for
    [1, rows, K]: the same memory, which no region of the original is) is declared over the
    original's data instead (a DeclBuffer). `name`: the view block's."""
    matches, views = [], []
    for bound, original in zip(scheduled.params, func.params):
        if bound.same_as(original):
            continue
        if getattr(bound, "shape", None) is None or list(bound.strides) or not isinstance(bound.elem_offset, tirx.IntImm):
            return None
        if _unit_dims_moved(bound, original):
            views.append(tirx.DeclBuffer(bound, data=original.data))
            continue
        region = [ir.Range.from_min_extent(tirx.IntImm(str(d.ty.dtype), 0), d) for d in bound.shape]
        matches.append(s_tir.MatchBufferRegion(bound, tirx.BufferRegion(original, region)))
    body = tirx.SeqStmt([*views, scheduled.body]) if views else scheduled.body
    view = s_tir.SBlock([], [], [], name, body, match_buffers=matches)
    return func.with_body(s_tir.SBlockRealize([], True, view))
