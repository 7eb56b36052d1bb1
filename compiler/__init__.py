"""The kiln compiler (kiln.compiler): quantization, export, pass pipeline, artifact writer."""

from .build import CompileOptions, compile_model
from .quantize import SCHEMES, get_scheme
from .spec import build_spec

__all__ = ["CompileOptions", "SCHEMES", "build_spec", "compile_model", "get_scheme"]
