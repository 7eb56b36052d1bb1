"""Kernels that pick their schedule by the rows they are called with, inside the kernel.

A matmul over a symbolic row count (``batch_size`` in batch_decode, ``seq_len`` in prefill) runs
at 1 row and at thousands. One schedule cannot serve both: a tiled matmul wastes a decode step's
bandwidth, a GEMV wastes a prefill's arithmetic. Scheduled twice (or more) from the same
PrimFunc, the schedules' bodies become the branches of one body::

    if rows <= 2: <GEMV for 2 rows> elif rows <= 8: <GEMV for 4-row buckets> else: <matmul>

The branch sits at the top of the PrimFunc, outside every loop: on a GPU it is host code picking
which kernel to launch; on a CPU, one compare per call. Used by the CPU's low-batch GEMV copies
(targets/cpu/low_batch_gemv.py) and the GPU's (targets/gpu.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import tvm
from tvm import s_tir, tirx


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


def is_scheduled(func: tirx.PrimFunc) -> bool:
    return func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False))


def same_params(a: tirx.PrimFunc, b: tirx.PrimFunc) -> bool:
    """Both were scheduled from one function (schedules keep its param vars), so bodies swap."""
    return len(a.params) == len(b.params) and all(p.same_as(q) for p, q in zip(a.params, b.params))


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
    root = s_tir.SBlock([], [], [], "root", body)
    merged = func.with_body(s_tir.SBlockRealize([], True, root))
    # The bodies were scheduled from one function, so they define the same loop and block vars;
    # ConvertSSA gives each its own.
    gv = tvm.ir.GlobalVar("main")
    return s_tir.transform.ConvertSSA()(tvm.IRModule({gv: merged}))[gv]
