"""GPTQ, AWQ and compressed-tensors codes -> kiln planes, every value unchanged (models/prequantized.py
reads them).

Such a value is scale * (code - zero) with a 4-bit code, a float16 scale and an integer zero
per group of G inputs (groups in order along K; models.prequantized.StoredCodes):

    zeros          kiln form (exact)     planes
    all 8          q4  group G           the codes, scale widened to float32: (q - 8) * scale
    any other      q4m group G           the codes, scale, min = -zero * scale in float32

-zero * scale and q * scale + min are exact in float32 (a float16's 11 significant bits times an
integer of at most 5 bits; a bfloat16 scale has fewer), so the planes dequantize to
scale * (code - zero) bit for bit in float32, where GPTQ's own float16 kernels round it.
"""

from __future__ import annotations

import numpy as np

from kiln.models.prequantized import StoredCodes

from .quant_pack import Planes, pack_nibbles


def stored_kind(symmetric: bool) -> str:
    """The kiln kind holding a stored weight exactly: q4 where every zero is 8, else q4m."""
    return "q4" if symmetric else "q4m"


def from_stored_codes(stored: StoredCodes, kind: str) -> Planes:
    """`stored` as the planes of `kind` (stored_kind's answer for it)."""
    planes = {"qweight": pack_nibbles(stored.codes), "scale": stored.scales.astype(np.float32)}
    if kind == "q4m":
        planes["min"] = -stored.zeros.astype(np.float32) * planes["scale"]
    elif not (stored.zeros == 8).all():
        raise ValueError("a q4 form needs every zero to be 8; this weight's are not")
    return planes
