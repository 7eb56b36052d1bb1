"""Quantization schemes: how weights are stored in the artifact and computed with.

A scheme rewrites the nn.Module from outside (swapping Linear/Embedding for
quantized forms when it quantizes) and converts each weight tensor, one at a
time, into the arrays the rewritten module's parameters expect.

Names follow MLC's convention: q<weight bits>f<compute float bits>; q0 keeps
weights in floating point. `auto` picks the scheme for a model and target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm.relax.frontend import nn


@dataclass(frozen=True)
class QuantScheme:
    name: str
    model_dtype: str            # activations and unquantized weights
    description: str

    def apply(self, model: nn.Module) -> nn.Module:
        """Rewrite the module for this scheme (q0: only cast to the compute dtype)."""
        model.to(self.model_dtype)
        return model

    def convert(self, name: str, weight: np.ndarray) -> dict[str, np.ndarray]:
        """One model parameter's value -> the artifact tensors that replace it."""
        return {name: np.ascontiguousarray(weight.astype(self.model_dtype, copy=False))}


SCHEMES: dict[str, QuantScheme] = {
    "q0f32": QuantScheme("q0f32", "float32", "float32 weights and compute (reference numerics)"),
    "q0f16": QuantScheme("q0f16", "float16", "float16 weights and compute"),
}


def get_scheme(name: str, source_format: str | None = None) -> QuantScheme:
    """The scheme for --quant; `auto` picks q0f32 until 4-bit kernels land."""
    if name == "auto":
        name = "q0f32"
    if name not in SCHEMES:
        raise ValueError(f"unknown quantization {name!r}; choose one of: auto, {', '.join(SCHEMES)}")
    return SCHEMES[name]
