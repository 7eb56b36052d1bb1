"""AMD GPUs through TVM's ROCm (AMDGPU LLVM) codegen, scheduled with the shared GPU rules.

The code object is linked with ld.lld (Debian: `apt-get install lld`); the artifact runs where
TVM's ROCm runtime and a ROCm driver are (its runtime device kind is "rocm").
"""

from __future__ import annotations

from .gpu import gpu_phase_passes
from .profile import TargetProfile

# Per architecture: wavefront size TVM's kernels assume, shared memory (LDS) per workgroup, what it is.
_ARCHS = {
    "gfx942": (64, 65536, "AMD Instinct MI300 (CDNA 3)"),
    "gfx1100": (32, 65536, "AMD Radeon RX 7900 (RDNA 3)"),
}


def rocm_profile(arch: str) -> TargetProfile:
    if arch not in _ARCHS:
        raise ValueError(f"unknown ROCm arch {arch!r}; choose one of {', '.join(_ARCHS)}")
    wave, lds, what = _ARCHS[arch]
    target = {"kind": "rocm", "mcpu": arch, "mtriple": "amdgcn-amd-amdhsa-hcc", "thread_warp_size": wave,
              "max_shared_memory_per_block": lds, "max_threads_per_block": 1024, "max_num_threads": 256,
              "host": {"kind": "llvm"}}
    return TargetProfile(name=f"rocm-{arch}", target=target, device="rocm", export_format="so",
                         runnable_here=False, default_quant="q4f16", phase_passes=gpu_phase_passes,
                         description=f"{what}, {arch}")
