"""One TargetProfile per device family (kiln.targets).

`get_profile(name)` turns what a user types after --target into a profile. Adding a device
means a family module here (returning TargetProfiles) and its presets in the table below;
nothing under compiler/ changes.
"""

from __future__ import annotations

from collections.abc import Callable

from .profile import INT8_DECODE_ATTR, PHASES, SOFTCAP_ATTR, TargetProfile, ToolchainError, TuningSpace


def _family(module: str, factory: str, *args) -> Callable[[], TargetProfile]:
    """A preset: the family module is imported only when the preset is asked for."""
    def make() -> TargetProfile:
        import importlib
        return getattr(importlib.import_module(f"{__name__}.{module}"), factory)(*args)
    return make


DEFAULT_TARGET = "cpu"          # what --target defaults to: the machine kiln runs on
_PROFILES: dict[str, Callable[[], TargetProfile]] = {
    "cpu": _family("cpu", "cpu_profile"),
    "x86-64-v3": _family("cpu", "x86_64_profile", "x86-64-v3"),
    "x86-64-avx512": _family("cpu", "x86_64_profile", "x86-64-avx512"),
    "aarch64": _family("cpu", "aarch64_profile"),
    "android": _family("cpu", "android_profile"),
    "android-opencl": _family("opencl", "android_opencl_profile"),
    "cuda": _family("cuda", "cuda_profile", "sm_80"),
    "cuda-sm80": _family("cuda", "cuda_profile", "sm_80"),
    "cuda-sm86": _family("cuda", "cuda_profile", "sm_86"),
    "cuda-sm89": _family("cuda", "cuda_profile", "sm_89"),
    "cuda-sm90": _family("cuda", "cuda_profile", "sm_90"),
    "rocm": _family("rocm", "rocm_profile", "gfx942"),
    "rocm-gfx90a": _family("rocm", "rocm_profile", "gfx90a"),
    "rocm-gfx942": _family("rocm", "rocm_profile", "gfx942"),
    "rocm-gfx1100": _family("rocm", "rocm_profile", "gfx1100"),
    "metal": _family("metal", "metal_profile"),
    "ios": _family("metal", "ios_profile"),
    "webgpu": _family("webgpu", "webgpu_profile"),
}

# Presets kiln names but cannot build with this TVM: --target NAME answers with the reason.
UNSUPPORTED = {
    "vulkan": "the PyPI apache-tvm has no SPIR-V code generator, so kiln cannot build Vulkan kernels; "
              "use --target webgpu (browsers, and Vulkan through Dawn/wgpu) or android-opencl (Android GPUs)",
}


class UnsupportedTarget(ValueError):
    """A preset kiln knows but cannot build here; the message says why and what to use instead."""


def names() -> list[str]:
    """The presets that build (UNSUPPORTED lists the others)."""
    return list(_PROFILES)


def get_profile(name: str) -> TargetProfile:
    if name in UNSUPPORTED:
        raise UnsupportedTarget(f"--target {name}: {UNSUPPORTED[name]}")
    if name not in _PROFILES:
        raise ValueError(f"unknown target {name!r}; choose one of: {', '.join(_PROFILES)}")
    return _PROFILES[name]()


def memoize_kv_cache_kernels() -> None:
    """Let TVM's KV-cache kernels be parsed once (kernel_memo.py); call before exporting a model."""
    from .kernel_memo import memoize_kv_cache_kernels as install
    install()


__all__ = ["DEFAULT_TARGET", "INT8_DECODE_ATTR", "PHASES", "SOFTCAP_ATTR", "UNSUPPORTED", "TargetProfile",
           "ToolchainError", "TuningSpace", "UnsupportedTarget", "get_profile", "memoize_kv_cache_kernels", "names"]
