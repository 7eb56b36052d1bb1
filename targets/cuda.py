"""NVIDIA GPUs through TVM's CUDA codegen, scheduled with the shared GPU rules (targets/gpu.py)."""

from __future__ import annotations

from .gpu import cuda_graph_phase_passes
from .profile import TargetProfile

# Shared memory per block TVM may use (bytes; set explicitly to avoid TVM's 48 KB guess) and the L2
# cache of the arch's flagship (A100, RTX 3090, RTX 4090, H100).
_SMEM = {"sm_80": 166912, "sm_86": 101376, "sm_89": 101376, "sm_90": 232448}
_L2 = {"sm_80": 40 << 20, "sm_86": 6 << 20, "sm_89": 72 << 20, "sm_90": 50 << 20}


def cuda_profile(arch: str = "sm_80") -> TargetProfile:
    if arch not in _SMEM:
        raise ValueError(f"unknown CUDA arch {arch!r}; choose one of {', '.join(_SMEM)}")
    target = {"kind": "cuda", "arch": arch, "max_shared_memory_per_block": _SMEM[arch],
              "max_threads_per_block": 1024, "max_num_threads": 1024, "thread_warp_size": 32,
              "registers_per_block": 65536, "l2_cache_size_bytes": _L2[arch], "host": {"kind": "llvm"}}
    return TargetProfile(name=f"cuda-{arch.replace('_', '')}" if arch != "sm_80" else "cuda",
                         target=target, device="cuda", export_format="so", runnable_here=False,
                         default_quant="q4f16", phase_passes=cuda_graph_phase_passes,
                         max_batch_size=256, library_gemm=True,
                         description=f"NVIDIA GPU, {arch}")
