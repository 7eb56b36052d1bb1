"""kiln: compile LLMs through Apache TVM into one artifact per device, and run them.

    from kiln import Engine, SamplingParams
    engine = Engine("dist/smollm2-q0f32-cpu")            # an artifact directory
    out = engine.generate("Hello", SamplingParams(max_tokens=32, temperature=0.0))

    engine = kiln.load("smollm2")                          # compiles on first use, cached after
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from kiln.runtime import (Artifact, ArtifactError, Engine, EngineConfig, GenerationOutput, InvalidRequestError,
                          SamplingParams, StreamDelta, is_artifact)

__version__ = "0.1.0"


def cache_dir() -> Path:
    """Where compiled-on-first-use artifacts live: $KILN_CACHE_DIR, else ~/.cache/kiln."""
    return Path(os.environ.get("KILN_CACHE_DIR") or Path.home() / ".cache" / "kiln")


def compile(model: str, target: str = "cpu", quant: str = "auto", output: str | Path | None = None,
            dump_ir: str | Path | None = None, progress: Callable[[str, int, int], None] | None = None,
            **options) -> Path:
    """Compile a model (HF directory, .gguf file or alias) into an artifact directory; returns its path."""
    from kiln.compiler import CompileOptions, compile_model
    opts = CompileOptions(model=model, target=target, quant=quant,
                          output=Path(output) if output else None,
                          dump_ir=Path(dump_ir) if dump_ir else None, **options)
    return compile_model(opts, progress)


def ensure_artifact(model_or_artifact: str | Path, target: str = "cpu", quant: str = "auto",
                    progress: Callable[[str, int, int], None] | None = None) -> Path:
    """An artifact path for a model: itself if it is one, else compiled once into the cache, keyed by content hash."""
    if is_artifact(model_or_artifact):
        return Path(model_or_artifact)
    from kiln import models
    from kiln.compiler.quantize import get_scheme
    source = models.load(model_or_artifact)
    scheme = get_scheme(quant, source.format)
    dest = cache_dir() / "artifacts" / f"{source.content_hash[:16]}-{scheme.name}-{target}"
    if is_artifact(dest):
        try:
            Artifact.load(dest)
            return dest
        except ArtifactError:
            pass      # a damaged cache entry is rebuilt below
    return compile(str(model_or_artifact), target=target, quant=scheme.name, output=dest, progress=progress)


def load(model_or_artifact: str | Path, config: EngineConfig | None = None,
         progress: Callable[[str, int, int], None] | None = None) -> Engine:
    """An Engine for an artifact, or for a model compiled for this CPU on first use."""
    return Engine(ensure_artifact(model_or_artifact, progress=progress), config)


__all__ = ["Artifact", "ArtifactError", "Engine", "EngineConfig", "GenerationOutput", "InvalidRequestError",
           "SamplingParams", "StreamDelta", "cache_dir", "compile", "ensure_artifact", "load"]
