"""What every GPU family shares: dlight's GPU schedule rules, and the passes a GPU profile adds.

CUDA, ROCm, Metal, OpenCL and WebGPU take the same rule list; each family module only sets its
TVM target (warp size, shared memory, thread limits), its host and its export format, and dlight
sizes its schedules from those limits.
"""

from __future__ import annotations

import functools
import importlib
import math
import sys
from unittest import mock

import tvm
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.base import get_extent
from tvm.s_tir.dlight.gpu import matmul as _dlight_matmul

from kiln.compiler.tvmscript import quick_frames

from .add_rms_norm import gpu_row_split, match_add_norm
from .attention_softcap import SoftcapTVMAttention
from .dequant_match import has_epilogue
from .glu_epilogue import apart, joined
from .kiln_attention import UseKilnAttention
from .narrow_tiles import NarrowTensorCoreMatmul
from .norm_prologue import has_norm, match_norm
from .row_dispatch import dispatch_on_rows, is_scheduled, one_row, output_rows, over_params
from .schedule_memo import ScheduleOnce
from .workspace_outputs import WorkspaceOutputs


@functools.cache
def tensorize_works() -> bool:
    """Whether s_tir Tensorize can run in this process.

    Tensorize deep-copies each intrinsic through TVM's JSON serializer. apache-tvm 0.27.0.post1 asks
    for apache-tvm-ffi>=0.1.14.post0, and 0.1.15 segfaults serializing any TIR node with a dtype
    field (a PrimType, an IntImm), so every tensorized schedule (CUDA's tensor cores; Metal's
    simdgroup matrices, which kiln skips for another reason: Matmul) killed the compile. pyproject
    pins 0.1.14.post1; with another tvm-ffi the tensor cores stay off and the matmuls take dlight's
    SIMT schedule, slower but built."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        parts = version("apache-tvm-ffi").split(".")[:3]
        return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in parts) < (0, 1, 15)
    except PackageNotFoundError:
        return False


def load_tensor_core_intrinsics() -> None:
    """Import TVM's CUDA tensor-core intrinsics (dlight's tensor-core matmul imports them on its
    first use) with TVMScript's source lookups cut short.

    The module parses ~250 TVMScript functions at import, and each `@T.prim_func` calls
    inspect.stack(), which reads the source line of every frame on the stack (getsourcefile scans
    sys.modules per frame): 25 s with TVM alone, 40 s once torch is loaded. Under
    compiler/tvmscript.quick_frames, torch loaded: 6.3 s on a 2-core Zen 3, the parsing itself."""
    if "tvm.s_tir.tensor_intrin.cuda" in sys.modules:
        return
    with quick_frames():
        importlib.import_module("tvm.s_tir.tensor_intrin.cuda")


@tvm.transform.module_pass(opt_level=0, name="kiln.NoTensorCores")
def no_tensor_cores(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Mark every PrimFunc `dlight.do_not_tensorize` (where tensorize_works() is false)."""
    out = tvm.IRModule(attrs=mod.attrs)
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            func = func.with_attr("dlight.do_not_tensorize", True)
        out[gv] = func
    return out


def _no_simdgroup(*_args, **_kwargs):
    raise NotImplementedError("simdgroup matmul disabled")


class Matmul(dl.gpu.Matmul):
    """dlight's GPU matmul: tensor cores on CUDA sm_70+ for float16 with every dimension above 64 or
    symbolic (prefill, batches), a SIMT tiled schedule elsewhere, never Metal's simdgroup path.

    On Metal dl.gpu.Matmul first tries MetalMatmul (simdgroup matrices). With the tvm-ffi pin it no
    longer crashes, but it builds nothing here: on kiln's float16 matmuls (float32 sums) it fails and
    falls back to SIMT, after re-parsing its intrinsics' TVMScript on every call (measured: a
    float16 256x512 projection took 25.8 s to build with it and produced no simdgroup code; the tiny
    Llama's Metal build 30.5 s against 4.5 s without it). So it is skipped (dl.gpu.Matmul takes the
    SIMT schedule when that rule raises)."""

    def apply(self, func, target, tunable):
        if target.kind.name == "cuda":               # MatmulTensorization imports them: 25-40 s unpatched
            load_tensor_core_intrinsics()
        if target.kind.name != "metal":
            return super().apply(func, target, tunable)
        with mock.patch.object(_dlight_matmul.MetalMatmul, "apply", _no_simdgroup):
            return super().apply(func, target, tunable)


class AddRMSNorm(dl.gpu.base.GPUScheduleRule):
    """The fused ``y = x + r; n = rms_norm(y, w)`` kernel (compiler/passes/fuse_add_rms_norm.py):
    one thread block per row, its threads striding over the row, the sum of squares a
    cross-thread reduction, rsqrt recomputed where the scale uses it.

    dlight has no rule for it (GeneralReduction refuses a first block that writes an output),
    so it fell to Fallback: a serial loop over each row, 83 us per call on an H100 at batch 1
    (issue 10). Each thread reads back only the elements of y it wrote itself (the add, the
    reduction and the scale split the row the same way), so no barrier is needed on y.

    A thread takes VECTOR_LANES consecutive elements at a time where the row's width divides (one
    vector load or store each), its passes over the row unrolled: in the cuda-sm90 SASS of the 8B's
    4096-wide float16 rows, 16 loads and 8 stores of 64 bits a thread where one element at a time
    took 48 and 32 of 16 bits (the H200 ran those at 3.0 us a call, 64 calls a step: 0.19 of the
    2.35 ms the GPU was busy; the vector kernel's time is unmeasured).
    """

    def apply(self, func, target, _tunable):
        if not isinstance(func, tvm.tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = tvm.s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        match = match_add_norm(sch, blocks, func.params)
        if match is None or len(blocks) != 4:
            return None
        reduction, rows = match
        first, _, scale, norm = blocks
        if not sch.get(reduction).same_as(sch.get(blocks[1])):
            return None
        sch.compute_inline(scale)                              # rsqrt, per element of the scale
        row_loops = sch.get_loops(first)[:rows]
        extents = [get_extent(sch, loop) for loop in sch.get_loops(first)[rows:]]
        width = math.prod(extents) if all(isinstance(e, int) for e in extents) else None    # a row's elements
        bits = tvm.runtime.DataType(sch.get(first).writes[0].source.dtype).bits
        threads, vec = gpu_row_split(width, bits, int(target.max_num_threads))
        row = sch.fuse(*row_loops) if rows > 1 else row_loops[0]
        for block in (reduction, norm):
            sch.reverse_compute_at(block, row)
        sch.set_scope(reduction, 0, "shared")
        sch.bind(row, "blockIdx.x")
        for block in (first, reduction, norm):
            inner = sch.get_loops(block)[1:]
            serial, tx, lanes = sch.split(sch.fuse(*inner) if len(inner) > 1 else inner[0], [None, threads, vec])
            sch.reorder(tx, serial)                            # element (o * threads + tx) * vec + lane
            sch.bind(tx, "threadIdx.x")
            sch.unroll(serial)
            if block is reduction:
                sch.unroll(lanes)
            elif vec > 1:
                sch.vectorize(lanes)
        return sch


class Tolerant(dl.gpu.base.GPUScheduleRule):
    """A dlight rule whose analysis asserting on a function it does not fit means "not this rule":
    the next one is tried. dlight's GEMV and Reduction analyses assert that every read region is a
    point (detect_dominant_read), which a matmul reading its weight rows through an index does not
    hold (models/moe.py's expert matmul: `w[experts[t, j], n, r]`); uncaught, that killed the compile."""

    def __init__(self, rule) -> None:
        self.rule = rule

    def apply(self, func, target, tunable):
        try:
            return self.rule.apply(func, target, tunable)
        except (RuntimeError, ValueError, AssertionError):
            return None


def gpu_schedule_rules() -> list:
    """dlight's GPU rules, most specific first, after kiln's own for the kernels it emits."""
    return [AddRMSNorm(), Matmul(), *(Tolerant(rule) for rule in (
        dl.gpu.GEMV(), dl.gpu.LowBatchGEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction())), dl.gpu.Fallback()]


class OneRowGEMV:
    """dlight's GEMV rule (or the given rules, the first that applies) for a call of one row: the rule
    matches only a static row, so it schedules the function with its rows bound to 1, over the
    original buffers' first row (row_dispatch over_params). Measured (H100, 8B-architecture q4f16,
    batch 1): a decode step took 6.45 ms through batch_decode (LowBatchGEMV's 2-row bucket) and
    3.87 ms through the static `decode` entry, whose matmuls dlight's GEMV schedules (issue 10)."""

    def __init__(self, *rules) -> None:
        self.rules = rules or (dl.gpu.GEMV(),)  # rules for one static row, the first that applies wins

    def apply(self, func, target, tunable):
        try:
            bound = one_row(func)
        except (RuntimeError, ValueError):                        # rows TVM cannot bind: no branch
            return None
        if bound is None:
            return None
        for rule in self.rules:
            try:
                sch = rule.apply(bound, target, tunable)
            except (RuntimeError, ValueError, AssertionError):    # not a GEMV at one row
                continue
            if isinstance(sch, tvm.s_tir.Schedule):
                return over_params(func, sch.mod["main"])
        return None

    def for_epilogues(self) -> "OneRowGEMV | None":
        return _taking(self, "takes_epilogues")

    def for_norms(self) -> "OneRowGEMV | None":
        return _taking(self, "takes_norms")


class FirstOf:
    """The first of `rules` that schedules the function (a LOW_BATCH_BRANCHES entry: a kiln rule for
    the layers it knows, dlight's bucket for the others)."""

    def __init__(self, *rules) -> None:
        self.rules = rules

    def apply(self, func, target, tunable):
        for rule in self.rules:
            sch = rule.apply(func, target, tunable)
            if sch is not None:
                return sch
        return None

    def without_workspace(self) -> "FirstOf":
        return FirstOf(*(getattr(r, "without_workspace", lambda r=r: r)() for r in self.rules))

    def for_epilogues(self) -> "FirstOf | None":
        return _taking(self, "takes_epilogues")

    def for_norms(self) -> "FirstOf | None":
        return _taking(self, "takes_norms")


def _taking(rule, what: str):
    """`rule` (OneRowGEMV or FirstOf) over those of its rules that say `what`: takes_epilogues (they
    compute a matmul's epilogue: the MMA GEMV; targets/glu_epilogue.py) or takes_norms (an add +
    RMSNorm before it: targets/norm_prologue.py); None where it has none."""
    rules = [r for r in rule.rules if getattr(r, what, False)]
    return type(rule)(*rules) if rules else None


# Matmuls over symbolic rows: (most rows, dlight LowBatchGEMV bucket or a schedule rule) per branch,
# the tiled matmul above the last bound (the split MLC-LLM's LowBatchGemvSpecialize uses).
# Rules that do not apply on a target (the MMA GEMV and tensor-core tiles elsewhere than CUDA) leave
# their branch out. A branch's schedule may add workspace outputs (split K) only in kernels whose rows
# are bounded by this many (batch_decode's sequences), not prefill's chunk: the workspace is planned
# at the bound.
WORKSPACE_ROWS = 256
SPLIT_BLOCKS = 1024     # the 5-64-row tiles split K to about this many thread blocks


def low_batch_branches(gemv=None, wide=(8, 16), tiles=None) -> tuple:
    """LowBatchGEMV's branches: `gemv(b)` (kiln's GEMV rules for b rows, the first that applies;
    default the MMA GEMV for the 4-bit then the 8-bit layers, targets/mma_gemv.py) before dlight's
    GEMV at 1 row and its LowBatchGEMV buckets at 2 and 3-4, before `tiles` in the `wide` buckets,
    and `tiles` alone to 64 rows (default the 32 x 32 tensor-core tiles, K split to SPLIT_BLOCKS
    blocks). tools/gpu_checks.py `variants` builds others through the same arguments.

    Measured, 2 layers of the 8B-architecture model, q4f16, matmul GPU time a decode step (H100,
    2026-11-26): the 32 x 32 tiles took 0.71 ms at 16 rows, 0.73 at 32 and 1.03 at 64 where dlight's
    128 x 128 tiles took 1.43-1.44; LowBatchGEMV's 4-row bucket 0.64 at 4 rows, 1.20 at 8. The whole
    8B (H200, 2026-11-28, one run, tools/gpu_checks.py `all`): these branches (with the library
    GEMM from 32 sequences, as shipped then) against dlight's GEMVs to 4 rows and unsplit tiles
    above: batch-1 decode 323.5 against 280.1 tok/s, 16 sequences 3,437 against 1,347, 64 sequences
    4,980 against 3,756; logits within 0.04 (2 of 64 rows' argmax moved, at batch 64, where the
    logits of this random-weight model differ by less than that).

    At one row the MMA GEMV issues all of an iteration's weight loads before its MMAs (`loads_first`,
    a block-scope fence): the whole 8B at batch 1 (H200, 2026-12-04, tools/gpu_checks.py `all`'s
    `lever8b`, one process each) 355.1 tok/s against 340.6 without, its matmuls 1.77 against 1.98
    ms a step (CUPTI), the logits bit for bit the same. At 2-16 rows it is unmeasured (the
    `loadsfirst` variant), so they keep the kernel without the fence."""
    from .mma_gemv import MMAGEMV
    gemv = gemv or (lambda b: [MMAGEMV(bits, batch=b, loads_first=b == 1) for bits in (4, 8)])
    tiles = tiles or NarrowTensorCoreMatmul(warp_rows=2, warp_cols=2, target_blocks=SPLIT_BLOCKS)
    return ((1, OneRowGEMV(*gemv(1), dl.gpu.GEMV())),
            *((b, FirstOf(*gemv(b), dl.gpu.LowBatchGEMV(b))) for b in (2, 4)),
            *((b, FirstOf(*gemv(b), tiles)) for b in wide),
            (64, tiles))


LOW_BATCH_BRANCHES = low_batch_branches()


@tvm.transform.module_pass(opt_level=0, name="kiln.LowBatchGEMV")
class LowBatchGEMV:
    """Matmuls over a symbolic row count get GEMV schedules for few rows (targets/row_dispatch.py).

    batch_decode's matmuls are `[batch_size, 1, K] x [N, K]`: with batch_size symbolic, dlight's
    GEMV rule does not match and its Matmul rule takes them, a tiled schedule that at one row
    keeps most threads idle and re-reads the weights through shared memory: the 4-bit matmuls of
    an 8B model streamed 65-130 GB/s of an H100's 3,350 (issue 10). Each such PrimFunc is
    scheduled `len(branches) + 1` times, by dlight's LowBatchGEMV (rows padded to its bucket) and
    by the tiled Matmul, and the schedules become one kernel that branches on the rows.
    Prefill's matmuls (rows = seq_len) get the same branches: short chunks take the GEMV.

    `narrow_index`: the merged kernel computes its indices in int32 (TVM's ForceNarrowIndexToInt32),
    and a matmul whose buffers could hold 2**31 elements or more at the entry functions' bounds
    keeps the tiled schedule alone (targets/rocm.py says why it needs this).
    """

    def __init__(self, branches=None, narrow_index: bool = False) -> None:
        # LOW_BATCH_BRANCHES read here, not bound at import: tools/gpu_checks.py `variants` builds others.
        self.branches = tuple(branches if branches is not None else LOW_BATCH_BRANCHES)
        self.narrow_index = narrow_index

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=False)
        bounds = _symbolic_bounds(mod)
        out = tvm.IRModule(attrs=mod.attrs, global_infos=mod.global_infos)
        for gv, func in mod.functions_items():
            if isinstance(func, tvm.tirx.PrimFunc) and not is_scheduled(func) and output_rows(func) is not None:
                if not self.narrow_index or _fits_int32(func, bounds):
                    func = self._dispatch(func, target, bounds) or func
            out[gv] = func
        return out

    def _dispatch(self, func, target, bounds):
        merged = self._merged(func, target, bounds)
        if merged is None or not self.narrow_index:
            return merged
        gv = tvm.ir.GlobalVar("main")
        return tvm.tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({gv: merged}))[gv]

    def _merged(self, func, target, bounds):
        if has_norm(func):
            return self._with_norm(func, target, bounds)
        if has_epilogue(func):
            return self._with_epilogue(func, target, bounds)
        count = output_rows(func)
        # A workspace is planned at the rows' bound, used only at a branch's few rows: none where
        # that bound is large (prefill's chunk) or unknown.
        small = isinstance(count, tvm.tirx.Var) and bounds.get(count.name, WORKSPACE_ROWS + 1) <= WORKSPACE_ROWS
        branches = []
        for rows, rule in self.branches:
            if not small and hasattr(rule, "without_workspace"):
                rule = rule.without_workspace()
            # A bucket: dlight's LowBatchGEMV; else a schedule rule (a Schedule of func, or a PrimFunc
            # over its params), whose branch is left out where it does not apply (a tensor-core rule
            # on a target without tensor cores).
            sch = (dl.gpu.LowBatchGEMV(rule) if isinstance(rule, int) else rule).apply(func, target, False)
            if isinstance(sch, tvm.s_tir.Schedule):
                sch = sch.mod["main"]
            if isinstance(sch, tvm.tirx.PrimFunc):
                branches.append((rows, sch))
            elif isinstance(rule, int):
                return None
        tiled = Matmul().apply(func, target, False)
        if not isinstance(tiled, tvm.s_tir.Schedule):
            return None
        merged = dispatch_on_rows(func, branches, tiled.mod["main"], thread_invariant=True)
        return merged.with_attr("tirx.is_scheduled", True)

    def _with_epilogue(self, func, target, bounds):
        """A matmul whose cast sums feed a gated activation (targets/glu_epilogue.py): the branches whose
        rules compute it (the MMA GEMV's, 1-16 rows), above them its head's usual branches and its
        tail's elementwise kernel, two kernels."""
        parts = apart(func)
        if parts is None:
            return None
        head, tail, sums = parts
        branches, above = self._taken(func, target, "for_epilogues")
        head = above._merged(head, target, bounds)
        tail = dl.gpu.Fallback().apply(tail, target, False)
        if head is None or not isinstance(tail, tvm.s_tir.Schedule):
            return None
        merged = dispatch_on_rows(func, branches, joined(func, head, tail.mod["main"], sums), thread_invariant=True)
        return merged.with_attr("tirx.is_scheduled", True)

    def _with_norm(self, func, target, bounds):
        """A matmul of an add + RMSNorm's rows (targets/norm_prologue.py): the branches whose rules
        compute the norm as their prologue (the MMA GEMV's, 1-4 rows), above them the norm's kernel
        (AddRMSNorm) and the matmul's usual branches (an epilogue's too), two kernels."""
        found = match_norm(func)
        if found is None:
            return None
        branches, above = self._taken(func, target, "for_norms")
        head = AddRMSNorm().apply(found.head, target, False)
        tail = above._merged(found.tail, target, bounds)
        if not isinstance(head, tvm.s_tir.Schedule) or tail is None:
            return None
        both = joined(func, head.mod["main"], tail, found.normed)
        return dispatch_on_rows(func, branches, both, thread_invariant=True).with_attr("tirx.is_scheduled", True)

    def _taken(self, func, target, which: str):
        """(branches, above): the branches whose rules' `which` (for_epilogues, for_norms) schedule
        func whole, and a LowBatchGEMV of the branches above the rows those cover."""
        branches = []
        for rows, rule in self.branches:
            rule = None if isinstance(rule, int) else getattr(rule, which, lambda: None)()
            sch = rule.apply(func, target, False) if rule is not None else None
            if isinstance(sch, tvm.s_tir.Schedule):
                sch = sch.mod["main"]
            if isinstance(sch, tvm.tirx.PrimFunc):
                branches.append((rows, sch))
        covered = max((rows for rows, _ in branches), default=0)
        return branches, LowBatchGEMV([b for b in self.branches if b[0] > covered], self.narrow_index)


def _symbolic_bounds(mod: tvm.IRModule) -> dict[str, int]:
    """The largest value each symbolic size takes at any entry function's bound (compiler/spec.py)."""
    bounds: dict[str, int] = {}
    for _, func in mod.functions_items():
        if isinstance(func, tvm.relax.Function) and func.attrs is not None and "tir_var_upper_bound" in func.attrs:
            for name, value in func.attrs["tir_var_upper_bound"].items():
                bounds[str(name)] = max(bounds.get(str(name), 0), int(value))
    return bounds


def _fits_int32(func: tvm.tirx.PrimFunc, bounds: dict[str, int]) -> bool:
    """Every buffer of `func` holds fewer than 2**31 elements with its symbolic sizes at their bounds."""
    for param in func.params:
        if getattr(param, "shape", None) is None:
            continue                                           # a scalar
        elements = 1
        for dim in param.shape:
            if isinstance(dim, tvm.tirx.IntImm):
                elements *= int(dim)
            elif isinstance(dim, tvm.tirx.Var) and dim.name in bounds:
                elements *= bounds[dim.name]
            else:
                return False
        if elements >= 2 ** 31:
            return False
    return True


# Target kinds whose KV cache decodes through targets/decode_attention.py instead of TVM's kernel
# (CUDA: on the H100 kiln's took 8 us a call at batch 1 where TVM's took 17, 1/23 of TVM's time after
# a 4,000-token prompt; the others keep TVM's until a device of theirs measures the swap).
DECODE_ATTENTION_KINDS = ("cuda",)
# Target kinds whose KV cache prefills (ragged and paged) through targets/prefill_attention.py
# (CUDA: TVM's ragged prefill took 22.7 of the 8B's 168 ms of GPU time for 16 x 128 tokens on the
# H100, 3 TFLOP/s; kiln's is unmeasured there: if measure8b's `prefill 16 x 128 kernels` shows more
# than that for batch_prefill_ragged_kv_kernel, empty this).
PREFILL_ATTENTION_KINDS = ("cuda",)


def gpu_phase_passes(profile, phase: str, narrow_index: bool = False) -> list:
    """A GPU profile's additions to the pipeline phases (compiler/pipeline.py); `narrow_index`:
    LowBatchGEMV's kernels index in int32 (see there)."""
    if phase != "schedule":
        return []
    passes = [LowBatchGEMV(narrow_index=narrow_index), WorkspaceOutputs(),
              ScheduleOnce(*gpu_schedule_rules())]
    kind = profile.target.get("kind")
    passes.insert(0, SoftcapTVMAttention())         # Gemma 2: TVM's kernels that stay cap their scores
    if kind in DECODE_ATTENTION_KINDS or kind in PREFILL_ATTENTION_KINDS:
        passes.insert(0, UseKilnAttention(kind in DECODE_ATTENTION_KINDS, kind in PREFILL_ATTENTION_KINDS))
    if not tensorize_works():
        return [no_tensor_cores, *passes]
    if kind == "cuda":
        load_tensor_core_intrinsics()
    return passes


@tvm.transform.module_pass(opt_level=0, name="kiln.RewriteCUDAGraph")
def rewrite_cuda_graph(mod: tvm.IRModule, ctx) -> tvm.IRModule:
    """TVM's RewriteCUDAGraph, switched on: alone it does nothing unless the PassContext sets
    `relax.backend.use_cuda_graph`. It captures the regions whose memory is planned statically
    (compiler/spec.py bound_shapes); batch_decode's once per batch size."""
    for gv, func in list(mod.functions_items()):
        if gv.name_hint == "batch_decode" and isinstance(func, tvm.relax.Function):
            mod[gv] = func.with_attr("relax.rewrite_cuda_graph.capture_symbolic_vars", ["batch_size"])
    config = {**ctx.config, "relax.backend.use_cuda_graph": True}
    with tvm.transform.PassContext(opt_level=ctx.opt_level, config=config):
        return tvm.relax.transform.RewriteCUDAGraph()(mod)


def cuda_graph_phase_passes(profile, phase: str) -> list:
    """gpu_phase_passes, plus decode captured as CUDA graphs where the runtime supports them (unless the
    profile turns cuda_graphs off), and the kernels launched as programmatic dependents where the
    profile says (dependent_launch)."""
    if phase == "finalize":
        return [rewrite_cuda_graph] if profile.cuda_graphs else []
    if phase == "lower" and profile.dependent_launch:
        from .dependent_launch import dependent_launch
        return [dependent_launch]
    return gpu_phase_passes(profile, phase)
