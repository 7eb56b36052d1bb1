"""Parallel loops over little work run on the calling thread: the launch costs more than the loop.

LLVM's CPU codegen turns every `parallel` loop into TVMBackendParallelLaunch: the pool's workers
woken, the range split, a barrier at the end, a few microseconds whatever the loop does. A decode
step at batch 1 calls ~10 kernels a layer, most of them a few hundred vector operations long: on 2 znver4 cores
(2026-11-30, `kiln bench --profile`, SmolLM2) the residual add + RMSNorm over 576 floats took 3.6 us
a call with 2 threads and 1.7 with 1, the SiLU * up over 1,536 4.9 against 1.7, the float16 KV
cache's casts 3.5 against 1.1.

SerialSmallLoops gives each parallel loop whose body does a static amount of work (its loops'
extents constant; the parallel loop's own may be symbolic, the batch) a serial twin:

    if extent * work < SERIAL_WORK: <the loop, serial> else: <the loop, parallel>

`work` counts the stores the body executes, a vectorised loop's lanes each one. A loop whose
extent is static gets the one it takes. Loops over a symbolic amount of work (attention over the
context, the GEMVs' row blocks) or whose blocks allocate buffers stay as scheduled. Runs at finalize:
lower's RewriteDataflowReshape must still see reshape kernels as reshapes (twinned, each became a
copy kernel a call).

SmolLM2 Q4_1 on 2 znver4 cores, batch-1 decode after 64 tokens, three alternating rounds: 207 / 217 /
192 tok/s against 198 / 209 / 186 (float16 KV cache: 214 / 218 / 197 against 210 / 210 / 183); 4
sequences 401 / 409 / 389 against 397 / 398 / 333; 16 and 32 sequences and prefill level within the
noise.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ..row_dispatch import own_vars, static_int

# Stores below which a parallel loop runs serially. 2 znver4 cores, kernels alone in a loop (the
# workers spinning, a launch ~0.8 us): an add over 18,432 floats took 1.8 us parallel, 2.0 serial;
# an RMSNorm over 16 rows of 576 (18,432 stores) 1.5 and 1.4. Inside a decode step a launch costs more.
SERIAL_WORK = 16384


def body_work(stmt: tirx.Stmt) -> int | None:
    """The stores `stmt` executes (an if's larger branch), or None where a loop's extent is not static."""
    if isinstance(stmt, tirx.For):
        extent, inner = static_int(stmt.extent), body_work(stmt.body)
        return None if extent is None or inner is None else extent * inner
    if isinstance(stmt, tirx.SeqStmt):
        parts = [body_work(s) for s in stmt.seq]
        return None if None in parts else sum(parts)
    if isinstance(stmt, tirx.IfThenElse):
        parts = [body_work(s) for s in (stmt.then_case, stmt.else_case) if s is not None]
        return None if None in parts else max(parts)
    if isinstance(stmt, s_tir.SBlockRealize):
        return body_work(stmt.block)
    if isinstance(stmt, s_tir.SBlock):
        if stmt.alloc_buffers or stmt.match_buffers:
            return None                        # a twin would define them again (CompactBufferRegion refuses)
        parts = [body_work(s) for s in (stmt.init, stmt.body) if s is not None]
        return None if None in parts else sum(parts)
    if isinstance(stmt, tirx.While):
        return None
    body = getattr(stmt, "body", None)         # AttrStmt, DeclBuffer, AllocBuffer (kiln's fused_rope), ...
    return body_work(body) if isinstance(body, tirx.Stmt) else 1


def _at_one(extent: tirx.PrimExpr) -> int:
    """A symbolic extent's value with each of its variables (the batch, the tokens) 1. A twin taken
    only below it would be taken only by empty calls, and simplified under its condition it can
    divide by zero: (batch + 1) // 2 * 16 * 1,040 < 16,384 makes (batch + 1) // 2 zero, a divisor."""
    analyzer = tvm.sym.Analyzer()
    found = []
    tvm_ffi.structural_visit(extent, (tirx.Var, lambda var, _visitor: found.append(var)))
    for var in set(found):
        analyzer.bind(var, tirx.IntImm(var.ty.dtype, 1))
    return static_int(analyzer.simplify(extent)) or 0


def serial_when_small(func: tirx.PrimFunc, limit: int = SERIAL_WORK) -> tirx.PrimFunc:
    """`func` with each parallel loop over static work given its serial twin (module docstring)."""
    twins = []

    def rewrite(loop, mutator):
        if loop.kind != tirx.ForKind.PARALLEL:
            return mutator.default_mutate(loop)
        work = body_work(loop.body)
        if work is None or work >= limit:
            return loop
        serial = tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body,
                          loop.thread_binding, loop.annotations)
        extent = static_int(loop.extent)
        if extent is not None:
            return serial if extent * work < limit else loop
        if _at_one(loop.extent) * work >= limit:
            return loop                        # no call with rows would take the twin
        twins.append(loop)
        dtype = loop.extent.ty.dtype
        return tirx.IfThenElse(loop.extent * tirx.IntImm(dtype, work) < tirx.IntImm(dtype, limit), serial, loop)

    body = tvm_ffi.structural_mutate(func.body, (tirx.For, rewrite))
    if body.same_as(func.body):
        return func
    func = func.with_body(body)
    if not twins:
        return func
    return own_vars(func)                      # a twin defines the same loop and block vars as its loop


@tvm.transform.module_pass(opt_level=0, name="kiln.SerialSmallLoops")
def serial_small_loops(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """serial_when_small on every PrimFunc of the module."""
    out = tvm.IRModule(attrs=mod.attrs, global_infos=mod.global_infos)
    for gv, func in mod.functions_items():
        out[gv] = serial_when_small(func) if isinstance(func, tirx.PrimFunc) else func
    return out
