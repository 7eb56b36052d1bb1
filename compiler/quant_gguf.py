"""llama.cpp's quantized blocks -> kiln planes, values unchanged where a kiln kind holds them.

A GGUF's quantized tensor is rows of blocks; each block holds codes and the scales (and for
some types mins) that turn them into floats. Most of llama.cpp's types are, once unpacked,
exactly one of kiln's kernel formats (quant_modules.QuantFormat) with some group size:

    type   block  value                       kiln form (exact)      why exact
    Q4_0   32     d * (q - 8)                 q4  group 32           same codes, d widened to f32
    Q4_1   32     d * q + m                   q4m group 32           same codes, d and m widened
    Q8_0   32     d * q                       q8  group 32           same codes
    Q5_0   32     d * (q - 16), q in 0..31    q8  group 32           q - 16 fits an int8
    Q4_K   256    d*sc[j] * q - dmin*m[j]     q4m group 32           per 32: scale d*sc, min -dmin*m
    Q6_K   256    d*sc[j] * (q - 32)          q8  group 16           per 16: scale d*sc, q - 32 an int8
    Q3_K   256    d*(sc[j]-32) * q, q -4..3   q4  group 16           per 16: q + 8 is a 4-bit code
    Q2_K   256    d*sc[j] * q - dmin*m[j]     q4m group 16           per 16: scale d*sc, min -dmin*m
    Q5_1   32     d * q + m, q in 0..31       q8m group 32           same codes, d and m widened
    Q5_K   256    d*sc[j] * q - dmin*m[j]     q8m group 32           per 32: scale d*sc, min -dmin*m
    IQ4_NL 32     d * kv[q], kv 16 int8s      q8  group 32           kv[q] is an int8 (non-linear 4-bit)
    IQ4_XS 256    d*(sc[j]-32) * kv[q]        q8  group 32           per 32: scale d*(sc - 32), kv[q] an int8

An f16 times a small integer is exact in float32, so the float32 planes reproduce
gguf.quants.dequantize bit for bit.
"""

from __future__ import annotations

import numpy as np

from .quant_modules import BYTE_CODES
from .quant_pack import Planes, pack_nibbles

# GGUF type -> (kiln kind, group size) that holds its values exactly.
GGUF_EXACT = {"Q4_0": ("q4", 32), "Q4_1": ("q4m", 32), "Q8_0": ("q8", 32), "Q5_0": ("q8", 32),
              "Q4_K": ("q4m", 32), "Q6_K": ("q8", 16), "Q3_K": ("q4", 16), "Q2_K": ("q4m", 16),
              "Q5_1": ("q8m", 32), "Q5_K": ("q8m", 32), "IQ4_NL": ("q8", 32), "IQ4_XS": ("q8", 32)}
# Types whose blocks hold one float16 scale (and min) for their 32 values, used as stored: the planes
# keep them in float16 exactly (the K-quants' scales are products of a float16 and a sub-scale).
HALF_SCALED = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "IQ4_NL")
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34, "Q5_0": 22, "Q4_K": 144, "Q6_K": 210, "Q3_K": 110,
               "Q2_K": 84, "Q5_1": 24, "Q5_K": 176, "IQ4_NL": 18, "IQ4_XS": 136}
BLOCK_SIZE = {t: 256 if t.endswith(("_K", "_XS")) else 32 for t in BLOCK_BYTES}
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


def from_gguf_blocks(type_name: str, raw: np.ndarray, scale_dtype: str = "float32") -> Planes:
    """Blocks of `type_name` (uint8 [rows, bytes_per_row]) -> the planes of its GGUF_EXACT form, the
    scales (and mins) in `scale_dtype` (float16: HALF_SCALED types only, where that is exact)."""
    if type_name not in GGUF_EXACT:
        raise ValueError(f"{type_name} blocks have no exact kiln form; exact: {', '.join(GGUF_EXACT)}")
    if scale_dtype != "float32" and (scale_dtype != "float16" or type_name not in HALF_SCALED):
        raise ValueError(f"{type_name} blocks' scales are not exactly {scale_dtype}; float16 holds only "
                         f"{', '.join(HALF_SCALED)}'s")
    rows = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(-1, BLOCK_BYTES[type_name])    # [rows * K / block, bytes]
    codes, scale, minimum = _UNPACK[type_name](blocks)                        # per block: [nb, block], [nb, g]
    kind = GGUF_EXACT[type_name][0]
    codes = codes.reshape(rows, -1)
    planes = {"qweight": codes.astype(BYTE_CODES[kind]) if kind in BYTE_CODES else pack_nibbles(codes.astype(np.uint8)),
              "scale": scale.astype(scale_dtype).reshape(rows, -1)}
    if minimum is not None:
        planes["min"] = minimum.astype(scale_dtype).reshape(rows, -1)
    return planes


def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes per block -> float32 [nb, 1]."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, chunk: int) -> np.ndarray:
    """Bytes in chunks of `chunk`: each chunk gives its low nibbles, then its high nibbles."""
    nb = qs.shape[0]
    q = qs.reshape(nb, -1, 1, chunk) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(15)).reshape(nb, -1)


def _crumbs(qs: np.ndarray, chunk: int, bits: int = 2) -> np.ndarray:
    """Bytes in chunks of `chunk`: each chunk gives bits 0-1, then 2-3, 4-5, 6-7 of every byte
    (bits=1: each of the 8 bits in turn)."""
    nb, shifts = qs.shape[0], np.arange(0, 8, bits, dtype=np.uint8)
    q = qs.reshape(nb, -1, 1, chunk) >> shifts.reshape(1, 1, -1, 1)
    return (q & np.uint8((1 << bits) - 1)).reshape(nb, -1)


def _q4_0(b):
    return _nibbles(b[:, 2:], 16), _f16(b[:, :2]), None


def _q4_1(b):
    return _nibbles(b[:, 4:], 16), _f16(b[:, :2]), _f16(b[:, 2:4])


def _q8_0(b):
    return b[:, 2:].view(np.int8), _f16(b[:, :2]), None


def _q5_0(b):
    high = np.unpackbits(b[:, 2:6], axis=-1, bitorder="little")           # bit 4 of element i: bit i
    q = _nibbles(b[:, 6:], 16) | (high << np.uint8(4))
    return q.astype(np.int16) - 16, _f16(b[:, :2]), None


def _q5_1(b):
    high = np.unpackbits(b[:, 4:8], axis=-1, bitorder="little")           # bit 4 of element i: bit i
    return _nibbles(b[:, 8:], 16) | (high << np.uint8(4)), _f16(b[:, :2]), _f16(b[:, 2:4])


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins per block."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([d & 63, (md & 15) | ((d >> 2) & 48)], axis=-1)
    mn = np.concatenate([m & 63, (md >> 4) | ((m >> 2) & 48)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(b):
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    return _nibbles(b[:, 16:], 32), d * sc, -(dmin * mn)


def _q5_k(b):
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    high = _crumbs(b[:, 16:48], 32, bits=1)                                # sub-block j's bit 4: bit j of qh
    return _nibbles(b[:, 48:], 32) | (high << np.uint8(4)), d * sc, -(dmin * mn)


def _q6_k(b):
    low = _nibbles(b[:, :128], 64)                                         # [nb, 256]
    high = _crumbs(b[:, 128:192], 32)                                      # [nb, 256]
    q = (low | (high << np.uint8(4))).astype(np.int16) - 32
    return q, _f16(b[:, 208:210]) * b[:, 192:208].view(np.int8).astype(np.float32), None


def _q3_k(b):
    hmask, qs, s, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    low = (s[:, :8, None] >> np.array([0, 4], np.uint8)).transpose(0, 2, 1).reshape(-1, 16) & np.uint8(15)
    high = (s[:, 8:12, None] >> np.array([0, 2, 4, 6], np.uint8)).transpose(0, 2, 1).reshape(-1, 16) & np.uint8(3)
    sc = ((low | (high << np.uint8(4))).astype(np.float32) - 32)
    q = _crumbs(qs, 32).astype(np.int16) - 4 * (1 - _crumbs(hmask, 32, bits=1).astype(np.int16))
    return q + 8, d * sc, None                                            # q4 codes: q + 8


def _q2_k(b):
    s, qs, d, dmin = b[:, :16], b[:, 16:80], _f16(b[:, 80:82]), _f16(b[:, 82:84])
    return _crumbs(qs, 32), d * (s & np.uint8(15)).astype(np.float32), -(dmin * (s >> 4).astype(np.float32))


def _iq4_nl(b):
    return IQ4_VALUES[_nibbles(b[:, 2:], 16)], _f16(b[:, :2]), None


def _iq4_xs(b):
    d, high, low = _f16(b[:, 0:2]), b[:, 2:4].copy().view(np.uint16), b[:, 4:8]
    low = ((low[:, :, None] >> np.array([0, 4], np.uint8)) & np.uint8(15)).reshape(-1, 8)      # sub-block j: nibble j
    high = (high >> (2 * np.arange(8, dtype=np.uint16))) & np.uint16(3)                        # bits 2j, 2j + 1
    sc = (low | (high.astype(np.uint8) << np.uint8(4))).astype(np.float32) - 32
    return IQ4_VALUES[_nibbles(b[:, 8:], 16)], d * sc, None


_UNPACK = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q8_0": _q8_0, "Q5_0": _q5_0, "Q4_K": _q4_k, "Q6_K": _q6_k,
           "Q3_K": _q3_k, "Q2_K": _q2_k, "Q5_1": _q5_1, "Q5_K": _q5_k, "IQ4_NL": _iq4_nl, "IQ4_XS": _iq4_xs}

__all__ = ["BLOCK_BYTES", "BLOCK_SIZE", "GGUF_EXACT", "HALF_SCALED", "from_gguf_blocks"]
