"""AMD GPUs through TVM's ROCm (AMDGPU LLVM) codegen, scheduled with the shared GPU rules.

Building needs two host tools besides TVM: an ld.lld as new as TVM's LLVM (22 for apache-tvm
0.27; older ones reject its code objects with "unknown abi version") to link the code object,
and ROCm's device libraries (ocml.bc, ...) to link math functions. Both come from a ROCm install
($ROCM_PATH or /opt/rocm) or from Debian: `apt-get install lld-22 rocm-device-libs`.
The artifact runs where TVM's ROCm runtime and a ROCm driver are (runtime device "rocm").
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
from pathlib import Path

from .gpu import gpu_phase_passes
from .profile import TargetProfile, ToolchainError

# Per architecture: wavefront size TVM's kernels assume, shared memory (LDS) per workgroup, what it is.
_ARCHS = {
    "gfx90a": (64, 65536, "AMD Instinct MI200 (CDNA 2)"),
    "gfx942": (64, 65536, "AMD Instinct MI300 (CDNA 3)"),
    "gfx1100": (32, 65536, "AMD Radeon RX 7900 (RDNA 3)"),
}
# LowBatchGEMV's kernels index in int32: their cross-thread sums broadcast from lane 64 * threadIdx.y,
# an int64 where the kernel's sizes are symbolic, and TVM 0.27's AMDGPU codegen hands that to
# llvm.amdgcn.ds.bpermute (an i32 operand) uncast: "Call parameter type does not match function
# signature" kills the build. Drop narrow_index once the lane is narrowed upstream.
_PHASE_PASSES = functools.partial(gpu_phase_passes, narrow_index=True)
_FIX = "install ROCm (or set ROCM_PATH), or on Debian: apt-get install lld-22 rocm-device-libs"


def device_library_dir() -> Path | None:
    """The folder holding ROCm's device bitcode (ocml.bc, ...), or None."""
    roots = [os.environ.get("ROCM_PATH", ""), "/opt/rocm", *glob.glob("/usr/lib/*-linux-gnu")]
    return next((Path(r) / "amdgcn" / "bitcode" for r in roots
                 if r and (Path(r) / "amdgcn" / "bitcode" / "ocml.bc").is_file()), None)


def _check_toolchain(profile: TargetProfile) -> None:
    """Fail before the compile, in one line, when a tool the ROCm build needs is missing."""
    import tvm
    import tvm_ffi
    import tvm.support.rocm as rocm_support          # registers TVM's own bitcode-path callback
    major = tvm.target.codegen.llvm_version_major()
    if not any(shutil.which(f"ld.lld-{major}{v}") for v in ("", ".0")) and \
            not shutil.which(f"{os.environ.get('ROCM_PATH', '/opt/rocm')}/llvm/bin/ld.lld"):
        raise ToolchainError(f"--target {profile.name} links with ld.lld-{major} (TVM's LLVM {major}), "
                           f"which is not installed: {_FIX}")
    bitcode = device_library_dir()
    if bitcode is None:
        raise ToolchainError(f"--target {profile.name} needs ROCm's device libraries (ocml.bc), not found: {_FIX}")
    tvm_ffi.register_global_func("tvm_callback_rocm_bitcode_path",
                                 lambda rocdl_dir=None: rocm_support.callback_rocm_bitcode_path(str(bitcode)),
                                 override=True)


def rocm_profile(arch: str) -> TargetProfile:
    if arch not in _ARCHS:
        raise ValueError(f"unknown ROCm arch {arch!r}; choose one of {', '.join(_ARCHS)}")
    wave, lds, what = _ARCHS[arch]
    # 256 threads per workgroup: built without the GPU, TVM's AMDGPU codegen declares every kernel
    # for at most 256 (amdgpu-flat-work-group-size 1,256), so no kernel may launch more.
    target = {"kind": "rocm", "mcpu": arch, "mtriple": "amdgcn-amd-amdhsa-hcc", "thread_warp_size": wave,
              "max_shared_memory_per_block": lds, "max_threads_per_block": 256, "max_num_threads": 256,
              "host": {"kind": "llvm"}}
    return TargetProfile(name=f"rocm-{arch}", target=target, device="rocm", export_format="so",
                         runnable_here=False, default_quant="q4f16", phase_passes=_PHASE_PASSES,
                         check_toolchain=_check_toolchain, max_batch_size=256, description=f"{what}, {arch}")
