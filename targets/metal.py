"""Apple GPUs through TVM's Metal codegen: macOS on Apple Silicon (.dylib) and iOS (static library).

The kernels are Metal Shading Language sources carried inside the library; TVM's Metal runtime
compiles them when the module loads. The host code is AArch64 (arm64-apple-*) from LLVM. On a
Mac the .dylib is linked by Xcode's clang (TVM's default); elsewhere by LLVM's ld64.lld, which
lets a Linux machine build it. The iPhone build is a system library packed as a .tar of objects for the app's Xcode
project (no toolchain needed to write it).
"""

from __future__ import annotations

import shutil
import sys

from .gpu import gpu_phase_passes
from .link import lld_exporter, require_lld
from .profile import TargetProfile

# Apple7+ GPUs (M1 and later, A14 and later): 32-wide SIMD groups, 32 KB threadgroup memory,
# 1024 threads per threadgroup; TVM keeps its kernels at 256 threads (max_num_threads), as its
# apple/m1-gpu tag does. Metal buffers and arguments: at most 31 per kernel.
_METAL = {"kind": "metal", "max_threads_per_block": 1024, "max_num_threads": 256, "thread_warp_size": 32,
          "max_shared_memory_per_block": 32768, "max_function_args": 31}
_MACOS_MIN = "11.0"


def metal_profile() -> TargetProfile:
    """macOS on Apple Silicon: lib.dylib that kiln's Python Engine loads with the Metal runtime."""
    host = {"kind": "llvm", "mtriple": f"arm64-apple-macos{_MACOS_MIN}", "mcpu": "apple-m1"}
    on_a_mac = sys.platform == "darwin" and shutil.which("clang") is not None
    lld = lld_exporter("macho", ["-arch", "arm64", "-platform_version", "macos", _MACOS_MIN, "14.0", "-fixup_chains"])
    return TargetProfile(
        name="metal", target={**_METAL, "host": host}, device="metal", export_format="dylib",
        runnable_here=False, default_quant="q4f16", phase_passes=gpu_phase_passes,
        check_toolchain=(lambda p: None) if on_a_mac else (lambda p: require_lld("macho", p.name)),
        exporter=None if on_a_mac else lld,
        description="Apple Silicon Mac GPU (Metal), .dylib for the Python Engine")


def ios_profile() -> TargetProfile:
    """iPhone/iPad: a static system library (.tar of objects) linked into the app by Xcode."""
    host = {"kind": "llvm", "mtriple": "arm64-apple-ios14.0", "mcpu": "apple-a14"}
    return TargetProfile(
        name="ios", target={**_METAL, "host": host}, device="metal", export_format="tar", runnable_here=False,
        default_quant="q4f16", phase_passes=gpu_phase_passes, system_lib=True,
        description="iPhone/iPad GPU (Metal, A14+), static system library for the app build")
