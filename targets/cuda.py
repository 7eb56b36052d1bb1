"""NVIDIA GPUs through TVM's CUDA codegen, scheduled with dlight's GPU rules."""

from __future__ import annotations

from .profile import TargetProfile

# Shared memory per block TVM may use (KB * 1024); set explicitly to avoid TVM's 48 KB guess.
_SMEM = {"sm_80": 166912, "sm_86": 101376, "sm_89": 101376, "sm_90": 232448}


def _schedule(profile: TargetProfile) -> list:
    from tvm.s_tir import dlight as dl
    return [dl.ApplyDefaultSchedule(
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
