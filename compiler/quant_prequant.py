"""GPTQ, AWQ and compressed-tensors codes -> kiln planes, every value unchanged (models/prequantized.py
reads them).

Such a value is scale * (code - zero) with a 4-bit (or 8-bit) code, a float16 scale and an integer zero
per group of G inputs (groups in order along K; models.prequantized.StoredCodes):

    bits  zeros        kiln form (exact)     planes
    4     all 8        q4  group G           the codes, scale widened to float32: (q - 8) * scale
    4     any other    q4m group G           the codes, scale, min = -zero * scale in float32
    8     all 128      q8  group G           the codes less 128 as int8, scale: q * scale
    8     any other    q8m group G           the codes (uint8), scale, min = -zero * scale

-zero * scale and q * scale + min are exact in float32 (a float16's 11 significant bits times an
integer of at most 9 bits; a bfloat16 scale has fewer), so the planes dequantize to
scale * (code - zero) bit for bit in float32, where GPTQ's own float16 kernels round it.
"""

from __future__ import annotations

import numpy as np

from kiln.models.prequantized import StoredCodes

from .quant_pack import Planes, pack_nibbles


def stored_kind(symmetric: bool, bits: int = 4) -> str:
    """The kiln kind holding a stored weight exactly: q4 (q8) where every zero is the middle code, else q4m
    (q8m)."""
    return f"q{bits}" if symmetric else f"q{bits}m"


def from_stored_codes(stored: StoredCodes, kind: str) -> Planes:
    """`stored` as the planes of `kind` (stored_kind's answer for it)."""
    middle = 1 << (stored.bits - 1)
    scale = stored.scales.astype(np.float32)
    if kind in ("q4", "q8") and not (stored.zeros == middle).all():
        raise ValueError(f"a {kind} form needs every zero to be {middle}; this weight's are not")
    if stored.bits == 8:
        codes = stored.codes if kind == "q8m" else (stored.codes.astype(np.int16) - middle).astype(np.int8)
    else:
        codes = pack_nibbles(stored.codes)
    planes = {"qweight": codes, "scale": scale}
    if kind in ("q4m", "q8m"):
        planes["min"] = -stored.zeros.astype(np.float32) * scale
    return planes
