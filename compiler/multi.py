"""compile_many: one model, several target presets: an artifact per preset and a kiln-manifest.json.

    OUT/<preset>/           one artifact each (the layout of compile_model)
    OUT/kiln-manifest.json  the model, and per preset: its artifact (library, content hashes) or
                            why it failed; presets kiln names but cannot build, with the reason

Each preset compiles in its own child process, so one that fails, even by crashing TVM natively,
leaves the others to finish; the manifest says which failed and why.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kiln.runtime.contract import CONFIG_NAME, sha256_file
from kiln.targets import UNSUPPORTED, names

from .artifact import OutputError, check_output
from .build import CompileOptions, compile_model

MANIFEST_NAME = "kiln-manifest.json"
ALL = "all"


@dataclass(frozen=True)
class TargetOutcome:
    target: str
    path: Path | None               # the artifact, or None when it failed
    error: str | None               # why it failed, in one line
    seconds: float


@dataclass(frozen=True)
class ManyResult:
    out_dir: Path
    outcomes: tuple[TargetOutcome, ...]
    skipped: dict[str, str]         # presets `all` leaves out (kiln cannot build them), with why

    @property
    def failed(self) -> list[TargetOutcome]:
        return [o for o in self.outcomes if o.error is not None]


def parse_targets(spec: str) -> tuple[list[str], dict[str, str]]:
    """`all` or a comma list -> (presets to build, presets left out with why); unknown names raise."""
    if spec.strip() == ALL:
        return names(), dict(UNSUPPORTED)
    wanted = [t.strip() for t in spec.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in names() and t not in UNSUPPORTED]
    if unknown or not wanted:
        raise ValueError(f"unknown target(s) {', '.join(unknown) or repr(spec)}; choose from: "
                         f"{', '.join(names())}, or `{ALL}`")
    return list(dict.fromkeys(wanted)), {}


def is_many(spec: str) -> bool:
    return spec.strip() == ALL or "," in spec


def default_out_dir(model: str) -> Path:
    stem = Path(model.rstrip("/")).name
    stem = stem.rsplit(".", 1)[0] if stem.endswith((".gguf", ".onnx")) else stem
    return Path("dist") / (re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-").lower() or "model")


def check_out_dir(out: Path, targets: list[str], force: bool) -> None:
    """Before any compile: OUT is new, empty or a previous compile_many's, and each OUT/<preset> may be written."""
    if out.exists():
        if not out.is_dir():
            raise OutputError(f"{out} exists and is not a directory; pass a new path with -o")
        if any(out.iterdir()) and not (out / MANIFEST_NAME).is_file():
            raise OutputError(f"{out} is a directory without {MANIFEST_NAME}; kiln writes several targets only "
                              "into a new or empty directory or one it wrote before. Pass another -o")
    for t in targets:
        check_output(out / t, force)


def compile_many(opts: CompileOptions, spec: str, out: Path | None = None,
                 on_done: Callable[[TargetOutcome, int, int], None] | None = None) -> ManyResult:
    """Compile opts.model for every preset in `spec` into OUT/<preset>; write OUT/kiln-manifest.json."""
    targets, skipped = parse_targets(spec)
    out = (out or default_out_dir(opts.model)).absolute()
    check_out_dir(out, targets, opts.force)
    outcomes = []
    for i, target in enumerate(targets):
        dump = opts.dump_ir / target if opts.dump_ir else None
        outcome = _compile_isolated(dataclasses.replace(opts, target=target, output=out / target, dump_ir=dump))
        outcomes.append(outcome)
        if on_done:
            on_done(outcome, i + 1, len(targets))
    result = ManyResult(out, tuple(outcomes), skipped)
    write_manifest(result, opts)
    return result


def _compile_isolated(opts: CompileOptions) -> TargetOutcome:
    start = time.perf_counter()
    if opts.target in UNSUPPORTED:
        return TargetOutcome(opts.target, None, UNSUPPORTED[opts.target], 0.0)
    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
            path, error = pool.submit(_compile_child, opts).result()
    except BrokenProcessPool:
        path, error = None, "the compiler process died (a crash inside TVM); compile this target alone to see it"
    return TargetOutcome(opts.target, Path(path) if path else None, error, round(time.perf_counter() - start, 1))


def _compile_child(opts: CompileOptions) -> tuple[str | None, str | None]:
    """In the child: (artifact path, None) or (None, the error in one line)."""
    try:
        return str(compile_model(opts)), None
    except Exception as e:  # any failure is this target's; the manifest records it
        return None, one_line(e)


def one_line(e: BaseException) -> str:
    """An exception as one line: its type and the last line of its message that is not a traceback."""
    lines = [ln.strip() for ln in str(e).splitlines()
             if ln.strip() and not ln.startswith(("  ", "Traceback", "File "))]
    return f"{type(e).__name__}: {lines[-1] if lines else '(no message)'}"


def write_manifest(result: ManyResult, opts: CompileOptions) -> Path:
    artifacts, failures = [], []
    for o in result.outcomes:
        if o.error is not None:
            failures.append({"target": o.target, "error": o.error})
            continue
        config = json.loads((o.path / CONFIG_NAME).read_text())
        lib = config["target"]["lib"]
        artifacts.append({
            "target": o.target, "path": os.path.relpath(o.path, result.out_dir), "device": config["target"]["device"],
            "lib": lib, "quantization": config["quantization"]["name"], "seconds": o.seconds,
            "sha256": {CONFIG_NAME: sha256_file(o.path / CONFIG_NAME), **config["files"]},
        })
    manifest = {"model": opts.model, "quant": opts.quant, "artifacts": artifacts, "failures": failures,
                "skipped": [{"target": t, "reason": why} for t, why in result.skipped.items()]}
    path = result.out_dir / MANIFEST_NAME
    result.out_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, path)
    return path
