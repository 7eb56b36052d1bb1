"""TargetProfile: everything device-specific that the compiler and runtime need, in one record.

The compiler asks a profile, never a device name: the passes it adds to each pipeline phase
(``passes(phase)``), its default quantization, how its module is exported (.so, a static .tar
system library, .dylib, .wasm), its tuning space (or none), and the runtime device kind written
into the artifact. A family module (targets/cpu/, targets/cuda.py, targets/rocm.py, ...) builds
its presets; targets/__init__.py lists them.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import tvm

# The pipeline's phases (compiler/pipeline.py), in order; a profile may add passes to each.
# IRModule attribute: the model's attention logit soft-cap (Gemma 2), for targets with attn_softcap.
SOFTCAP_ATTR = "kiln_attn_logit_softcap"
# IRModule attribute (and, from the CPU's schedule phase, its PrimFuncs'): `kiln compile
# --decode-activations int8`, for targets with int8_decode.
INT8_DECODE_ATTR = "kiln_int8_decode"

PHASES = ("graph", "legalize", "schedule", "lower", "finalize")
# Module formats a profile may export: shared object, static system library (.tar of objects), dylib, wasm.
EXPORT_FORMATS = ("so", "tar", "dylib", "wasm")


class ToolchainError(ValueError):
    """A host tool that a target's build needs is missing; the message names the fix."""


class TuningSpace(Protocol):
    """What `kiln tune` (compiler/tune.py) searches for a target: schedule knobs per kernel,
    measured on the device itself, stored in a per-target database that compiles then read."""

    marker_attr: str                                  # PrimFunc attr the tuned rules set

    def rules(self, lookup: Callable[[Any], Any] | None = None) -> list:
        """The schedule rules, per-kernel knobs from ``lookup`` (default: the database's)."""

    def is_tunable(self, rule: Any) -> bool:
        """Whether ``rule`` takes per-kernel knobs."""

    def default_knobs(self, func: Any = None) -> Any:
        """The knobs the rule scheduling ``func`` (a PrimFunc) takes untuned."""

    def candidates(self, default: Any, rows_tile: bool) -> list:
        """Knob settings to try, nearest ``default`` first (``rows_tile``: many-row calls too)."""

    def original_of(self, func: Any) -> Any | None:
        """For a kernel that is a low-row copy of another (runs in its place), that original."""

    def kernel_key(self, func: Any) -> str: ...

    def database(self) -> Any:
        """The target's tuning database (entries by kernel key; ``save()``; ``path``)."""

    def database_path(self) -> Path:
        """Where that database lives (it may not exist yet), without reading it."""

    def entry(self, knobs: Any, us: dict[int, float], default_us: dict[int, float], function: str) -> Any:
        """A database entry: the chosen knobs and the median microseconds per row count."""


@dataclass(frozen=True)
class TargetProfile:
    name: str                       # what users type: cpu, cuda, rocm-gfx942, android, ...
    target: dict                    # TVM target, JSON dict form, complete (no guessed defaults)
    device: str                     # runtime device kind, tvm.runtime.device(device): "cpu" | "cuda" | ...
    export_format: str              # one of EXPORT_FORMATS
    runnable_here: bool             # False for cross targets (android, GPUs on a CPU machine)
    default_quant: str = "q4f16"    # `--quant auto` for float (Hugging Face) weights
    attn_softcap: bool = True       # its attention kernels can soft-cap scores (module attr kiln_attn_logit_softcap)
    page_size: int = 16             # KV cache tokens per page
    prefill_chunk: int = 2048       # most tokens one prefill call takes
    max_batch_size: int = 32        # sequences one forward runs, unless `kiln compile --max-batch-size`
    phase_passes: Callable[["TargetProfile", str], list] = field(default=lambda p, phase: [], compare=False)
    tuning: Callable[["TargetProfile"], TuningSpace] | None = field(default=None, compare=False)
    # Raises, in one line naming the fix, when a host tool the build needs is missing.
    check_toolchain: Callable[["TargetProfile"], None] = field(default=lambda p: None, compare=False)
    # Writes the built module to a path (a linker the host lacks by default); None: TVM's export_library.
    exporter: Callable[[Any, Path], None] | None = field(default=None, compare=False)
    system_lib: bool = False        # functions register themselves at load (static linking into an app)
    # Kernels compiled as this many modules on the build's threads, linked into one library
    # (compiler/codegen.py); for libraries of host code alone (no device module), not system libraries.
    codegen_parts: int = 1
    eight_bit_storage: bool = True  # kernels may read 8-bit integers (q8 weights); False: 4-bit only
    # kernels may read 16-bit values (float16, uint16): as-stored keeps a checkpoint's F16 / BF16 weights
    # in 16 bits (quant_modules f16 / bf16); False: in the compute dtype
    half_storage: bool = True
    # As-stored keeps a GGUF's float16 block scales (and mins: Q4_0, Q4_1, Q8_0, Q5_0, Q5_1) in
    # float16 under float32 compute, widened as its kernels read them (exact): a Q4_1 weight's planes
    # 5 bits a value, not 6. On for the CPUs, whose GEMVs read them (targets/cpu/quant_gemv.py); off
    # where no kernel was measured with them (the GPUs: float32 planes, as before).
    half_scales: bool = False
    # Dequantize integer codes to floats by their bits (compiler/quant_modules.py code_value), the same
    # values without a conversion instruction: an H100 SM converts 16 values a clock (~4.2e12/s in
    # all), about what a batch-1 8B decode step at the memory floor needs. Off until a GPU measures it.
    codes_by_bits: bool = False
    # Also build batch_prefill_gemm and batch_decode_gemm: batch_prefill and batch_decode with their
    # token matmuls through the device's BLAS (compiler/passes/library_gemm.py; the runtime's is
    # torch's, cuBLAS on CUDA) on float weights made once at load, which the runner takes for forwards
    # of runtime/library_gemm.py's MIN_TOKENS or more and decode steps of min_decode_rows sequences or
    # more (40 for an 8B's matmuls, more for smaller ones), where those weights fit. On for CUDA
    # (targets/cuda.py): an 8B's 16 x 128 prefill took 59 ms through it against 160 through kiln's
    # kernels on an H200 (runtime/library_gemm.py has the rest).
    library_gemm: bool = False
    # CUDA sm_90+: every kernel launched with programmatic dependent launch, starting while the one
    # before it ends and waiting for it on the device (targets/dependent_launch.py), the MMA GEMV's
    # first weights loaded before it waits. Off until a GPU measures it (tools/gpu_checks.py `pdl`).
    dependent_launch: bool = False
    # CUDA: TVM's RewriteCUDAGraph captures decode's stretches between attention calls (targets/gpu.py).
    # Off for runners that capture whole steps themselves (runtime/step_graph.py; gpu_checks `stepgraph`).
    cuda_graphs: bool = True
    # batch_decode's gated activation, silu(gate) * up, written by the gate-up projection's matmul
    # (compiler/passes/fuse_dequantize_matmul.py; the MMA GEMV's `epilogue`, targets/mma_gemv.py):
    # a kernel and the gate and up halves' round trip through memory less a layer. Off until a GPU
    # measures it (tools/gpu_checks.py `glu`).
    glu_epilogue: bool = False
    # batch_decode's residual add + RMSNorm computed by the quantized matmul that reads the norm
    # (compiler/passes/fuse_norm_matmul.py; the MMA GEMV's `norm` prologue at 1-4 rows, targets/
    # norm_prologue.py): a kernel less a norm, 63 of an 8B's 65 a step. Off until a GPU measures it
    # (tools/gpu_checks.py `norm`).
    norm_prologue: bool = False
    # GEMVs of 1-8 rows over 4-bit weights may quantize their activations to int8 and multiply by integer
    # dot products, an opt-in (`kiln compile --decode-activations int8`, module attr kiln_int8_decode):
    # the x86-64 CPUs with AVX2, AArch64 with the dot product (targets/cpu/int8_gemv.py).
    int8_decode: bool = False
    # LLVM features such a build adds to the target: what its kernel needs and the profile's own builds
    # do without (AArch64's "+dotprod", ARMv8.2: the artifact then runs only where the CPU has it).
    int8_features: tuple[str, ...] = ()
    # On the profile of the machine running kiln (DEFAULT_TARGET): kiln's q4 planes of a float weight
    # [N, K] with the given scale dtype, the same bits as compiler/quant_pack's numpy search, faster
    # (targets/cpu/quant_kernel.py); None: the numpy search quantizes.
    q4_quantizer: Callable[[Any, str], dict] | None = field(default=None, compare=False)
    description: str = ""

    def __post_init__(self) -> None:
        if self.export_format not in EXPORT_FORMATS:
            raise ValueError(f"{self.name}: export format {self.export_format!r}; known: {', '.join(EXPORT_FORMATS)}")

    def with_int8_decode(self) -> "TargetProfile":
        """This profile as a `--decode-activations int8` build uses it: int8_features added to its target."""
        if not self.int8_features:
            return self
        mattr = list(self.target.get("mattr", []))
        return dataclasses.replace(self, target={**self.target,
                                                 "mattr": mattr + [f for f in self.int8_features if f not in mattr]})

    def tvm_target(self) -> tvm.target.Target:
        return tvm.target.Target(self.target)

    def passes(self, phase: str) -> list[tvm.transform.Pass]:
        """The passes this target adds to a pipeline phase (see compiler/pipeline.py for where)."""
        if phase not in PHASES:
            raise ValueError(f"unknown pipeline phase {phase!r}; phases: {', '.join(PHASES)}")
        return list(self.phase_passes(self, phase))

    def tuning_space(self) -> TuningSpace | None:
        """The knobs `kiln tune` may search here, or None when the target has none."""
        return self.tuning(self) if self.tuning is not None else None

    def tuning_db_path(self) -> Path | None:
        """The file a compile reads tuned knobs from (it may not exist yet), or None."""
        space = self.tuning_space()
        return space.database_path() if space is not None else None

    @property
    def lib_name(self) -> str:
        return f"lib.{self.export_format}"

    def export(self, executable: Any, path: Path) -> None:
        """Write the built module: a shared object, or a static system library packed as .tar."""
        if self.exporter is not None:
            self.exporter(executable, path)
        else:
            executable.export_library(str(path))
