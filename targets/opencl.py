"""Android phone GPUs (Qualcomm Adreno, Arm Mali) through TVM's OpenCL codegen.

The kernels are OpenCL C sources carried inside the library (the phone's driver compiles them at
load); the host code is AArch64 Android from LLVM. The library is a .tar of objects for the app
build (the NDK links it), so writing it needs no Android toolchain here.
"""

from __future__ import annotations

from .gpu import gpu_phase_passes
from .profile import TargetProfile

# What Adreno 6xx/7xx and Mali G7x both give: 256 threads per work-group, 32 KB local memory
# (TVM's Adreno tag says 16 KB for older parts; its decode kernels adapt to an Android host).
# OpenCL promises no sub-group size, so kernels assume none (warp size 1).
_OPENCL = {"kind": "opencl", "max_threads_per_block": 256, "max_num_threads": 256, "thread_warp_size": 1,
           "max_shared_memory_per_block": 32768, "max_function_args": 128, "texture_spatial_limit": 16384,
           "texture_depth_limit": 2048, "image_base_address_alignment": 64}


def android_opencl_profile() -> TargetProfile:
    host = {"kind": "llvm", "mtriple": "aarch64-linux-android", "mattr": ["+neon"], "num-cores": 4}
    return TargetProfile(
        name="android-opencl", target={**_OPENCL, "host": host}, device="opencl", export_format="tar",
        runnable_here=False, default_quant="q4f16", phase_passes=gpu_phase_passes,
        description="Android GPU (Adreno, Mali) via OpenCL, static library for the app build")
