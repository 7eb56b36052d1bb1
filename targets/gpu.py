"""What every GPU family shares: dlight's GPU schedule rules, and the passes a GPU profile adds.

CUDA, ROCm (and Metal, WebGPU, OpenCL when they come) take the same rule list; each family
module only sets its TVM target (warp size, shared memory, thread limits) and export format.
"""

from __future__ import annotations

import tvm


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


def gpu_schedule_rules() -> list:
    """dlight's GPU rules, most specific first."""
    from tvm.s_tir import dlight as dl
    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.LowBatchGEMV(), dl.gpu.Reduction(),
            dl.gpu.GeneralReduction(), dl.gpu.Fallback()]


def gpu_phase_passes(profile, phase: str) -> list:
    """A GPU profile's additions to the pipeline phases (compiler/pipeline.py)."""
    from tvm.s_tir import dlight as dl
    if phase == "schedule":
        return [no_tensor_cores, dl.ApplyDefaultSchedule(*gpu_schedule_rules())]
    return []


def cuda_graph_phase_passes(profile, phase: str) -> list:
    """gpu_phase_passes, plus decode captured as CUDA graphs where the runtime supports them."""
    if phase == "finalize":
        return [tvm.relax.transform.RewriteCUDAGraph()]
    return gpu_phase_passes(profile, phase)
