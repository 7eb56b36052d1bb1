"""One TargetProfile per device family (kiln.targets).

`get_profile(name)` turns what a user types after --target into a profile:
cpu, cuda (sm_80), cuda-sm90, android.
"""

from __future__ import annotations

from .cpu import android_profile, cpu_profile
from .cuda import cuda_profile
from .profile import TargetProfile

_PROFILES = {
    "cpu": cpu_profile,
    "cuda": lambda: cuda_profile("sm_80"),
    "cuda-sm80": lambda: cuda_profile("sm_80"),
    "cuda-sm86": lambda: cuda_profile("sm_86"),
    "cuda-sm89": lambda: cuda_profile("sm_89"),
    "cuda-sm90": lambda: cuda_profile("sm_90"),
    "android": android_profile,
}


def names() -> list[str]:
    return list(_PROFILES)


def get_profile(name: str) -> TargetProfile:
    if name not in _PROFILES:
        raise ValueError(f"unknown target {name!r}; choose one of: {', '.join(_PROFILES)}")
    return _PROFILES[name]()


__all__ = ["TargetProfile", "get_profile", "names"]
