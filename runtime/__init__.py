"""The kiln runtime (kiln.runtime): artifact loader, model runner, sampler, engine.

Imports neither kiln.compiler nor kiln.models: an artifact runs where no compiler is installed.
"""

import sys as _sys


def _import_tvm_without_torch() -> None:
    """Import TVM with torch hidden, unless either is already imported.

    tvm_ffi imports torch whenever it is installed (for its torch-tensor conversions): about
    200 MB of resident memory and a second of start-up in every serving process, though the
    runtime hands TVM only numpy arrays and TVM tensors. A later ``import torch`` (xgrammar's
    token bitmask, transformers in tests) still works; only tvm_ffi's torch conversions stay off.
    """
    if "tvm_ffi" in _sys.modules or "torch" in _sys.modules:
        return
    _sys.modules["torch"] = None                    # makes tvm_ffi's `import torch` fail softly
    try:
        import tvm  # noqa: F401
    finally:
        if "torch" in _sys.modules and _sys.modules["torch"] is None:
            del _sys.modules["torch"]


_import_tvm_without_torch()

from .artifact import Artifact, ArtifactError, is_artifact  # noqa: E402
from .engine import Engine, EngineConfig  # noqa: E402
from .protocol import GenerationOutput, InvalidRequestError, SamplingParams, StreamDelta  # noqa: E402

__all__ = ["Artifact", "ArtifactError", "Engine", "EngineConfig", "GenerationOutput", "InvalidRequestError",
           "SamplingParams", "StreamDelta", "is_artifact"]
