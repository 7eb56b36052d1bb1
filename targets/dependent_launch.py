"""Programmatic dependent launch (CUDA sm_90+): each kernel of a step may start before the one
before it has finished, and wait for it on the device.

Why: at batch 1 an 8B decode step is ~10 kernels a layer, most of them a few microseconds long,
and each GEMV pays a fixed ~2-3 us beyond its bytes (H200, 2026-11-28: the 4-bit calls took 1.2-1.3x
the time for twice the bytes): the launch, and the first loads' round trip to memory, which no
other kernel overlaps. Launched with CUDA's programmatic stream serialization (TVM's launch tag
`tirx.use_programtic_dependent_launch`, TVM's spelling), a kernel's blocks may become resident
while the previous kernel still runs, once every block of that one has executed
`griddepcontrol.launch_dependents`; `griddepcontrol.wait` then blocks until the previous kernel
has completed and its writes are visible. A kernel that waits before it reads or writes anything
another kernel touches computes what it did before; the MMA GEMV (targets/mma_gemv.py, `pdl`)
loads its first weights (constants, written by no kernel) before it waits.

DependentLaunch tags every PrimFunc holding a CUDA kernel and, in each kernel (a loop bound to a
thread axis, outside any other) that does not place its own wait, adds `wait` then
`launch_dependents` before anything else: every thread waits before it reads, and the next kernel
may launch once this one runs (so at most one kernel ahead waits resident). A kernel that places
its own wait must reach it on every thread before any access to memory another kernel writes.
Kernels not launched this way (TVM's builtins, the library GEMM's cuBLAS calls) are ordered as
before: programmatic serialization only relaxes a kernel's dependency on the kernel just before
it, and a waiting kernel's completion implies its predecessor's.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.script import tirx as T

LAUNCH_TAG = "tirx.use_programtic_dependent_launch"     # TVM 0.27's launch-parameter tag, as spelled there
_GRIDDEP = "tirx.ptx.griddepcontrol"


def _is_thread_loop(stmt) -> bool:
    return isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.THREAD_BINDING


def places_wait(stmt) -> bool:
    """Whether `stmt` holds a griddepcontrol.wait."""
    found = []

    def visit(call):
        if isinstance(call.op, tvm.ir.Op) and call.op.name == _GRIDDEP and str(call.args[0].value) == "wait":
            found.append(call)
    tvm_ffi.structural_walk(stmt, (tvm.ir.Call, visit))
    return bool(found)


def kernels(stmt) -> list:
    """The outermost thread-bound loops of `stmt`: one a kernel."""
    found = []

    def visit(value, visitor):
        if _is_thread_loop(value):
            found.append(value)
            return None                                     # a kernel's inner loops are not kernels
        return visitor.default_visit(value)
    tvm_ffi.structural_visit(stmt, (tirx.For, visit))
    return found


def waiting_first(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with `wait` and `launch_dependents` first in each of its kernels that places no wait
    itself, tagged for programmatic dependent launch; unchanged if it holds no kernel."""
    if not kernels(func.body):
        return func
    head = [tirx.Evaluate(T.ptx.griddepcontrol.wait()), tirx.Evaluate(T.ptx.griddepcontrol.launch_dependents())]

    def rewrite(loop, mutator):
        if not _is_thread_loop(loop):
            return mutator.default_mutate(loop)
        if places_wait(loop.body):
            return loop
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, tirx.SeqStmt([*head, loop.body]),
                        loop.thread_binding, loop.annotations)
    body = tvm_ffi.structural_mutate(func.body, (tirx.For, rewrite))
    tags = [str(t) for t in (func.attrs or {}).get("tirx.kernel_launch_params", [])]
    return func.with_body(body).with_attr("tirx.kernel_launch_params",
                                          tags if LAUNCH_TAG in tags else [*tags, LAUNCH_TAG])


def supports(target: tvm.target.Target) -> bool:
    """griddepcontrol and the launch attribute need CUDA sm_90 or newer."""
    arch = str(target.attrs.get("arch", "")) if target.kind.name == "cuda" else ""
    return arch.startswith("sm_") and int("".join(c for c in arch[3:] if c.isdigit()) or 0) >= 90


@tvm.transform.module_pass(opt_level=0, name="kiln.DependentLaunch")
def dependent_launch(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """waiting_first on every PrimFunc of the module (CUDA sm_90+; a ValueError elsewhere)."""
    target = tvm.target.Target.current(allow_none=False)
    if not supports(target):
        raise ValueError(f"programmatic dependent launch needs CUDA sm_90 or newer, not {target.kind.name} "
                         f"{target.attrs.get('arch', '')}: build without dependent_launch")
    out = tvm.IRModule(attrs=mod.attrs, global_infos=mod.global_infos)
    for gv, func in mod.functions_items():
        out[gv] = waiting_first(func) if isinstance(func, tirx.PrimFunc) else func
    return out


__all__ = ["LAUNCH_TAG", "dependent_launch", "kernels", "places_wait", "supports", "waiting_first"]
