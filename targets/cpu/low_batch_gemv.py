"""LowBatchGEMV: matmuls over a symbolic row count also get a GEMV kernel, taken when rows <= R.

Two module passes, on either side of the schedule phase:

``LowBatchGEMV(max_rows=R)`` (end of legalize, after FuseOps/FuseTIR) matches every PrimFunc
whose one reduction block is an NT matmul ``C[.., j] += A[.., k] * B[j, k]`` (A and B params
both indexed by k last; B, the weight, of static shape; A with a symbolic dim) plus any fused
spatial epilogue, with one output whose rows (all dims but the last: ``batch`` in
decode, ``seq_len`` in prefill) are symbolic.  For each such ``f`` it adds a copy ``f_gemv``
tagged ``"kiln.gemv": R``, which the target's schedule rule lays out as a GEMV, and tags ``f``
with ``"kiln.gemv_copy": "f_gemv"``.  The copy shares ``f``'s param vars, so its scheduled body
drops into ``f`` as is.  Relax call sites are untouched.

``DispatchLowBatchGEMV()`` (start of lower, after scheduling) folds each scheduled copy back into
its original: ``f``'s body becomes ``if rows <= R: <f_gemv body> else: <f body>``
(targets/row_dispatch.py) and ``f_gemv`` leaves the module.  A copy the target did not
schedule, or whose schedule kept an intermediate buffer of ``f``'s (row_dispatch.shares_allocations),
is dropped and ``f`` left as it was.

Why the dispatch sits inside the kernel and not in Relax: a Relax ``If`` per call site (tried
first) cannot live in a dataflow block, and StaticPlanBlockMemory does not plan across its
branches: SmolLM2's batch_decode went from 7 storage allocations to 366, plus a PrimValue
computation and half a dozen VM instructions per call site.  The branch inside the PrimFunc
costs one compare per call (MLC-LLM's LowBatchGemvSpecialize does the same on GPUs).

Why it pays: the general CPU matmul pads the rows to its 2-row register tile and reads A
through ``A[i] if i < m else 0`` in its inner loop; for 1-4 rows a plain one-row tile over 6
weight rows is faster (rows and column tiles form one parallel loop; each weight tile stays in
L1 while the rows pass).  Kernel timings on SmolLM2's qkv/o/gate_up/down/lm_head shapes (cold
weights, 2 threads, min of 25): 5-15% faster at 1 row, 25-35% at 4 rows.

Measured on SmolLM2-135M q0f32, 2-core znver5 shared with other jobs (four artifacts compiled
back to back, decode steps after a 128-token prompt, 12 interleaved rounds, per-round time
ratio with/without, median [IQR]): decode batch 1 0.86 [0.84-0.90] (11.96 -> 10.71 ms/step
best), batch 4 0.81 [0.80-0.84] (23.5 -> 19.2 ms/step best), prefill 128 0.99 (unchanged: 128
rows take the tiled matmul).  Compile time: 12 more kernels to schedule and build, within the
noise of a ~12 s compile.  On by default for CPU targets.
"""

from __future__ import annotations

import tvm
from tvm import relax, s_tir, tirx

from ..row_dispatch import dispatch_on_rows, is_scheduled, is_static, output_rows, same_params, shares_allocations

GEMV_ATTR = "kiln.gemv"        # on the copy: the row bound R (read by the schedule rule)
COPY_ATTR = "kiln.gemv_copy"   # on the original: the copy's name (read by DispatchLowBatchGEMV)
_REDUCE = tirx.IterVar.CommReduce


@tvm.transform.module_pass(opt_level=0, name="LowBatchGEMV")
class LowBatchGEMV:
    """Add a ``"kiln.gemv"`` copy of every NT matmul over symbolic rows (see the module docstring)."""

    def __init__(self, max_rows: int = 4) -> None:
        if max_rows < 1:
            raise ValueError(f"LowBatchGEMV: max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        builder = relax.BlockBuilder(mod)
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and output_rows(func) is not None and is_nt_matmul(func):
                name = builder.add_func(func.with_attr(GEMV_ATTR, self.max_rows), f"{gv.name_hint}_gemv").name_hint
                builder.update_func(gv, func.with_attr(COPY_ATTR, name))
        return builder.get()


@tvm.transform.module_pass(opt_level=0, name="DispatchLowBatchGEMV")
class DispatchLowBatchGEMV:
    """Fold each scheduled ``"kiln.gemv"`` copy into its original behind ``if rows <= R``."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        funcs = dict(mod.functions_items())
        copy_names = {_copy_name(f) for f in funcs.values()} - {None}
        if not copy_names:
            return mod
        out = {}
        for gv, func in funcs.items():
            if gv.name_hint in copy_names:
                continue  # folded into its original below, or dropped
            if _copy_name(func):
                copy = funcs[mod.get_global_var(_copy_name(func))]
                func = func.without_attr(COPY_ATTR)
                if is_scheduled(func) and is_scheduled(copy) and same_params(func, copy) \
                        and not shares_allocations(func, copy):
                    func = dispatch_on_rows(func, [(int(copy.attrs[GEMV_ATTR]), copy)], func)
            out[gv] = func
        return tvm.IRModule(out, attrs=mod.attrs, global_infos=mod.global_infos)


def is_nt_matmul(func: tirx.PrimFunc) -> bool:
    """Whether ``func``'s only reduction is ``C[.., j] += A[.., k] * B[j, k]`` over params A and
    B, B static and A with a symbolic dim (its other blocks all spatial)."""
    if func.attrs is not None and (func.attrs.get("tirx.is_scheduled", False) or GEMV_ATTR in func.attrs):
        return False
    try:
        sch = s_tir.Schedule(func)
        blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    except (RuntimeError, ValueError):
        return False  # opaque or hand-written functions (attention kernels, ...)
    reductions = [b for b in blocks if any(iv.iter_type == _REDUCE for iv in b.iter_vars)]
    if len(reductions) != 1:
        return False
    block = reductions[0]
    reduce_vars = [iv.var for iv in block.iter_vars if iv.iter_type == _REDUCE]
    if len(reduce_vars) != 1 or len(block.reads) != 2 or len(block.writes) != 1:
        return False
    a, b = block.reads
    if not all(r.region[-1].min.same_as(reduce_vars[0]) for r in (a, b)):
        return False
    # Both operands read straight from params: a dequantize prologue (quantized weights) is left
    # to its own rule, which dispatches on the rows itself (quant_schedule.py).
    if not all(any(r.source.same_as(p) for p in func.params) for r in (a, b)):
        return False
    return is_static(b.source.shape) and not is_static(a.source.shape)


def _copy_name(func) -> str | None:
    attrs = func.attrs if isinstance(func, tirx.PrimFunc) else None
    return str(attrs[COPY_ATTR]) if attrs is not None and COPY_ATTR in attrs else None
