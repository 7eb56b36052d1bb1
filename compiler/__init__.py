"""The kiln compiler (kiln.compiler): quantization, export, pass pipeline, artifact writer."""

# TVM first, as the runtime imports it: with torch hidden from tvm_ffi, which would import it
# (~2 s here) though the compiler hands TVM only numpy arrays. transformers' reference (golden)
# imports torch later, on its own thread, while the pipeline runs.
from kiln.runtime import _tvm  # noqa: F401  (isort: first)

from .build import CompileOptions, compile_model
from .quantize import SCHEMES, get_scheme
from .spec import build_spec

__all__ = ["CompileOptions", "SCHEMES", "build_spec", "compile_model", "get_scheme"]
