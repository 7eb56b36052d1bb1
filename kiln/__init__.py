"""kiln: compile LLMs through Apache TVM into one artifact per device, and run them.

    from kiln import Engine, SamplingParams
    engine = Engine("dist/smollm2-q0f32-cpu")            # an artifact directory
    out = engine.generate("Hello", SamplingParams(max_tokens=32, temperature=0.0))

    engine = kiln.load("smollm2")                          # compiles on first use, cached after
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import kiln.runtime as _runtime          # lazy itself: its names load on first use, no TVM here

if TYPE_CHECKING:
    from kiln.runtime import Engine, EngineConfig

__version__ = "0.1.0"


def __getattr__(name: str):
    """The runtime's public names (kiln.runtime.__all__), imported on first use."""
    if name not in _runtime.__all__:
        raise AttributeError(f"module 'kiln' has no attribute {name!r}")
    return getattr(_runtime, name)


def cache_dir() -> Path:
    """Where compiled-on-first-use artifacts live: $KILN_CACHE_DIR, else ~/.cache/kiln."""
    return Path(os.environ.get("KILN_CACHE_DIR") or Path.home() / ".cache" / "kiln")


def compile(model: str, target: str = "cpu", quant: str = "auto", output: str | Path | None = None,
            dump_ir: str | Path | None = None, progress: Callable[[str, int, int], None] | None = None,
            **options) -> Path:
    """Compile a model (HF directory, .gguf or .onnx file, or alias) into an artifact directory; returns its path.
    ``golden=False`` stores no golden logits (nothing for `kiln check` to compare with)."""
    import shutil
    import tempfile

    from kiln.compiler import CompileOptions, compile_model
    for path in ("lora", "tokenizer"):
        if options.get(path) is not None:
            options[path] = Path(options[path])
    opts = CompileOptions(model=model, target=target, quant=quant,
                          output=Path(output) if output else None,
                          dump_ir=Path(dump_ir) if dump_ir else None, **options)
    made: list[str] = []            # the own reference's folder, made only where it is built

    def own_reference(why: str):
        made.append(tempfile.mkdtemp(prefix="kiln-golden-"))
        return _own_reference(model, Path(made[-1]) / "ref", why, progress, options.get("lora"))

    try:
        return compile_model(opts, progress, own_reference)
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


def _own_reference(model: str, dest: Path, why: str, progress: Callable[[str, int, int], None] | None,
                   lora: str | Path | None = None):
    """The golden reference where transformers cannot read the model: kiln's own float32 build of it
    for this machine (compiled into dest, which the caller removes afterwards), its stages' progress
    reported as "golden-reference"."""
    from kiln.runtime.artifact import Artifact
    from kiln.runtime.check import prompt_logits
    from kiln.runtime.model_runner import ModelRunner
    from kiln.targets import DEFAULT_TARGET
    on_step = progress and (lambda _stage, done, total: progress("golden-reference", done, total))
    ref = compile(model, target=DEFAULT_TARGET, quant="q0f32", output=dest, golden=False, progress=on_step,
                  lora=lora)
    runner = ModelRunner(Artifact.load(ref), max_num_seqs=1)
    return (lambda ids: prompt_logits(runner, 0, ids)), f"kiln q0f32 {DEFAULT_TARGET} ({why})"


def check(artifact: str | Path, progress: Callable[[str, int, int], None] | None = None):
    """Run an artifact on its golden prompts here; a CheckReport (runtime/check.py) with .ok and .table()."""
    from kiln.runtime.check import check_artifact
    return check_artifact(artifact, progress)


@lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """kiln's and TVM's versions plus a hash of kiln's own sources: a cached artifact is reused only
    when the code that would rebuild it is the same (a new kiln, or an edited checkout, recompiles)."""
    import tvm

    import kiln.compiler
    import kiln.models
    import kiln.runtime.contract
    import kiln.targets
    digest = hashlib.sha256(f"{__version__}|{tvm.__version__}".encode())
    for package in (kiln.compiler, kiln.models, kiln.targets):
        root = Path(package.__file__).resolve().parent
        for f in sorted(root.rglob("*.py")):
            digest.update(f"{package.__name__}/{f.relative_to(root).as_posix()}".encode() + f.read_bytes())
    digest.update(Path(kiln.runtime.contract.__file__).read_bytes())      # the artifact format itself
    return digest.hexdigest()[:16]


def ensure_artifact(model_or_artifact: str | Path, target: str = "cpu", quant: str = "auto",
                    progress: Callable[[str, int, int], None] | None = None) -> Path:
    """An artifact path for a model: itself if it is one, else compiled once into the cache.

    The cache key covers the model's content, the compiler (``compiler_fingerprint``) and the
    target's tuning database (``kiln tune`` results), so none of them can go stale unseen."""
    from kiln.runtime.artifact import Artifact, ArtifactError, is_artifact
    if is_artifact(model_or_artifact):
        return Path(model_or_artifact)
    from kiln import models
    from kiln.compiler.quantize import get_scheme
    from kiln.targets import get_profile
    source = models.load(model_or_artifact)
    profile = get_profile(target)
    scheme = get_scheme(quant, source, profile.default_quant)
    tuning = profile.tuning_db_path()
    key = hashlib.sha256(f"{source.content_hash}|{compiler_fingerprint()}|".encode()
                         + (tuning.read_bytes() if tuning and tuning.is_file() else b"")).hexdigest()
    dest = cache_dir() / "artifacts" / f"{key[:16]}-{scheme.name}-{target}"
    from kiln import cache
    if is_artifact(dest):
        try:
            Artifact.load(dest)
            cache.touch(dest)
            return dest
        except ArtifactError:
            pass      # a damaged cache entry is rebuilt below
    path = compile(str(model_or_artifact), target=target, quant=scheme.name, output=dest, progress=progress,
                   force=True)
    cache.supersede(path)     # the entry a tune, an upgrade or an edit made stale
    return path


def load(model_or_artifact: str | Path, config: "EngineConfig | None" = None,
         progress: Callable[[str, int, int], None] | None = None) -> "Engine":
    """An Engine for an artifact, or for a model compiled for this CPU on first use."""
    from kiln.runtime.engine import Engine
    return Engine(ensure_artifact(model_or_artifact, progress=progress), config)


__all__ = [*_runtime.__all__, "cache_dir", "check", "compile", "ensure_artifact", "load"]
