"""NVIDIA GPUs through TVM's CUDA codegen, scheduled with dlight's GPU rules."""

from __future__ import annotations

import tvm

from .profile import TargetProfile

# Shared memory per block TVM may use (KB * 1024); set explicitly to avoid TVM's 48 KB guess.
_SMEM = {"sm_80": 166912, "sm_86": 101376, "sm_89": 101376, "sm_90": 232448}


@tvm.transform.module_pass(opt_level=0, name="kiln.NoTensorCores")
def _no_tensor_cores(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
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


def _schedule(profile: TargetProfile) -> list:
    from tvm.s_tir import dlight as dl
    return [_no_tensor_cores, dl.ApplyDefaultSchedule(
        dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.LowBatchGEMV(), dl.gpu.Reduction(),
        dl.gpu.GeneralReduction(), dl.gpu.Fallback())]


def cuda_profile(arch: str = "sm_80") -> TargetProfile:
    if arch not in _SMEM:
        raise ValueError(f"unknown CUDA arch {arch!r}; choose one of {', '.join(_SMEM)}")
    target = {"kind": "cuda", "arch": arch, "max_shared_memory_per_block": _SMEM[arch],
              "max_threads_per_block": 1024, "thread_warp_size": 32,
              "host": {"kind": "llvm"}}
    return TargetProfile(name=f"cuda-{arch.replace('_', '')}" if arch != "sm_80" else "cuda",
                         target=target, device="cuda", export_format="so", runnable_here=False,
                         schedule=_schedule, description=f"NVIDIA GPU, {arch}")
