"""Browsers through TVM's WebGPU codegen: WGSL kernels and a WebAssembly host module.

A loadable .wasm needs Emscripten (emcc) and TVM's web runtime (tvmjs) to link; kiln writes the
objects (wasm32) as a .tar, which needs neither, and the web app's build links them.
"""

from __future__ import annotations

from .gpu import gpu_phase_passes
from .profile import TargetProfile

# WebGPU's default limits, which every adapter grants: 256 invocations per workgroup and 16 KB
# of workgroup storage. Subgroups are an optional feature, so kernels assume none (warp size 1).
_WEBGPU = {"kind": "webgpu", "max_num_threads": 256, "max_shared_memory_per_block": 16384,
           "supports_subgroups": False, "thread_warp_size": 1}


def webgpu_profile() -> TargetProfile:
    host = {"kind": "llvm", "mtriple": "wasm32-unknown-unknown-wasm", "vector-width": 128}
    # q4f32: WGSL's f16 needs the optional shader-f16 feature, which many adapters lack.
    # WGSL has no 8-bit types (array<i8> does not parse), so no q8 weights: the LM head stays 4-bit;
    # nor 16-bit ones without shader-f16, so as-stored keeps F16 / BF16 weights as float32.
    return TargetProfile(
        name="webgpu", target={**_WEBGPU, "host": host}, device="webgpu", export_format="tar",
        runnable_here=False, default_quant="q4f32", phase_passes=gpu_phase_passes, system_lib=True,
        eight_bit_storage=False, half_storage=False,
        description="browser GPU (WebGPU, WGSL); wasm32 objects for an Emscripten/tvmjs build")
