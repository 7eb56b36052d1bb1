"""NVIDIA GPUs through TVM's CUDA codegen, scheduled with the shared GPU rules (targets/gpu.py)."""

from __future__ import annotations

from .gpu import cuda_graph_phase_passes
from .profile import TargetProfile

# Shared memory per block TVM may use (bytes); set explicitly to avoid TVM's 48 KB guess.
_SMEM = {"sm_80": 166912, "sm_86": 101376, "sm_89": 101376, "sm_90": 232448}


def cuda_profile(arch: str = "sm_80") -> TargetProfile:
    if arch not in _SMEM:
        raise ValueError(f"unknown CUDA arch {arch!r}; choose one of {', '.join(_SMEM)}")
    target = {"kind": "cuda", "arch": arch, "max_shared_memory_per_block": _SMEM[arch],
              "max_threads_per_block": 1024, "thread_warp_size": 32,
              "host": {"kind": "llvm"}}
    return TargetProfile(name=f"cuda-{arch.replace('_', '')}" if arch != "sm_80" else "cuda",
                         target=target, device="cuda", export_format="so", runnable_here=False,
                         default_quant="q4f16", phase_passes=cuda_graph_phase_passes,
                         description=f"NVIDIA GPU, {arch}")
