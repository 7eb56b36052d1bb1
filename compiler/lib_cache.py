"""Built libraries kept by the code they hold, so a compile that would build one again copies it.

A library is TVM's code generation of the module kiln's pipeline leaves (every kernel scheduled,
every Relax function lowered to VM code) for one target. Two compiles whose pipelines leave the same
module for the same target build the same library: another checkpoint or fine-tune of the same
architecture and shapes, the same model converted again (a new quantization of its weights in the
same scheme, a `--force` recompile), a test suite compiling one tiny model in many places. Only code
generation is skipped (TIR lowering, the device compiler, linking: ~70% of a tiny model's build here); the
pipeline still runs, since its result is the key, so whatever changes the kernels (kiln's sources,
a tuning database, a knob patched at run time) changes the key as well.

The key (`library_key`) is a sha256 of: the module after the pipeline serialized function by function
(tvm.ir.save_json: every function, attribute and bound constant), the TVM target as JSON, the
pass context's options, the profile's export (format, system library, linker), TVM's version and
kiln's compiler fingerprint. Entries live in <cache_dir>/libs/<key><suffix> (KILN_LIB_CACHE names
another folder; 0 or off: no cache) beside their sha256 (an entry that no longer matches it is built
again and replaced), are written whole or not at all (a rename), and are removed by `kiln cache
clean` with the artifacts. One process builds a key at a time (a lock file beside it);
another asking for the same key waits and copies it.

Below the libraries, kernels: a library not held whole is linked from kernel objects kept one per
kernel where its build compiles in parts (KernelObjects, codegen.build), so the kernels two
modules share are compiled once; and before them, each kernel's schedule (targets/schedule_memo.py),
so a kernel scheduled once is not scheduled again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    import fcntl
except ImportError:                                # no flock: builds of the same key may overlap
    fcntl = None


def cache_root() -> Path | None:
    """$KILN_LIB_CACHE, else <cache_dir>/libs; None when KILN_LIB_CACHE is 0 or off."""
    chosen = os.environ.get("KILN_LIB_CACHE", "")
    if chosen.lower() in ("0", "off", "false", "no"):
        return None
    if chosen:
        return Path(chosen)
    from kiln import cache_dir
    return cache_dir() / "libs"


def environment_digest(target, *extra: str) -> "hashlib._Hash":
    """A sha256 of what any code TVM generates here depends on besides the module itself (kiln's compiler
    fingerprint, TVM's version, the TVM target, None where none is current, and the pass context's
    options), then of `extra`: what a key adds to it (a library's export, a schedule's rules)."""
    import tvm

    import kiln
    ctx = tvm.transform.PassContext.current()
    digest = hashlib.sha256()
    for part in (kiln.compiler_fingerprint(), tvm.__version__,
                 json.dumps(target.export() if target is not None else None, sort_keys=True, default=str),
                 f"opt{ctx.opt_level}", json.dumps({str(k): str(v) for k, v in dict(ctx.config).items()},
                                                   sort_keys=True), *extra):
        digest.update(part.encode() + b"\0")
    return digest


def hash_functions(digest: "hashlib._Hash", module, saved: "SavedJSON | None" = None) -> "hashlib._Hash":
    """`digest` updated with `module` function by function (its attributes and global infos, then each function
    with its name): a module's JSON writes a node two functions (or a function and the type of the GlobalVar
    naming it) share once, and whether they share it is no part of the code (a kernel whose schedule was kept,
    targets/schedule_memo.py, shares nothing with the rest of the module; the same kernel scheduled here may).
    `saved`: each function's JSON as an earlier key of the same build wrote it (the library's key, then its
    kernels' keys, hash the same PrimFuncs)."""
    import tvm
    save = saved or tvm.ir.save_json
    for part in (module.attrs, module.global_infos):
        digest.update(tvm.ir.save_json(part).encode() + b"\0" if part is not None else b"-\0")
    for gv, func in module.functions_items():
        digest.update(gv.name_hint.encode() + b"\0" + save(func).encode() + b"\0")
    return digest


class SavedJSON:
    """tvm.ir.save_json of functions, each written once: a build's library key and its kernels' keys
    (KernelObjects) serialize the same PrimFunc objects (a kernel's JSON was ~a third of all the hashing a
    tiny family's compile did). Keyed by the object's address, the object held so the address stays its."""

    def __init__(self) -> None:
        self._saved: dict[int, tuple[object, str]] = {}

    def __call__(self, func) -> str:
        import tvm
        address = func.__chandle__()
        kept = self._saved.get(address)
        if kept is None:
            kept = self._saved[address] = (func, tvm.ir.save_json(func))
        return kept[1]


def load_kept(text: str):
    """An object this cache kept as TVM's JSON (save_json), read back. Without tvm.ir.load_json's
    json_compact.upgrade_json: that rewrites the JSON of older TVM versions in Python (a parse and an
    indented dump, ~85% of a read), and every file here is keyed on this TVM's version, so it has nothing
    to upgrade (tests/compiler/test_kernel_memo.py reads a kept kernel both ways)."""
    from tvm_ffi.serialization import from_json_graph_str
    return from_json_graph_str(text)


def library_key(lowered, profile, target, saved: SavedJSON | None = None) -> str:
    """What a library built from `lowered` (the module after kiln's pipeline) for `profile` and its
    TVM `target` depends on, hashed."""
    export = f"{profile.export_format}|{profile.system_lib}|{profile.exporter is None}|{profile.lib_name}"
    return hash_functions(environment_digest(target, export), lowered, saved).hexdigest()[:32]


class CachedLibrary:
    """Stands in for relax.build's executable where the cache holds its library: exporting it writes
    the bytes read from the cache (TargetProfile.export calls export_library, with a linker's
    options or without), so a `kiln cache clean` meanwhile cannot take them away."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def export_library(self, path: str, **_options) -> None:
        Path(path).write_bytes(self.data)


@dataclass
class LibraryCache:
    """One compile's use of the cache: lookup() after the pipeline, keep() once the library is
    written, close() in any case (it releases the key's lock)."""

    root: Path
    key: str | None = None
    hit: bool = False
    _lock: object = None
    _saved: SavedJSON = field(default_factory=SavedJSON)       # the library key's JSON, for its kernels' keys

    @classmethod
    def open(cls) -> "LibraryCache | None":
        root = cache_root()
        return cls(root) if root is not None else None

    def kernel_objects(self, target) -> "KernelObjects":
        """Where this cache keeps kernels compiled one object file each, for `target`."""
        return KernelObjects(self.root / KERNELS, environment_digest(target), self._saved)

    def entry(self, suffix: str) -> Path:
        return self.root / f"{self.key}{suffix}"

    def lookup(self, lowered, profile, target) -> CachedLibrary | None:
        """The cached library of this module and target, or None (the caller builds it and keep()s it;
        meanwhile another process asking for the same key waits for it)."""
        self.key = library_key(lowered, profile, target, self._saved)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if fcntl is not None:
                self._lock = open(self.root / f"{self.key}.lock", "w")
                fcntl.flock(self._lock, fcntl.LOCK_EX)
        except OSError:                            # a read-only or unusable folder: build as if absent
            self.key = None
            return None
        found = self.entry(Path(profile.lib_name).suffix)
        try:
            data, digest = found.read_bytes(), found.with_suffix(".sha256").read_text().strip()
        except OSError:                            # none yet (or removed meanwhile): build it
            return None
        if hashlib.sha256(data).hexdigest() != digest:       # damaged on disk: built again, replaced
            return None
        with contextlib.suppress(OSError):
            os.utime(found)                        # what `kiln cache clean --older-than` goes by
        self.hit = True
        return CachedLibrary(data)

    def keep(self, lib: Path) -> None:
        """Store the library just written at `lib` under the key lookup() computed (whole or not at all)."""
        if self.key is None or self.hit:
            return
        dest = self.entry(lib.suffix)
        part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
        try:
            data = lib.read_bytes()
            dest.with_suffix(".sha256").write_text(hashlib.sha256(data).hexdigest())
            part.write_bytes(data)
            os.replace(part, dest)                 # the library last: an entry is whole or absent
        except OSError:                            # a full disk costs the reuse, not the compile
            with contextlib.suppress(OSError):
                part.unlink()

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()                     # releases the flock
            self._lock = None


KERNELS = "kernels"           # <root>/kernels/<key>-<sha256 of the object, 16 digits>.o
PARSED = "parsed"             # <root>/parsed/<key>-<sha256 of its JSON, 16 digits>.json (targets/kernel_memo.py)
SCHEDULED = "scheduled"       # <root>/scheduled/<key>-<sha256 of its JSON, 16 digits>.json (targets/schedule_memo.py)


class KernelObjects:
    """Kernels compiled one object file each, kept by the code they hold, so a build whose library is
    not cached whole still copies every kernel an earlier build compiled (codegen.build): the same
    model at another quantization shares its attention, norm and sampling kernels; a test suite's
    tiny models share most of theirs. A kernel's key is a sha256 of the module it is built as (its
    attributes, the PrimFunc and its name, tvm.ir.save_json) and of what the library's key holds but
    the profile's export (kiln's compiler fingerprint, TVM's version, the target, the pass context's
    options); the object's own sha256 is in its name, checked on every read (a damaged one is
    compiled again). Written whole or not at all (a rename); no lock: two builds of one kernel write
    the same bytes."""

    def __init__(self, folder: Path, environment: "hashlib._Hash", saved: SavedJSON | None = None) -> None:
        self.folder, self._environment, self._saved = folder, environment, saved

    def key(self, module) -> str:
        """Of a one-kernel module, function by function (hash_functions)."""
        return hash_functions(self._environment.copy(), module, self._saved).hexdigest()[:32]

    def lookup(self, keys: list[str]) -> dict[str, bytes]:
        """The objects kept for those keys (those with a sound copy), by key."""
        return read_kept(self.folder, keys, ".o")

    def keep(self, key: str, data: bytes) -> None:
        keep_checked(self.folder, key, data, ".o")


def keep_checked(folder: Path, key: str, data: bytes, suffix: str) -> None:
    """`data` as <folder>/<key>-<its sha256, 16 digits><suffix>, written whole or not at all (a rename);
    a full disk costs the reuse, not the compile."""
    dest = folder / f"{key}-{hashlib.sha256(data).hexdigest()[:16]}{suffix}"
    part = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.part")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        part.write_bytes(data)
        os.replace(part, dest)
    except OSError:
        with contextlib.suppress(OSError):
            part.unlink()


def read_kept(folder: Path, keys: list[str], suffix: str) -> dict[str, bytes]:
    """The files keep_checked wrote in `folder` for those keys (those with a sound copy), by key: the
    folder is listed once, however many keys."""
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    stored: dict[str, list[str]] = {}
    for name in names:
        if name.endswith(suffix) and not name.startswith("."):
            stored.setdefault(name.partition("-")[0], []).append(name)
    found = {}
    for key in set(keys) & stored.keys():
        for name in stored[key]:
            if (data := read_checked(folder / name, key)) is not None:
                found[key] = data
                break
    return found


def read_checked(path: Path, key: str) -> bytes | None:
    """A file keep_checked wrote for `key`: its bytes if they still match the sha256 in its name (and
    it is marked used: what `kiln cache clean --older-than` goes by), else None."""
    with contextlib.suppress(OSError):
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest()[:16] == path.name[len(key) + 1:len(key) + 17]:
            os.utime(path)
            return data
    return None


@dataclass(frozen=True)
class Library:
    path: Path
    bytes: int
    last_used: float


def libraries() -> list[Library]:
    """Every cached library, least recently used first."""
    root = cache_root()
    return _files(root, lambda p: p.suffix not in (".lock", ".sha256")) if root is not None else []


# What a compile keeps below the libraries, by kind: its folder, its files' suffix and what `kiln cache` calls them.
KEPT = {"kernel": (KERNELS, ".o", "compiled kernels"),               # KernelObjects
        "parsed": (PARSED, ".json", "parsed kernels"),               # targets/kernel_memo.py
        "scheduled": (SCHEDULED, ".json", "scheduled kernels")}      # targets/schedule_memo.py


def kept(kind: str) -> list[Library]:
    """Every file of that kind (a KEPT key), least recently used first."""
    root, (folder, suffix, _) = cache_root(), KEPT[kind]
    return _files(root / folder, lambda p: p.suffix == suffix) if root is not None else []


def kernels() -> list[Library]:
    """Every kept kernel object (KernelObjects), least recently used first."""
    return kept("kernel")


def parsed_kernels() -> list[Library]:
    """Every kept parsed kernel (TVMScript, as TVM's JSON: targets/kernel_memo.py), least recently used first."""
    return kept("parsed")


def _files(folder: Path, wanted) -> list[Library]:
    found = []
    for p in sorted(folder.iterdir()) if folder.is_dir() else []:
        if p.is_file() and not p.name.startswith(".") and wanted(p):
            with contextlib.suppress(OSError):
                st = p.stat()
                found.append(Library(p, st.st_size, st.st_mtime))
    return sorted(found, key=lambda lib: lib.last_used)


def clean(older_than_s: float | None = None) -> tuple[list[Library], dict[str, list[Library]]]:
    """Remove every cached library and every file of each KEPT kind (or those unused for `older_than_s`
    seconds); returns them (the libraries, the kept files by kind)."""
    cutoff = time.time() - older_than_s if older_than_s is not None else float("inf")
    removed = [lib for lib in libraries() if lib.last_used < cutoff]
    for lib in removed:
        with contextlib.suppress(OSError):
            lib.path.unlink()
            for side in (".sha256", ".lock"):
                lib.path.with_suffix(side).unlink(missing_ok=True)
    files = {kind: [f for f in kept(kind) if f.last_used < cutoff] for kind in KEPT}
    for f in (f for found in files.values() for f in found):
        f.path.unlink(missing_ok=True)
    return removed, files
