"""One TargetProfile per device family (kiln.targets).

`get_profile(name)` turns what a user types after --target into a profile. Adding a device
means a family module here (returning TargetProfiles) and its presets in the table below;
nothing under compiler/ changes.
"""

from __future__ import annotations

from collections.abc import Callable

from .profile import PHASES, SOFTCAP_ATTR, TargetProfile, ToolchainError, TuningSpace


def _cpu() -> TargetProfile:
    from .cpu import cpu_profile
    return cpu_profile()


def _android() -> TargetProfile:
    from .cpu import android_profile
    return android_profile()


def _cuda(arch: str) -> Callable[[], TargetProfile]:
    def make() -> TargetProfile:
        from .cuda import cuda_profile
        return cuda_profile(arch)
    return make


def _rocm(arch: str) -> Callable[[], TargetProfile]:
    def make() -> TargetProfile:
        from .rocm import rocm_profile
        return rocm_profile(arch)
    return make


DEFAULT_TARGET = "cpu"          # what --target defaults to: the machine kiln runs on
_PROFILES: dict[str, Callable[[], TargetProfile]] = {
    "cpu": _cpu,
    "cuda": _cuda("sm_80"),
    "cuda-sm80": _cuda("sm_80"),
    "cuda-sm86": _cuda("sm_86"),
    "cuda-sm89": _cuda("sm_89"),
    "cuda-sm90": _cuda("sm_90"),
    "rocm": _rocm("gfx942"),
    "rocm-gfx942": _rocm("gfx942"),
    "rocm-gfx1100": _rocm("gfx1100"),
    "android": _android,
}


def names() -> list[str]:
    return list(_PROFILES)


def get_profile(name: str) -> TargetProfile:
    if name not in _PROFILES:
        raise ValueError(f"unknown target {name!r}; choose one of: {', '.join(_PROFILES)}")
    return _PROFILES[name]()


__all__ = ["DEFAULT_TARGET", "PHASES", "SOFTCAP_ATTR", "TargetProfile", "ToolchainError", "TuningSpace", "get_profile", "names"]
