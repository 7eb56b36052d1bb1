"""The compile pipeline: one ordered list of phases, an IR dump after each.

    graph      kiln's Relax rewrites before lowering (transpose-matmul fusion, ...)
    legalize   Relax ops -> TIR PrimFuncs, then operator fusion
    schedule   the target's TIR schedules (its rules or a tuned database)
    lower      dataflow -> VM-level Relax
    finalize   memory planning and VM lowering

`kiln compile --dump-ir DIR` writes DIR/<n>-<phase>.py (TVMScript) after each phase.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import tvm
from tvm import relax

from kiln.targets import TargetProfile

from .passes.accumulate_f32 import AccumulateInFloat32
from .passes.clip_take import ClipTake
from .passes.constant_fills import ConstantFills
from .passes.fuse_add_rms_norm import FuseAddRMSNorm
from .passes.fuse_dequantize_matmul import FuseDequantizeMatmul
from .passes.fuse_norm_matmul import FuseNormIntoMatmul
from .passes.fuse_dequantize_take import FuseDequantizeTake
from .passes.keep_params import KeepParamsAlive
from .passes.library_gemm import LibraryGEMM
from .tvmscript import quick_frames


def legalize_passes() -> list[tvm.transform.Pass]:
    """Relax ops -> TIR PrimFuncs, then TVM's operator fusion: the target-independent part of the
    legalize phase (also what tests and the kernel benchmarks in tools/ run before a schedule rule)."""
    return [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
    ]


def phases(profile: TargetProfile) -> list[tuple[str, list[tvm.transform.Pass]]]:
    """The phases in order; `profile.passes(phase)` is where the target's own passes go in each."""
    return [
        ("graph", [
            # Float16 matmuls sum in float32 (weights and activations stay float16 in memory).
            AccumulateInFloat32(),
            # nn.Linear emits matmul(x, permute_dims(W)); fused, W is read in place, never re-transposed.
            relax.transform.FuseTransposeMatmul(),
            # batch_prefill_gemm's token matmuls to the device's BLAS (profiles with library_gemm).
            *([LibraryGEMM()] if profile.library_gemm else []),
            # Quantized weights: dequantize fused into its matmul / embedding gather (one kernel each).
            FuseDequantizeMatmul(glu_epilogue=profile.glu_epilogue),
            FuseDequantizeTake(),
            # Residual add + the RMSNorm over the sum: one kernel writing both (see its docstring).
            FuseAddRMSNorm(),
            # ... and in batch_decode the matmul reading the norm with it, one group (profiles with norm_prologue).
            *([FuseNormIntoMatmul()] if profile.norm_prologue else []),
            # Gathers clamp their indices (no out-of-range reads, no TOPI warning per compile).
            ClipTake(),
            # Fills of a static shape as the constants they make (not compiled and run by FoldConstant).
            ConstantFills(),
            *profile.passes("graph"),
            relax.transform.DeadCodeElimination(),
        ]),
        ("legalize", [
            *legalize_passes(),
            *profile.passes("legalize"),
        ]),
        ("schedule", [
            # The target's TIR schedules (its rules, tuned knobs) and kernel swaps.
            *profile.passes("schedule"),
        ]),
        ("lower", [
            *profile.passes("lower"),
            relax.transform.RewriteDataflowReshape(),
            relax.transform.ToNonDataflow(),
            relax.transform.RemovePurityChecking(),
            relax.transform.CallTIRRewrite(),
        ]),
        ("finalize", [
            relax.transform.StaticPlanBlockMemory(),
            *profile.passes("finalize"),
            relax.transform.LowerAllocTensor(),
            relax.transform.KillAfterLastUse(),
            KeepParamsAlive(),
            relax.transform.LowerRuntimeBuiltin(),
            relax.transform.ComputePrimValue(),
            relax.transform.VMShapeLower(),
            relax.transform.AttachGlobalSymbol(),
        ]),
    ]


def build_pipeline(profile: TargetProfile, dump_dir: Path | None = None,
                   progress: Callable[[str, float], None] | None = None) -> tvm.transform.Pass:
    """A module pass that runs every phase in order under the profile's target (and quick_frames:
    the schedule phase parses kiln's kernels)."""

    @tvm.transform.module_pass(opt_level=0, name="kiln_pipeline")
    def _pipeline(mod: tvm.ir.IRModule, _ctx: tvm.transform.PassContext) -> tvm.ir.IRModule:
        for i, (name, passes) in enumerate(phases(profile)):
            start = time.perf_counter()
            with quick_frames():
                mod = tvm.transform.Sequential(passes, name=name)(mod)
            if progress:
                progress(name, time.perf_counter() - start)
            if dump_dir is not None:
                dump_dir.mkdir(parents=True, exist_ok=True)
                (dump_dir / f"{i}-{name}.py").write_text(mod.script(show_meta=False))
        return mod

    return _pipeline
