"""Kernels scheduled once: dlight's ApplyDefaultSchedule with each kernel's schedule kept in the library cache.

ApplyDefaultSchedule tries the target's rules on every PrimFunc a module holds, each alone: a rule
sees the function and the target, never the module. So a kernel's schedule is a pure function of the
unscheduled PrimFunc, its target, the rules and what they read: kiln's sources (the compiler
fingerprint), TVM's version, the knobs the rules are built with, the module constants of kiln's
targets/ (knobs tools/gpu_builds.py and tests set for a build), the tuning database (the CPU's tuned
knobs) and the pass context's options. Scheduling was 52% of the pipeline of 90 tiny families whose
kernels were all compiled already (74 of 142 s, 2 vCPUs); the kernel objects below it
(compiler/lib_cache.py KernelObjects) skip only code generation, keyed on the scheduled kernel.
With the schedules kept, a recompile's schedule phase took 0.70 s for Gemma 2's tiny model (1.51
before) and 0.47 s for Mistral 4's (1.51); a first compile gains nothing.

``ScheduleOnce`` keeps each kernel's schedule in <library cache>/scheduled/<key>-<sha256 of its
JSON, 16 digits>.json (TVM's JSON, ``tvm.ir.save_json``), keyed by a sha256 of all of the above and
the unscheduled kernel's JSON; a kernel found there is not scheduled again, the rest are scheduled by
ApplyDefaultSchedule itself, together, as one module. Kernels that share a param (a kernel and the
GEMV copies LowBatchGEMV made of it, joined later by identity) are kept and found as one group. A
kernel no rule schedules is kept as it is (the rules are not tried on it again). Written whole or not
at all, checked on every read (a damaged file is scheduled again and replaced); no cache
(KILN_LIB_CACHE=0): ApplyDefaultSchedule alone.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import pkgutil
import re
import sys

import tvm
from tvm import tirx
from tvm.s_tir import dlight as dl

from .row_dispatch import is_scheduled


@tvm.transform.module_pass(opt_level=0, name="ApplyDefaultSchedule")
class ScheduleOnce:
    """dl.ApplyDefaultSchedule(*rules), each kernel's schedule kept (see the module docstring).
    `identity`: what else the rules read that is neither in kiln's sources nor their own attributes
    (the CPU profile: its tuning database's bytes)."""

    def __init__(self, *rules, identity: bytes = b"") -> None:
        self.rules, self.identity = list(rules), identity

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        apply = dl.ApplyDefaultSchedule(*self.rules)
        store = Scheduled.open(self.rules, self.identity)
        if store is None:
            return apply(mod)
        groups = _sharing([(gv, f) for gv, f in mod.functions_items()
                           if isinstance(f, tirx.PrimFunc) and not is_scheduled(f)])
        keys = [store.key([f for _, f in group]) for group in groups]
        kept = store.lookup(keys)
        found: dict[tvm.ir.GlobalVar, tirx.PrimFunc] = {}
        pending = []
        for group, key in zip(groups, keys):
            if len(kept.get(key, ())) == len(group):
                found.update(zip((gv for gv, _ in group), kept[key]))
            else:
                pending.append((group, key))
        if pending:
            scheduled = apply(tvm.IRModule({gv: f for group, _ in pending for gv, f in group}))
            for group, key in pending:
                funcs = [scheduled[gv] for gv, _ in group]
                found.update(zip((gv for gv, _ in group), funcs))
                store.keep(key, funcs)
        for gv, func in found.items():
            mod[gv] = func
        return mod


def _sharing(funcs: list[tuple[tvm.ir.GlobalVar, tirx.PrimFunc]]) -> list[list]:
    """`funcs` in groups that share a param (the same Var object), kept and loaded together: a kernel
    and its copies scheduled apart are later joined by identity (row_dispatch.same_params), which a
    kernel serialized alone would lose. In module order."""
    owner: dict[int, int] = {}                  # a param's address -> the group's first function
    parent = list(range(len(funcs)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i, (_, func) in enumerate(funcs):
        for param in func.params:
            j = owner.setdefault(param.__chandle__(), i)
            parent[root(i)] = root(j)
    groups: dict[int, list] = {}
    for i, pair in enumerate(funcs):
        groups.setdefault(root(i), []).append(pair)
    return list(groups.values())


def _described(value, depth: int = 0) -> str:
    """`value` as a key: an object Python would print by its address (which differs every process) as
    its class and attributes, containers item by item, anything else by its repr."""
    if depth > 8:
        return "..."
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}[" + ", ".join(_described(v, depth + 1) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_described(v, depth + 1)}" for k, v in value.items()) + "}"
    if hasattr(value, "__dict__") and type(value).__repr__ is object.__repr__:
        return (f"{type(value).__module__}.{type(value).__qualname__}"
                + _described(sorted(vars(value).items()), depth + 1))
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


@functools.cache
def _knob_modules() -> tuple[str, ...]:
    """Every module of kiln's targets/, imported (once a process): the same set in every process and
    at every compile, whichever of them a build has needed so far."""
    import kiln.targets
    names = tuple(m.name for m in pkgutil.walk_packages(kiln.targets.__path__, "kiln.targets."))
    for name in names:
        importlib.import_module(name)
    return names


def knob_constants() -> str:
    """The upper-case plain-valued globals of every module of kiln's targets/ (the knobs rules read)."""
    parts = []
    for name in _knob_modules():
        for key, value in sorted(vars(sys.modules[name]).items()):
            if key.isupper() and isinstance(value, (bool, int, float, str, tuple, frozenset)):
                parts.append(f"{name}.{key}={_described(value)}")
    return "\n".join(parts)


class Scheduled:
    """One pass's use of <library cache>/scheduled/."""

    def __init__(self, folder, environment: "hashlib._Hash") -> None:
        self.folder, self._environment = folder, environment

    @classmethod
    def open(cls, rules: list, identity: bytes) -> "Scheduled | None":
        from kiln.compiler.lib_cache import SCHEDULED, cache_root, environment_digest
        root = cache_root()
        if root is None:
            return None
        digest = environment_digest(tvm.target.Target.current(allow_none=True), knob_constants(), _described(rules))
        digest.update(identity)
        return cls(root / SCHEDULED, digest)

    def key(self, funcs: list[tirx.PrimFunc]) -> str:
        """Of a group of kernels (_sharing): the targets of their own (the current one is in the environment)
        and their JSON, as one (shared parts once)."""
        digest = self._environment.copy()
        for func in funcs:
            own = func.attrs.get("target") if func.attrs is not None else None
            digest.update(json.dumps(own.export() if own is not None else None, sort_keys=True,
                                     default=str).encode() + b"\0")
        digest.update(tvm.ir.save_json(tvm.runtime.convert(list(funcs))).encode())
        return digest.hexdigest()[:32]

    def lookup(self, keys: list[str]) -> dict[str, list[tirx.PrimFunc]]:
        """The scheduled kernels kept for those keys, by key (a damaged or unreadable file: none)."""
        from kiln.compiler.lib_cache import load_kept, read_kept
        found = {}
        for key, data in read_kept(self.folder, keys, ".json").items():
            with contextlib.suppress(ValueError, RuntimeError):
                found[key] = list(load_kept(data.decode()))
        return found

    def keep(self, key: str, funcs: list[tirx.PrimFunc]) -> None:
        from kiln.compiler.lib_cache import keep_checked
        keep_checked(self.folder, key, tvm.ir.save_json(tvm.runtime.convert(list(funcs))).encode(), ".json")
