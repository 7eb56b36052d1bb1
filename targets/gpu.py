"""What every GPU family shares: dlight's GPU schedule rules, and the passes a GPU profile adds.

CUDA, ROCm, Metal, OpenCL and WebGPU take the same rule list; each family module only sets its
TVM target (warp size, shared memory, thread limits), its host and its export format, and dlight
sizes its schedules from those limits.
"""

from __future__ import annotations

from unittest import mock

import tvm
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.gpu import matmul as _dlight_matmul


@tvm.transform.module_pass(opt_level=0, name="kiln.NoTensorCores")
def no_tensor_cores(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Mark every PrimFunc `dlight.do_not_tensorize`.

    In apache-tvm 0.27.0.post1, dlight's tensor-core matmul path (MatmulTensorization, taken for
    float16 on sm_70+) segfaults inside s_tir Tensorize on SmolLM2's NT matmuls, killing the
    process. The SIMT matmul schedule builds; remove this once the crash is fixed upstream.
    """
    out = tvm.IRModule(attrs=mod.attrs)
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            func = func.with_attr("dlight.do_not_tensorize", True)
        out[gv] = func
    return out


def _no_simdgroup(*_args, **_kwargs):
    raise NotImplementedError("simdgroup matmul disabled")


class Matmul(dl.gpu.Matmul):
    """dlight's GPU matmul, without its Metal simdgroup path.

    On a Metal target dl.gpu.Matmul first tries MetalMatmul (simdgroup_multiply_accumulate through
    s_tir Tensorize), which in apache-tvm 0.27.0.post1 segfaults on the tiny Llama's matmuls as the
    CUDA tensor-core path does; when that rule raises, dl.gpu.Matmul falls back to its SIMT schedule.
    Remove once Tensorize is fixed upstream.
    """

    def apply(self, func, target, tunable):
        if target.kind.name != "metal":
            return super().apply(func, target, tunable)
        with mock.patch.object(_dlight_matmul.MetalMatmul, "apply", _no_simdgroup):
            return super().apply(func, target, tunable)


def gpu_schedule_rules() -> list:
    """dlight's GPU rules, most specific first."""
    return [Matmul(), dl.gpu.GEMV(), dl.gpu.LowBatchGEMV(), dl.gpu.Reduction(),
            dl.gpu.GeneralReduction(), dl.gpu.Fallback()]


def gpu_phase_passes(profile, phase: str) -> list:
    """A GPU profile's additions to the pipeline phases (compiler/pipeline.py)."""
    if phase == "schedule":
        return [no_tensor_cores, dl.ApplyDefaultSchedule(*gpu_schedule_rules())]
    return []


@tvm.transform.module_pass(opt_level=0, name="kiln.RewriteCUDAGraph")
def rewrite_cuda_graph(mod: tvm.IRModule, ctx) -> tvm.IRModule:
    """TVM's RewriteCUDAGraph, switched on: alone it does nothing unless the PassContext sets
    `relax.backend.use_cuda_graph`. It captures the regions whose memory is planned statically
    (compiler/spec.py bound_shapes); batch_decode's once per batch size."""
    for gv, func in list(mod.functions_items()):
        if gv.name_hint == "batch_decode" and isinstance(func, tvm.relax.Function):
            mod[gv] = func.with_attr("relax.rewrite_cuda_graph.capture_symbolic_vars", ["batch_size"])
    config = {**ctx.config, "relax.backend.use_cuda_graph": True}
    with tvm.transform.PassContext(opt_level=ctx.opt_level, config=config):
        return tvm.relax.transform.RewriteCUDAGraph()(mod)


def cuda_graph_phase_passes(profile, phase: str) -> list:
    """gpu_phase_passes, plus decode captured as CUDA graphs where the runtime supports them."""
    if phase == "finalize":
        return [rewrite_cuda_graph]
    return gpu_phase_passes(profile, phase)
