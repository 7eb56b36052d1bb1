"""CPUs through LLVM: this host, portable x86-64 and AArch64 Linux builds, and Android AArch64.

Everything CPU-specific lives in this folder: the profile (below), the schedule rules
(schedule.py, rowwise.py, quant_schedule.py, fused_schedule.py; the hand-written GEMVs of
quant_gemv.py and greedy decoding's argmax, argmax.py), the paged-attention and RoPE
kernels (attention.py) and the pass that swaps them into TVM's KV cache (attention_pass.py),
FastActivations (fast_activations.py), the low-batch GEMV copies (low_batch_gemv.py), the serial twins of
parallel loops over little work (serial_small.py), and the tuning space and database `kiln tune`
fills (tuning.py).
"""

from __future__ import annotations

import os
import platform

import tvm

from ..link import lld_exporter, require_lld
from ..profile import TargetProfile
from .quant_kernel import q4_quantize

# These machines list AMX in /proc/cpuinfo but fault on AMX instructions (SIGILL at tileloadd):
# never let LLVM pick AMX, whatever -mcpu says.
NO_AMX = ["-amx-tile", "-amx-int8", "-amx-bf16", "-amx-fp16", "-amx-complex"]
LOW_BATCH_ROWS = 4          # matmuls over <= this many rows take their GEMV copy (low_batch_gemv.py)


def _phase_passes(profile: TargetProfile, phase: str) -> list:
    """The CPU's additions to each pipeline phase (compiler/pipeline.py says where they run)."""
    from .attention_pass import UseKilnCPUAttention
    from .attention_fix import FixTVMSlidingPrefill
    from ..attention_softcap import SoftcapTVMAttention
    from .fast_activations import FastActivations
    from .low_batch_gemv import DispatchLowBatchGEMV, LowBatchGEMV
    from .serial_small import serial_small_loops
    if phase == "graph":
        # float32 SiLU, sigmoid, gelu_tanh and the exact gelu with a polynomial exp (LLVM scalarises a
        # vector exp into libm calls; TVM's exact gelu calls libm's erf an element).
        return [FastActivations()]
    if phase == "legalize":
        # Matmuls over symbolic rows get a GEMV copy (scheduled for <= 4 rows; folded in at lower).
        return [LowBatchGEMV(max_rows=LOW_BATCH_ROWS)]
    if phase == "schedule":
        from ..schedule_memo import ScheduleOnce
        # The KV cache's attention kernels: TVM's scalar loops out, kiln's vectorised ones in;
        # then every kernel gets the first CPU rule that matches (tuned knobs where the database has them).
        # A soft-capped model (Gemma 2) has the cap in kiln's kernels and written into TVM's that remain.
        from .schedule import attention_lanes
        simd = attention_lanes(profile.tvm_target())
        # --decode-activations int8: every PrimFunc told (QuantMatmul's GEMVs of 1-8 rows take int8 x).
        from .int8_gemv import mark_int8_decode
        # Each kernel's schedule is kept (schedule_memo.py): the rules read the tuning database too.
        db = profile.tuning_db_path()
        return [UseKilnCPUAttention(simd), FixTVMSlidingPrefill(), SoftcapTVMAttention(), mark_int8_decode,
                ScheduleOnce(*profile.tuning_space().rules(), identity=db.read_bytes() if db.is_file() else b"")]
    if phase == "lower":
        # Each scheduled GEMV copy folded into its matmul behind `if rows <= 4`.
        return [DispatchLowBatchGEMV()]
    if phase == "finalize":
        # Parallel loops over little work (a decode step's norms, adds, casts at a few rows) also run
        # serially; after lower's RewriteDataflowReshape, which must still see the reshapes as they were.
        return [serial_small_loops]
    return []


def schedule_rules(profile: TargetProfile) -> list:
    """The CPU rules in order, before tuning wraps the knob-taking ones (see tuning.CPUTuning)."""
    from .argmax import ChunkArgmax
    from .expert_matmul import GroupedExpertMatmul
    from .fused_schedule import cpu_fused_schedule_rules  # kernels kiln's own passes emit
    from .quant_schedule import quant_schedule_rules
    from .rowwise import RowReduction
    from .schedule import CPUKnobs, cpu_schedule_rules, target_mcpu, vector_lanes_for_target
    target = profile.tvm_target()
    lanes = vector_lanes_for_target(target)      # the target's, not the host's (android)
    knobs = CPUKnobs(vector_lanes=lanes)
    # QuantMatmul first: dequantize-matmuls (it branches on the rows itself: hand-written GEMVs to 4
    # rows, more rows dequantize each W tile once; LowBatchGEMV copies none). ChunkArgmax: greedy
    # decoding's argmax, vectorised (argmax.py). GroupedExpertMatmul: MoE expert matmuls, tokens
    # grouped by expert (expert_matmul.py).
    return [*quant_schedule_rules(vector_lanes=lanes, mcpu=target_mcpu(target)), ChunkArgmax(),
            GroupedExpertMatmul(knobs, few=RowReduction(knobs)),
            *cpu_fused_schedule_rules(vector_lanes=lanes, mcpu=target_mcpu(target)),
            *cpu_schedule_rules(vector_lanes=lanes)]


def _tuning(profile: TargetProfile):
    from .fused_schedule import LowBatchGEMV
    from .quant_schedule import QuantMatmul
    from .schedule import Matmul
    from .tuning import CPUTuning
    return CPUTuning(profile, schedule_rules, tunable=(Matmul, QuantMatmul, LowBatchGEMV))


# Kernels built as 8 modules on threads (compiler/codegen.py): SmolLM2 q0f32's code generation and
# export on 2 cores 11.7 -> 5.4 s; smaller modules also optimize faster (8 parts beat 2 there).
CODEGEN_PARTS = 8


def _cpu(name: str, target: dict, export_format: str, runnable_here: bool, description: str,
         **extra) -> TargetProfile:
    # q4f32: float32 compute is as fast as f16 on CPUs without f16 arithmetic, and exact-er.
    return TargetProfile(name=name, target=target, device="cpu", export_format=export_format,
                         runnable_here=runnable_here, default_quant="q4f32", phase_passes=_phase_passes,
                         tuning=_tuning, description=description, half_scales=True,
                         codegen_parts=CODEGEN_PARTS, **extra)


def llvm_opt_level() -> int | None:
    """$KILN_LLVM_OPT_LEVEL (0-3): LLVM's optimisation level for this machine's builds, where set (LLVM's default:
    3). Lower compiles faster and runs slower: 0 took a quarter less time over four tiny GGUF families' tests (38 ->
    28 s, 2 vCPUs). For development loops and the tests' tiny models, whose numbers are checked at that level."""
    value = os.environ.get("KILN_LLVM_OPT_LEVEL", "")
    if not value:
        return None
    if value not in ("0", "1", "2", "3"):
        raise ValueError(f"KILN_LLVM_OPT_LEVEL={value!r}: LLVM takes 0, 1, 2 or 3; unset it for the default (3)")
    return int(value)


def cpu_profile(num_cores: int | None = None) -> TargetProfile:
    mcpu = tvm.target.codegen.llvm_get_system_cpu()
    target = {"kind": "llvm", "mcpu": mcpu, "num-cores": num_cores or os.cpu_count() or 1}
    if (level := llvm_opt_level()) is not None:
        target["opt-level"] = level
    if platform.machine() in ("x86_64", "AMD64"):
        target["mattr"] = list(NO_AMX)
    from .int8_gemv import int8_isa
    return _cpu("cpu", target, "so", True, f"this machine's CPU ({mcpu}, LLVM)", q4_quantizer=q4_quantize,
                int8_decode=int8_isa(tvm.target.Target(target)) is not None)


# `--decode-activations int8` on generic AArch64 builds: the dot product added (ARMv8.2's, every
# phone core since Cortex-A55/A75, Apple's since A13, Graviton 2 on; not a Raspberry Pi 4's A72).
_ARM_INT8 = {"int8_decode": True, "int8_features": ("+dotprod",)}


def android_profile() -> TargetProfile:
    """AArch64 Android phones: LLVM cross-compile, packed as a static .tar for the app build."""
    target = {"kind": "llvm", "mtriple": "aarch64-linux-android", "mcpu": "generic", "mattr": ["+neon"],
              "num-cores": 4}
    return _cpu("android", target, "tar", False, "Android AArch64 CPU (static library for the app build)",
                **_ARM_INT8)


# Portable x86-64 levels: LLVM's micro-architecture level names, and the /proc/cpuinfo flags a
# machine needs to run code built for them.
_X86_LEVELS = {
    "x86-64-v3": ("x86-64-v3", {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave"},
                  "x86-64 with AVX2 and FMA (Haswell, Zen and later)"),
    "x86-64-avx512": ("x86-64-v4", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
                      "x86-64 with AVX-512 F/BW/CD/DQ/VL (Skylake-SP, Zen 4 and later)"),
}


def _host_cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def x86_64_profile(name: str) -> TargetProfile:
    """A portable x86-64 Linux build for every machine at this micro-architecture level."""
    mcpu, needs, what = _X86_LEVELS[name]
    here = platform.machine() in ("x86_64", "AMD64") and needs <= _host_cpu_flags()
    target = {"kind": "llvm", "mtriple": "x86_64-pc-linux-gnu", "mcpu": mcpu, "mattr": list(NO_AMX), "num-cores": 4}
    return _cpu(name, target, "so", here, f"{what}, Linux .so", int8_decode=True)     # AVX2 at least


def aarch64_profile() -> TargetProfile:
    """AArch64 Linux (Graviton, Ampere, Jetson, Raspberry Pi 4/5): a .so linked by ld.lld."""
    target = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "generic", "mattr": ["+neon"], "num-cores": 4}
    here = platform.machine() in ("aarch64", "arm64")
    return _cpu("aarch64", target, "so", here, "AArch64 Linux CPU (NEON), .so",
                check_toolchain=lambda p: require_lld("elf", p.name), exporter=lld_exporter("elf"), **_ARM_INT8)
