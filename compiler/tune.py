"""`kiln tune`: search the schedule knobs of a model's hot kernels, measured on this machine.

    kiln tune smollm2 --budget 3     ->  the target's tuning database

The search is generic; what is searched comes from the target's tuning space
(TargetProfile.tuning_space(): its rules, knobs, candidate grid and database).

1. Export the model as compile does (build.export_model); run the pipeline's graph + legalize phases.
2. Collect the distinct PrimFuncs a tunable rule of the space schedules, hottest first: called
   from HOT_ENTRIES (a low-row copy of a kernel counts its original's calls), by weight bytes x calls.
3. Each kernel gets an equal share of the budget left: the defaults, then the space's candidates
   nearest them first, each scheduled by compile's own rules, built alone and timed at the rows
   it serves: m=1 (decode, weights streamed from memory: see _Bench) and m=128 (prefill).  A
   kernel with a low-row copy only runs above the copy's row bound: timed at m=128, the copy at
   m=1 (knobs that only shape many-row calls then stay at their defaults); static-shape kernels
   at their own shape (filed as m=1).  A schedule identical to
   one already timed is skipped; one whose output differs from the default's is rejected.
4. Score: the decode-weighted mean of time / default time.  The best is kept only if, re-timed in
   3 back-to-back pairs with the defaults, it still wins by more than ``min_gain`` (noise); else
   the entry keeps the defaults, so a later run skips the kernel (unless ``retune``).
The database is saved atomically after every kernel: an interrupted run loses nothing.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import tvm
import tvm.s_tir.dlight as dl
import tvm_ffi
from tvm import relax, tirx

from kiln.models.source import usable_cores
from kiln.targets import DEFAULT_TARGET, TargetProfile, TuningSpace, get_profile

from .build import CompileOptions, export_model
from .pipeline import phases

logger = logging.getLogger(__name__)

HOT_ENTRIES = ("batch_decode", "batch_prefill")     # what ModelRunner decodes and prefills with
DECODE_ROWS, PREFILL_ROWS = 1, 128
COLD_BYTES, MAX_COPIES = 64 << 20, 512              # decode timing: weight copies (see _Bench)
_CALL_TIR = ("relax.call_tir", "relax.call_tir_inplace")


@dataclass(frozen=True)
class TuneOptions:
    model: str                          # HF dir, .gguf or .onnx file, or alias, as for compile
    target: str = DEFAULT_TARGET
    quant: str = "auto"                 # tune the kernels of the quantization you compile with
    budget_minutes: float = 10.0        # wall time for the whole run, export included
    retune: bool = False                # search kernels the database already has, too
    decode_weight: float = 0.7          # share of the score given to m=1 when a kernel serves both
    min_gain: float = 0.05              # keep non-default knobs only when > 5% better
    repeat: int = 5                     # timed repeats per measurement (their median is used)
    max_kernels: int | None = None      # tune at most this many kernels (hottest first)

    def __post_init__(self) -> None:
        if not self.budget_minutes > 0:
            raise ValueError(f"--budget must be a positive number of minutes, got {self.budget_minutes}")
        if not (0.0 <= self.decode_weight <= 1.0 and self.min_gain >= 0.0 and self.repeat >= 1):
            raise ValueError(f"bad tuning options: decode_weight={self.decode_weight} (0..1), "
                             f"min_gain={self.min_gain} (>= 0), repeat={self.repeat} (>= 1)")


@dataclass(frozen=True)
class TuneStatus:
    """Progress: kernel i of n, candidate j of m, best gain so far (default / best score)."""
    kernel: int
    kernels: int
    name: str = ""
    candidate: int = 0
    candidates: int = 0
    best_gain: float = 1.0


@dataclass(frozen=True)
class KernelResult:
    name: str
    key: str
    knobs: object                       # what the database now holds for it (the space's knob type)
    improved: bool                      # knobs other than the defaults won by > min_gain
    us: dict[int, float]                # rows -> median microseconds with `knobs`
    default_us: dict[int, float]        # rows -> median microseconds with the defaults
    timed: int                          # distinct schedules built and timed


@dataclass(frozen=True)
class TuneReport:
    db_path: Path
    results: list[KernelResult]
    already_tuned: int                  # kernels skipped: the database had them
    left: int                           # kernels the budget did not reach (run again to go on)
    seconds: float


@dataclass(frozen=True)
class Kernel:
    name: str
    key: str                            # TuningSpace.kernel_key
    func: tirx.PrimFunc                 # unscheduled
    rows: tuple[int, ...]               # the row counts it is timed at
    priority: tuple


def tune_model(opts: TuneOptions, progress: Callable[[TuneStatus], None] | None = None) -> TuneReport:
    """Tune the model's kernels within the budget; returns what was measured and chosen."""
    start = time.perf_counter()
    deadline = start + opts.budget_minutes * 60
    report = progress or (lambda _status: None)
    profile = get_profile(opts.target)
    space = profile.tuning_space()
    if space is None or not profile.runnable_here:
        raise ValueError(f"kiln tune times kernels on this machine; --target {opts.target} "
                         f"{'has no tuning space' if space is None else 'does not run here'} (use --target {DEFAULT_TARGET})")
    exported = export_model(CompileOptions(model=opts.model, target=opts.target, quant=opts.quant))
    # Time with the threads the runtime uses (runtime/model_runner.py): TVM's pool halves the cores unless told.
    os.environ.setdefault("TVM_NUM_THREADS", str(usable_cores()))
    with profile.tvm_target():
        mod = tvm.transform.Sequential([p for name, passes in phases(profile) if name in ("graph", "legalize")
                                        for p in passes])(exported.mod)
    db = space.database()
    kernels = find_kernels(mod, profile, space)
    todo = [k for k in kernels if opts.retune or k.key not in db.entries]
    already, todo = len(kernels) - len(todo), todo[:opts.max_kernels]
    report(TuneStatus(0, len(todo)))
    results: list[KernelResult] = []
    for i, kernel in enumerate(todo):
        now = time.perf_counter()
        if now >= deadline:
            break

        def on_step(j: int, n: int, gain: float, i: int = i, name: str = kernel.name) -> None:
            report(TuneStatus(i + 1, len(todo), name, j, n, gain))

        tuned = _tune_kernel(kernel, profile, space, opts, now + (deadline - now) / (len(todo) - i), on_step)
        if tuned is not None:
            result, db.entries[kernel.key] = tuned
            db.save()
            results.append(result)
    return TuneReport(db.path, results, already, len(todo) - len(results), time.perf_counter() - start)


def find_kernels(mod: tvm.IRModule, profile: TargetProfile, space: TuningSpace) -> list[Kernel]:
    """The distinct PrimFuncs a tunable rule schedules, hottest first.  A low-row copy runs
    where its original is called (rows <= its bound), so it shares the original's calls."""
    target = profile.tvm_target()
    rules = space.rules(lookup=lambda _func: None)
    kernel_key = space.kernel_key
    prims = [(gv.name_hint, f) for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    by_name = _hot_call_counts(mod)
    calls = Counter({kernel_key(f): by_name[name] for name, f in prims if by_name[name]})
    twin = {name: kernel_key(original) for name, f in prims if (original := space.original_of(f)) is not None}
    found: dict[str, Kernel] = {}
    with target:
        for name, func in prims:
            rule = next((r for r in rules if r.apply(func, target, False) is not None), None)
            shapes = [_shape(p) for p in func.params]
            if rule is None or not space.is_tunable(rule) or any(s is None for s in shapes):
                continue
            key = kernel_key(func)
            static = not any(isinstance(d, tirx.Var) for s in shapes for d in s)
            rows = ((DECODE_ROWS,) if static or name in twin else
                    (PREFILL_ROWS,) if key in twin.values() else (DECODE_ROWS, PREFILL_ROWS))
            weight_bytes = sum(math.prod(int(d) for d in s) * tvm_ffi.dtype(str(p.dtype)).itemsize
                               for p, s in zip(func.params, shapes) if all(isinstance(d, tirx.IntImm) for d in s))
            n_calls = calls[twin.get(name, key)]
            priority = (n_calls > 0, n_calls * weight_bytes, weight_bytes)
            if key not in found or found[key].priority < priority:
                found[key] = Kernel(name, key, func, rows, priority)
    return sorted(found.values(), key=lambda k: k.priority, reverse=True)


def score(us: dict[int, float], default_us: dict[int, float], decode_weight: float) -> float:
    """Weighted mean of us / default_us over the row counts timed (m=1 weighs decode_weight)."""
    weights = {m: decode_weight if m == DECODE_ROWS else 1.0 - decode_weight for m in us}
    return sum(weights[m] * us[m] / default_us[m] for m in us) / sum(weights.values())


def _tune_kernel(kernel: Kernel, profile: TargetProfile, space: TuningSpace, opts: TuneOptions, deadline: float,
                 on_step: Callable[[int, int, float], None]) -> tuple[KernelResult, object] | None:
    bench = _Bench(kernel, profile, space, opts.repeat)
    default = space.default_knobs(kernel.func)
    default_us = bench.measure(default)
    if default_us is None:
        logger.warning("kiln tune: %s does not schedule with the default knobs; skipped", kernel.name)
        return None
    grid = space.candidates(default, rows_tile=PREFILL_ROWS in kernel.rows)
    best, best_score = default, 1.0
    for j, knobs in enumerate(grid, 1):
        if time.perf_counter() >= deadline:
            break
        us = bench.measure(knobs)
        if us is not None and score(us, default_us, opts.decode_weight) < best_score:
            best, best_score = knobs, score(us, default_us, opts.decode_weight)
        on_step(j, len(grid), 1.0 / best_score)
    chosen, us = default, default_us
    if best != default:     # confirm with 3 back-to-back pairs (alternating order): the median pair decides
        pairs = []
        for i in range(3):
            t = {k: bench.time(k) for k in ((default, best) if i % 2 == 0 else (best, default))}
            pairs.append((t[default], t[best]))
        default_us, us = ({m: statistics.median(p[i][m] for p in pairs) for m in kernel.rows} for i in (0, 1))
        paired = statistics.median(score(b, d, opts.decode_weight) for d, b in pairs)
        if max(paired, score(us, default_us, opts.decode_weight)) < 1.0 - opts.min_gain:
            chosen = best
        else:
            us = default_us
    result = KernelResult(kernel.name, kernel.key, chosen, chosen != default, us, default_us, len(bench.times))
    return result, space.entry(chosen, us, default_us, kernel.name)


class _Bench:
    """One kernel's candidates: scheduled as compile would, built alone, timed on fixed random inputs.

    At m=1 the calls cycle through copies of the weights (the static-shape inputs) adding up to
    COLD_BYTES, more than the L3 cache: each call streams its weights from memory, as in a decode
    step over the whole model (a hot-cache GEMV is up to 2x faster and ranks knobs differently).
    The prefill row count reuses each weight tile many times: one copy."""

    def __init__(self, kernel: Kernel, profile: TargetProfile, space: TuningSpace, repeat: int) -> None:
        self.kernel, self.space, self.repeat = kernel, space, repeat
        self.target = profile.tvm_target()
        rng = np.random.default_rng(0)
        self.args: dict[int, list[list]] = {}          # rows -> argument sets the calls cycle through
        for m in kernel.rows:
            arrays = [_random_array(p, m, rng) for p in kernel.func.params]
            weights = [all(isinstance(d, tirx.IntImm) for d in p.shape) for p in kernel.func.params]
            weight_bytes = sum(a.nbytes for a, w in zip(arrays, weights) if w) or 1
            copies = min(MAX_COPIES, math.ceil(COLD_BYTES / weight_bytes)) if m == DECODE_ROWS else 1
            first = [tvm.runtime.tensor(a) for a in arrays]
            self.args[m] = [first] + [[tvm.runtime.tensor(a) if w else t for a, w, t in zip(arrays, weights, first)]
                                      for _ in range(copies - 1)]
        self.reference: dict[int, list[np.ndarray]] = {}      # the default knobs' results
        self.libs: dict[object, tvm.runtime.Module] = {}
        self.times: dict[object, dict[int, float]] = {}
        self.seen: set[str] = set()

    def measure(self, knobs) -> dict[int, float] | None:
        """Median us per row count; None if the knobs do not schedule the kernel, give a
        schedule already timed, or compute a different result than the defaults."""
        with self.target:
            rules = self.space.rules(lookup=lambda _func: knobs)
            func = dl.ApplyDefaultSchedule(*rules)(tvm.IRModule({"main": self.kernel.func}))["main"]
        identity = self.space.kernel_key(func)
        if self.space.marker_attr not in func.attrs or identity in self.seen:
            return None
        self.seen.add(identity)
        lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=self.target)
        self.libs[knobs] = lib.jit()
        for m, (args, *_copies) in self.args.items():
            self.libs[knobs]["main"](*args)
            values = [a.numpy() for a in args]
            if not self.reference.get(m):
                self.reference[m] = values
            elif not all(_close(v, r) for v, r in zip(values, self.reference[m])):
                logger.warning("kiln tune: %s with %s computes a different result; rejected", self.kernel.name, knobs)
                return None
        self.times[knobs] = self.time(knobs)
        return self.times[knobs]

    def time(self, knobs) -> dict[int, float]:
        """Median microseconds per call over ``repeat`` rounds of >= 10 ms, cycling the argument
        sets (the ~1 us a call from Python adds is the same for every candidate)."""
        fn, out = self.libs[knobs]["main"], {}
        for m, arg_sets in self.args.items():
            for args in arg_sets:                  # warm-up: every copy paged in
                fn(*args)
            rounds = []
            for _ in range(self.repeat):
                calls, start = 0, time.perf_counter()
                while calls == 0 or time.perf_counter() - start < 0.01:
                    for args in arg_sets:
                        fn(*args)
                    calls += len(arg_sets)
                rounds.append((time.perf_counter() - start) / calls)
            out[m] = statistics.median(rounds) * 1e6
        return out


def _hot_call_counts(mod: tvm.IRModule) -> Counter:
    """PrimFunc name -> call_tir sites in the HOT_ENTRIES Relax functions."""
    counts: Counter = Counter()

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in _CALL_TIR:
            counts[expr.args[0].name_hint] += 1

    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and gv.name_hint in HOT_ENTRIES:
            relax.analysis.post_order_visit(func, visit)
    return counts


def _shape(param: tirx.Var) -> list | None:
    """A buffer parameter's dims if each is static or a plain symbolic var (the rows); else None."""
    try:
        dims = list(param.shape)
    except AttributeError:                  # a scalar parameter
        return None
    return dims if all(isinstance(d, (tirx.IntImm, tirx.Var)) for d in dims) else None


def _random_array(param: tirx.Var, rows: int, rng: np.random.Generator) -> np.ndarray:
    shape = [rows if isinstance(d, tirx.Var) else int(d) for d in param.shape]
    dtype = str(param.dtype)
    if dtype.startswith("float"):
        return rng.uniform(-1.0, 1.0, shape).astype(dtype)
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return np.zeros(shape, dtype)


def _close(value: np.ndarray, reference: np.ndarray) -> bool:
    if not np.issubdtype(reference.dtype, np.floating):
        return bool(np.array_equal(value, reference))
    tol = 1e-3 if reference.dtype == np.float32 else 3e-2
    scale = max(1.0, float(np.abs(reference).max(initial=0.0)))
    return float(np.abs(value.astype(np.float64) - reference).max(initial=0.0)) <= tol * scale
