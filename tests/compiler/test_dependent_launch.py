"""targets/dependent_launch.py: CUDA kernels launched as programmatic dependents (sm_90+).

Built here for cuda-sm90 (no GPU): every kernel of a model carries the launch tag and waits for the
kernel before it before anything else, the MMA GEMV after its first weight loads and before its
activations, and nvcc compiles the result. The GPU run is tests/numerics/test_cuda_variants.py.
"""

from __future__ import annotations

import re

import pytest
import tvm

from kiln.targets import get_profile
from kiln.targets.dependent_launch import LAUNCH_TAG, dependent_launch, kernels, places_wait, waiting_first
from kiln.targets.mma_gemv import MMAGEMV

from gpu_kernels import build, nvcc_compiles
from test_q4_gemv import _fused_q4_matmul

pytestmark = pytest.mark.compiler

WAIT, LAUNCH = "tvm_builtin_ptx_griddepcontrol_wait();", "tvm_builtin_ptx_griddepcontrol_launch_dependents();"


def kernel_bodies(source: str) -> dict[str, str]:
    """{kernel name: its body} of every __global__ function defined in CUDA `source`."""
    heads = list(re.finditer(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\([^)]*\) \{', source))
    return {m.group(1): source[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(source)]
            for i, m in enumerate(heads)}


def device_launch_tags(host: tvm.IRModule) -> dict[str, list[str]]:
    """{device kernel: its launch-parameter tags} after SplitHostDevice."""
    return {gv.name_hint: [str(t) for t in f.attrs["tirx.kernel_launch_params"]]
            for gv, f in host.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and int(f.attrs.get("calling_conv", 0)) == 2}


def test_every_kernel_of_a_model_waits_first(tiny_dirs):
    """The tiny Llama built for cuda-sm90 with dependent_launch: each of its kernels (matmul
    branches, norms, KV cache and attention kernels, sampling) is launched with the tag, and its
    first statements wait for the kernel before it and then let the next one launch (nvcc's build
    of the two instructions: the GEMV test below)."""
    built = build(tiny_dirs["tied"], "cuda-sm90", "q4f16", dependent_launch=True)
    tags = device_launch_tags(built.host)
    assert len(tags) > 20
    assert all(LAUNCH_TAG in t for t in tags.values()), [k for k, t in tags.items() if LAUNCH_TAG not in t]
    source = built.executable.mod.imports[0].imports[0].inspect_source()
    bodies = kernel_bodies(source)
    assert set(bodies) == set(tags)
    for name, body in bodies.items():
        code = [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith(
            ("alignas", "__shared__", "extern __shared__", "nvcuda::wmma::fragment", "uint4 ", "half "))]
        assert code[:2] == [WAIT, LAUNCH], (name, code[:3])


def test_the_gemv_streams_its_first_weights_before_it_waits(tmp_path):
    """An 8B projection (4096 x 4096, q4) dispatched on its rows: the MMA GEMV's 1- and 8-row kernels
    load their first weights and scales, then wait (once, in the first iteration), then load the
    activations; the tiled branch waits first; all three are launched with the tag."""
    from tvm.s_tir import dlight as dl

    from kiln.targets.gpu import FirstOf, Matmul, OneRowGEMV
    from kiln.targets.row_dispatch import dispatch_on_rows
    profile = get_profile("cuda-sm90")
    func = _fused_q4_matmul(4096, 4096)
    with profile.tvm_target():
        target = tvm.target.Target.current()
        one = OneRowGEMV(MMAGEMV(4, pdl=True)).apply(func, target, False)
        eight = FirstOf(MMAGEMV(4, batch=8, pdl=True), dl.gpu.LowBatchGEMV(8)).apply(func, target, False)
        tiled = Matmul().apply(func, target, False).mod["main"]
        merged = dispatch_on_rows(func, [(1, one), (8, eight)], tiled, thread_invariant=True)
        assert [places_wait(k) for k in kernels(merged.body)] == [True, True, False]
        mod = dependent_launch(tvm.IRModule({"gemv": merged.with_attr("tirx.is_scheduled", True)
                                                     .with_attr("global_symbol", "gemv")}))
    assert [places_wait(k) for k in kernels(mod["gemv"].body)] == [True, True, True]
    lib = tvm.compile(mod, target=profile.tvm_target())
    source = lib.mod.imports[0].inspect_source()
    bodies = kernel_bodies(source)
    assert len(bodies) == 3
    for name in ("gemv_kernel", "gemv_kernel_1"):                  # the MMA GEMV at 1 and up to 8 rows
        body = bodies[name]
        assert body.count(WAIT) == 1 and "if (it == 0) {" in body[:body.index(WAIT)]
        assert body.index("qweight_ptr + ") < body.index("scale_ptr[") < body.index(WAIT) < body.index(LAUNCH)
        assert body.index(LAUNCH) < body.index("x_ptr + ") and "mma.sync" in body[body.index(LAUNCH):]
    tiled = bodies["gemv_kernel_2"]
    assert [line.strip() for line in tiled.splitlines() if "griddepcontrol" in line] == [WAIT, LAUNCH]
    assert tiled.index(LAUNCH) < min(tiled.index("qweight_ptr"), tiled.index("x_ptr"))
    nvcc_compiles(source, tmp_path)


def test_only_where_the_device_has_it():
    """griddepcontrol needs sm_90: the pass refuses an sm_80 target in one line, and the MMA GEMV
    asked for it there builds without it. A function holding no kernel is left as it is."""
    from kiln.targets.row_dispatch import one_row
    sm80 = get_profile("cuda").tvm_target()
    with sm80, pytest.raises(ValueError, match="sm_90 or newer"):
        dependent_launch(tvm.IRModule({"f": _fused_q4_matmul(256, 512)}))
    gemv = MMAGEMV(pdl=True).apply(one_row(_fused_q4_matmul(256, 512)), sm80, False)
    assert not places_wait(gemv.mod["main"].body)
    gemv90 = MMAGEMV(pdl=True).apply(one_row(_fused_q4_matmul(256, 512)), get_profile("cuda-sm90").tvm_target(), False)
    assert places_wait(gemv90.mod["main"].body)
    host = _fused_q4_matmul(256, 512)                              # unscheduled: no thread-bound loop
    assert waiting_first(host).same_as(host)


def test_before_after():
    """TVMScript Before/After: the wait and the launch of dependents first in the kernel, the launch
    tag on the function; a kernel that places its own wait is left as it is."""
    from tvm.script import tirx as T

    @T.prim_func(private=True)
    def before(A: T.Buffer((256,), "float32"), B: T.Buffer((256,), "float32")):
        for bx in T.thread_binding(2, thread="blockIdx.x"):
            for tx in T.thread_binding(128, thread="threadIdx.x"):
                B[bx * 128 + tx] = A[bx * 128 + tx] * T.float32(2)

    @T.prim_func(private=True)
    def after(A: T.Buffer((256,), "float32"), B: T.Buffer((256,), "float32")):
        T.func_attr({"tirx.kernel_launch_params": [LAUNCH_TAG]})
        for bx in T.thread_binding(2, thread="blockIdx.x"):
            T.evaluate(T.ptx.griddepcontrol.wait())
            T.evaluate(T.ptx.griddepcontrol.launch_dependents())
            for tx in T.thread_binding(128, thread="threadIdx.x"):
                B[bx * 128 + tx] = A[bx * 128 + tx] * T.float32(2)

    @T.prim_func(private=True)
    def own_wait(A: T.Buffer((256,), "float32"), B: T.Buffer((256,), "float32")):
        for bx in T.thread_binding(2, thread="blockIdx.x"):
            for tx in T.thread_binding(128, thread="threadIdx.x"):
                T.evaluate(T.ptx.griddepcontrol.wait())
                B[bx * 128 + tx] = A[bx * 128 + tx] * T.float32(2)

    tvm.ir.assert_structural_equal(waiting_first(before), after)
    tvm.ir.assert_structural_equal(waiting_first(own_wait), own_wait.with_attr("tirx.kernel_launch_params",
                                                                               [LAUNCH_TAG]))
