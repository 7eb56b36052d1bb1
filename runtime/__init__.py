"""The kiln runtime (kiln.runtime): artifact loader, model runner, sampler, engine.

Imports neither kiln.compiler nor kiln.models: an artifact runs where no compiler is installed.
Lazy: `import kiln.runtime.scheduler` (plain Python) loads no TVM; the names below are imported
on first use.
"""

from importlib import import_module as _import_module

_EXPORTS = {
    "Artifact": "artifact", "ArtifactError": "contract", "is_artifact": "artifact",
    "Engine": "engine", "EngineConfig": "engine", "EngineStats": "protocol",
    "GenerationOutput": "protocol", "InvalidRequestError": "protocol", "SamplingParams": "protocol",
    "StreamDelta": "protocol",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = sorted(_EXPORTS)
