"""The kiln runtime (kiln.runtime): artifact loader, model runner, sampler, engine.

Imports neither kiln.compiler nor kiln.models: an artifact runs where no compiler is installed.
"""

from .artifact import Artifact, ArtifactError, is_artifact
from .engine import Engine, EngineConfig
from .protocol import GenerationOutput, InvalidRequestError, SamplingParams, StreamDelta

__all__ = ["Artifact", "ArtifactError", "Engine", "EngineConfig", "GenerationOutput", "InvalidRequestError",
           "SamplingParams", "StreamDelta", "is_artifact"]
