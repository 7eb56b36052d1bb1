"""The per-target tuning database: schedule knobs `kiln tune` measured best, per kernel.

Where it lives::

    $KILN_CACHE_DIR/tuning/<profile>-<hash>.json      (KILN_CACHE_DIR unset: ~/.cache/kiln)

the same root as ``kiln.cache_dir()``; ``<hash>`` is 12 hex digits of the sha256 of the TVM
target dict (kind, mcpu, mattr, mtriple, num-cores, ...), so a database is only ever applied to
the target it was measured on.  ``kiln compile`` reads it through ``TuningDB.lookup`` (a
``KnobLookup`` for the ``Tuned`` rules below); compiler/tune.py writes it through
``CPUTuning``, the CPU profile's tuning space.

The format (version 1)::

    {"version": 1, "target": {<the TVM target dict>},
     "entries": {<kernel key>: {"knobs": {"tile_m": 4, "tile_n": 2, "unroll_k": 1, "vector_lanes": 16},
                                "us_m1": 41.2, "us_m128": 2101.0,          # median us, tuned knobs
                                "default_us_m1": 44.0, "default_us_m128": 2390.5,
                                "tuned_at": "2025-01-01T12:00:00+00:00", "function": "NT_matmul5"}}}

A kernel key is the structural hash of the unscheduled PrimFunc (``kernel_key``): the same for
every recompile of a model and shared by identical kernels of every layer (or model).  ``us_*``
is None for a row count the kernel does not serve; a kernel whose default knobs won keeps them
(so it is not searched again).  A missing file is an empty database; an unreadable, corrupt or
foreign one is ignored with a warning: it never breaks a compile.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target

from ..profile import INT8_DECODE_ATTR, TargetProfile
from .low_batch_gemv import COPY_ATTR, GEMV_ATTR
from .schedule import CPUKnobs, target_mcpu, vector_lanes_for_target

FORMAT_VERSION = 1
TUNED_ATTR = "kiln.tuned_knobs"  # PrimFunc attr: the knobs a tuning database gave it ("tile_m=2,...")
KnobLookup = Callable[[tirx.PrimFunc], "CPUKnobs | None"]  # per-function knobs, None = the rule's own


def knobs_label(knobs: CPUKnobs) -> str:
    """The tunable knobs as ``tile_m=2,tile_n=4,unroll_k=1`` (vector_lanes is the target's), then
    ``,gemv_tile_n=1`` where it is set and ``,outer`` for the outer-product matmul form."""
    gemv = f",gemv_tile_n={knobs.gemv_tile_n}" if knobs.gemv_tile_n else ""
    outer = ",outer" if knobs.outer else ""
    return f"tile_m={knobs.tile_m},tile_n={knobs.tile_n},unroll_k={knobs.unroll_k}{gemv}{outer}"


class Tuned(ScheduleRule):
    """``rule`` with per-function knobs: where ``lookup(func)`` has knobs, ``type(rule)(knobs)``
    schedules the function and marks it ``TUNED_ATTR``; elsewhere (or should those knobs not
    schedule it) ``rule`` itself does.  The wrapped class must take the knobs as its one
    constructor argument (Matmul, QuantMatmul and LowBatchGEMV do); vector_lanes stays the rule's."""

    def __init__(self, rule: ScheduleRule, lookup: KnobLookup) -> None:
        self.rule, self.lookup = rule, lookup

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        knobs = self.lookup(func) if isinstance(func, tirx.PrimFunc) else None
        if knobs is not None:
            knobs = dataclasses.replace(knobs, vector_lanes=self.rule.knobs.vector_lanes)
            marked = func.with_attr(TUNED_ATTR, knobs_label(knobs))
            sch = type(self.rule)(knobs).apply(marked, target, tunable)
            if sch is not None:
                return sch
        return self.rule.apply(func, target, tunable)


# Not part of a kernel's identity: names, schedule marks, and the name of a kernel's low-batch GEMV
# copy (low_batch_gemv.py), so keys do not depend on function names.
# (INT8_DECODE_ATTR: an int8 build's kernels take the knobs tuned for the exact ones)
_VOLATILE_ATTRS = ("global_symbol", "tirx.is_scheduled", TUNED_ATTR, COPY_ATTR, INT8_DECODE_ATTR)


def tuning_dir() -> Path:
    """$KILN_CACHE_DIR/tuning, else ~/.cache/kiln/tuning (``kiln.cache_dir()``'s rule: targets
    may not import the kiln face, tests/compiler/test_tuning.py checks the two agree)."""
    return Path(os.environ.get("KILN_CACHE_DIR") or Path.home() / ".cache" / "kiln") / "tuning"


def target_key(profile: TargetProfile) -> str:
    """``<profile name>-<12 hex of sha256(target dict)>``, e.g. ``cpu-3f9a0c1b2d4e``."""
    digest = hashlib.sha256(json.dumps(profile.target, sort_keys=True).encode()).hexdigest()[:12]
    return f"{profile.name}-{digest}"


def db_path(profile: TargetProfile) -> Path:
    return tuning_dir() / f"{target_key(profile)}.json"


def kernel_key(func: tirx.PrimFunc) -> str:
    """16 hex digits of the structural hash of ``func`` without its name/schedule attrs."""
    for attr in _VOLATILE_ATTRS:
        if func.attrs is not None and attr in func.attrs:
            func = func.without_attr(attr)
    return f"{tvm_ffi.structural_hash(func) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


@dataclass(frozen=True)
class TuneEntry:
    """The knobs chosen for one kernel and the medians (microseconds) that chose them."""

    knobs: CPUKnobs
    us_m1: float | None
    us_m128: float | None
    default_us_m1: float | None
    default_us_m128: float | None
    tuned_at: str                   # ISO 8601, UTC
    function: str = ""              # the PrimFunc's name when tuned (for people reading the file)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "knobs": dataclasses.asdict(self.knobs)}

    @classmethod
    def from_json(cls, data: dict) -> TuneEntry:
        """Raises TypeError/ValueError/KeyError on a malformed entry."""
        fields = {f.name for f in dataclasses.fields(cls)} - {"knobs"}
        timings = {k: data.get(k) for k in fields if k != "tuned_at" and k != "function"}
        for name, value in timings.items():
            if value is not None and not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number or null, got {value!r}")
        return cls(knobs=CPUKnobs(**data["knobs"]), tuned_at=str(data["tuned_at"]),
                   function=str(data.get("function", "")), **timings)


@dataclass
class TuningDB:
    """Knobs per kernel key for one target; ``lookup`` is the ``KnobLookup`` the rules call."""

    path: Path
    target: dict
    entries: dict[str, TuneEntry] = field(default_factory=dict)

    @classmethod
    def for_profile(cls, profile: TargetProfile) -> TuningDB:
        """The profile's database at ``db_path(profile)`` (empty if there is none yet)."""
        return cls.load(db_path(profile), profile.target)

    @classmethod
    def load(cls, path: Path, target: dict) -> TuningDB:
        """Read ``path``; a missing file gives an empty database, a bad one a warning and an empty
        one (a bad entry: a warning, the rest kept)."""
        db = cls(Path(path), dict(target))
        if not db.path.exists():
            return db
        try:
            data = json.loads(db.path.read_text())
            if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
                raise ValueError(f"not a version-{FORMAT_VERSION} kiln tuning database")
            if data.get("target") != db.target:
                raise ValueError(f"it was tuned for another target ({data.get('target')})")
            raw_entries = data["entries"]
            if not isinstance(raw_entries, dict):
                raise ValueError("'entries' is not an object")
        except (OSError, ValueError, KeyError) as err:      # json.JSONDecodeError is a ValueError
            warnings.warn(f"ignoring the tuning database {db.path}: {err}; compile uses the default "
                          f"schedule knobs (re-run `kiln tune` to rewrite it)", stacklevel=2)
            return db
        for key, raw in raw_entries.items():
            try:
                db.entries[str(key)] = TuneEntry.from_json(raw)
            except (TypeError, ValueError, KeyError, AttributeError) as err:
                warnings.warn(f"ignoring entry {key} of the tuning database {db.path}: {err!r}", stacklevel=2)
        return db

    def save(self) -> None:
        """Write atomically: a temp file in the same folder, fsync, then os.replace."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"version": FORMAT_VERSION, "target": self.target,
                "entries": {k: e.to_json() for k, e in sorted(self.entries.items())}}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def lookup(self, func: tirx.PrimFunc) -> CPUKnobs | None:
        """The tuned knobs for ``func``, or None (the rule's defaults)."""
        if not self.entries:
            return None
        entry = self.entries.get(kernel_key(func))
        return entry.knobs if entry is not None else None


# ----------------------------------------------------------------------------- the tuning space


class CPUTuning:
    """The CPU profile's tuning space (targets/profile.py TuningSpace): the matmul-like rules'
    (tile_m, tile_n, unroll_k) per kernel, in the profile's tuning database."""

    marker_attr = TUNED_ATTR

    def __init__(self, profile: TargetProfile, rules: Callable[[TargetProfile], list],
                 tunable: tuple[type, ...]) -> None:
        self.profile, self._rules, self._tunable = profile, rules, tunable

    def rules(self, lookup: KnobLookup | None = None) -> list:
        """The CPU rules in order, the tunable ones wrapped in ``Tuned`` with ``lookup``'s knobs
        (default: the database's)."""
        lookup = lookup or self.database().lookup
        return [Tuned(r, lookup) if isinstance(r, self._tunable) else r for r in self._rules(self.profile)]

    def is_tunable(self, rule) -> bool:
        return isinstance(rule, Tuned)

    def default_knobs(self, func: tirx.PrimFunc | None = None) -> CPUKnobs:
        """The knobs the rule scheduling ``func`` takes untuned: QuantMatmul's for a dequantize +
        matmul kernel (the CPU's MATMUL_TILES with AVX-512), LowBatchGEMV's for a ``kiln.gemv`` copy (one row
        over the CPU's FLOAT_GEMV_TILE_N), the float rules' otherwise. A kernel whose tuning keeps
        the defaults then compiles as it did untuned."""
        from .fused_schedule import gemv_knobs
        from .quant_schedule import default_knobs as quant_knobs, is_dequant_matmul
        target = self.profile.tvm_target()
        lanes = vector_lanes_for_target(target)
        if func is not None and is_dequant_matmul(func):
            return quant_knobs(lanes, target_mcpu(target))
        if func is not None and func.attrs is not None and GEMV_ATTR in func.attrs:
            return gemv_knobs(lanes, target_mcpu(target))
        return CPUKnobs(vector_lanes=lanes)

    def candidates(self, default: CPUKnobs, rows_tile: bool = True) -> list[CPUKnobs]:
        """(tile_m, tile_n, unroll_k) with <= 24 accumulators, nearest the defaults first; tile_m
        stays the default's unless ``rows_tile`` (it only shapes calls over many rows). First the
        defaults with each gemv_tile_n (QuantMatmul's one-row GEMV alone, the knob that moved decode
        most; a rule without one builds the same schedule, which the search skips), then with the
        other form of the tiled matmuls, QuantMatmul's and the float Matmul's (inner or outer product,
        where rows are tiled)."""
        grid = [dataclasses.replace(default, tile_m=m, tile_n=n, unroll_k=u)
                for m in ((1, 2, 4, 8) if rows_tile else (default.tile_m,))
                for n in (1, 2, 4, 8) for u in (1, 2, 4) if m * n <= 24]

        def distance(k: CPUKnobs) -> float:
            return sum(abs(math.log2(getattr(k, f) / getattr(default, f))) for f in ("tile_m", "tile_n", "unroll_k"))

        gemv = [dataclasses.replace(default, gemv_tile_n=g) for g in (1, 2, 4, 8) if g != default.gemv_tile_n]
        form = [dataclasses.replace(default, outer=not default.outer)] if rows_tile else []
        return gemv + form + sorted((k for k in grid if k != default), key=distance)

    def original_of(self, func: tirx.PrimFunc) -> tirx.PrimFunc | None:
        """A ``kiln.gemv`` copy runs where its original is called (rows <= its bound)."""
        return func.without_attr(GEMV_ATTR) if func.attrs is not None and GEMV_ATTR in func.attrs else None

    def kernel_key(self, func: tirx.PrimFunc) -> str:
        return kernel_key(func)

    def database(self) -> TuningDB:
        return TuningDB.for_profile(self.profile)

    def database_path(self) -> Path:
        return db_path(self.profile)

    def entry(self, knobs: CPUKnobs, us: dict[int, float], default_us: dict[int, float], function: str) -> TuneEntry:
        return TuneEntry(knobs, us.get(1), us.get(128), default_us.get(1), default_us.get(128),
                         datetime.now(timezone.utc).isoformat(timespec="seconds"), function)


__all__ = ["FORMAT_VERSION", "TUNED_ATTR", "CPUTuning", "KnobLookup", "TuneEntry", "Tuned", "TuningDB", "db_path",
           "kernel_key", "knobs_label", "target_key", "tuning_dir"]
