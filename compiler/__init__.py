"""The kiln compiler (kiln.compiler): quantization, export, pass pipeline, artifact writer."""

from .build import CompileOptions, compile_model
from .quantize import SCHEMES, get_scheme
from .spec import ENTRY_FUNCTIONS, build_spec

__all__ = ["CompileOptions", "ENTRY_FUNCTIONS", "SCHEMES", "build_spec", "compile_model", "get_scheme"]
