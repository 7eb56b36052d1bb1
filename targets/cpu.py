"""The host CPU (x86-64 or AArch64) through LLVM."""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING

import tvm

from .profile import TargetProfile

if TYPE_CHECKING:
    from .cpu_schedule import KnobLookup

# These machines list AMX in /proc/cpuinfo but fault on AMX instructions (SIGILL at tileloadd):
# never let LLVM pick AMX, whatever -mcpu says.
NO_AMX = ["-amx-tile", "-amx-int8", "-amx-bf16", "-amx-fp16", "-amx-complex"]


def _schedule(profile: TargetProfile) -> list:
    from tvm.s_tir import dlight as dl
    return [dl.ApplyDefaultSchedule(*schedule_rules(profile))]


def schedule_rules(profile: TargetProfile, lookup: KnobLookup | None = None) -> list:
    """The CPU rules in order; the matmul rules are ``Tuned``: per-kernel knobs from ``lookup``
    (default: the target's tuning database, targets/tuning.py, which `kiln tune` writes)."""
    from .cpu_quant_schedule import QuantMatmul, quant_schedule_rules
    from .cpu_fused_schedule import LowBatchGEMV, cpu_fused_schedule_rules  # kernels kiln's own passes emit
    from .cpu_schedule import Matmul, Tuned, cpu_schedule_rules, vector_lanes_for_target
    from .tuning import TuningDB
    lanes = vector_lanes_for_target(profile.tvm_target())      # the target's, not the host's (android)
    # QuantMatmul first: dequantize-matmuls (it branches on the rows itself: a one-row GEMV that
    # inlines the dequantize, more rows dequantize each W tile once; LowBatchGEMV copies none).
    rules = [*quant_schedule_rules(vector_lanes=lanes), *cpu_fused_schedule_rules(vector_lanes=lanes),
             *cpu_schedule_rules(vector_lanes=lanes)]
    lookup = lookup or TuningDB.for_profile(profile).lookup
    return [Tuned(r, lookup) if isinstance(r, (Matmul, QuantMatmul, LowBatchGEMV)) else r for r in rules]


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
