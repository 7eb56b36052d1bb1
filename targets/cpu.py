"""The host CPU (x86-64 or AArch64) through LLVM."""

from __future__ import annotations

import platform

import tvm

from .profile import TargetProfile

# These machines list AMX in /proc/cpuinfo but fault on AMX instructions (SIGILL at tileloadd):
# never let LLVM pick AMX, whatever -mcpu says.
NO_AMX = ["-amx-tile", "-amx-int8", "-amx-bf16", "-amx-fp16", "-amx-complex"]


def host_vector_lanes(mcpu: str, features: set[str]) -> int:
    """float32 lanes in one vector register: 16 with AVX-512, 8 with AVX2, 4 on NEON/SSE."""
    if "avx512f" in features:
        return 16
    if "avx2" in features:
        return 8
    return 4


def _cpu_features() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _schedule(profile: TargetProfile) -> list:
    from tvm.s_tir import dlight as dl
    from .cpu_schedule import cpu_schedule_rules
    lanes = host_vector_lanes(profile.target.get("mcpu", ""), _cpu_features())
    return [dl.ApplyDefaultSchedule(*cpu_schedule_rules(vector_lanes=lanes))]


def cpu_profile(num_cores: int | None = None) -> TargetProfile:
    import os
    mcpu = tvm.target.codegen.llvm_get_system_cpu()
    target = {"kind": "llvm", "mcpu": mcpu, "num-cores": num_cores or os.cpu_count() or 1}
    if platform.machine() in ("x86_64", "AMD64"):
        target["mattr"] = list(NO_AMX)
    return TargetProfile(name="cpu", target=target, device="cpu", export_format="so", runnable_here=True,
                         schedule=_schedule, description=f"this machine's CPU ({mcpu}, LLVM)")


def android_profile() -> TargetProfile:
    """AArch64 Android phones: LLVM cross-compile, packed as a static .tar for the app build."""
    target = {"kind": "llvm", "mtriple": "aarch64-linux-android", "mattr": ["+neon"], "num-cores": 4}
    return TargetProfile(name="android", target=target, device="cpu", export_format="tar",
                         runnable_here=False, schedule=_schedule,
                         description="Android AArch64 CPU (static library for the app build)")
