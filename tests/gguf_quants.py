"""A small numpy quantizer for llama.cpp's block types, for writing test GGUFs.

gguf-py quantizes BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and MXFP4 (used as is); it only dequantizes the
K-quants, so Q2_K, Q3_K, Q4_K, Q5_K and Q6_K are encoded here: a plain min/max (or absmax)
fit per sub-block, 6-bit (Q2_K: 4-bit) sub-block scales under one f16 super-block scale,
packed in llama.cpp's byte layout. Not llama.cpp's error-minimising search: what matters for
tests is that the bytes are valid blocks, which `gguf.quants.dequantize` (the reference)
decodes to values close to the input (checked in tests/unit/test_gguf_quants.py).
"""

from __future__ import annotations

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QType

QK = 256


def quantize(w: np.ndarray, type_name: str) -> np.ndarray:
    """float [rows, K] -> uint8 [rows, bytes_per_row] blocks of `type_name`. The lattice i-quants (IQ1-IQ3),
    which nothing here encodes, are random valid blocks of a size like the weight's (RANDOM)."""
    if type_name in ("BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "TQ1_0", "TQ2_0"):
        return gguf.quants.quantize(np.ascontiguousarray(w, np.float32), QType[type_name])
    if type_name in RANDOM:
        return _random_blocks(w, QType[type_name])
    if type_name == "IQ4_NL":
        return _iq4_nl(np.ascontiguousarray(w, np.float32).reshape(-1, 32)).reshape(w.shape[0], -1)
    rows = w.shape[0]
    x = np.ascontiguousarray(w, np.float32).reshape(-1, QK)                # [nb, 256]
    return _ENCODE[type_name](x).reshape(rows, -1)


def _f16(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[nb] float -> (its f16 bytes [nb, 2], the f16 value as float32 [nb, 1])."""
    h = a.astype(np.float16)
    return h.reshape(-1, 1).view(np.uint8), h.astype(np.float32).reshape(-1, 1)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b == 0, 0, a / np.where(b == 0, 1, b))


def _affine(x: np.ndarray, sub: int, levels: int, scale_bits: int):
    """Sub-blocks value = d*sc*q - dmin*m: (q [nb, 256], sc [nb, n], m [nb, n], d bytes, dmin bytes)."""
    g = x.reshape(x.shape[0], -1, sub)
    lo = np.minimum(g.min(-1), 0)                                          # mins are stored negated, >= 0
    step = (g.max(-1) - lo) / levels
    top = (1 << scale_bits) - 1
    d_bytes, d = _f16(step.max(-1) / top)
    m_bytes, dm = _f16(-lo.min(-1) / top)
    sc = np.clip(np.rint(_div(step, d)), 0, top)
    m = np.clip(np.rint(_div(-lo, dm)), 0, top)
    q = np.clip(np.rint(_div(g + (dm * m)[..., None], (d * sc)[..., None])), 0, levels)
    return q.reshape(x.shape[0], -1).astype(np.uint8), sc.astype(np.uint8), m.astype(np.uint8), d_bytes, m_bytes


def _pack_nibbles(q: np.ndarray, chunk: int) -> np.ndarray:
    """Inverse of chunked low/high nibbles: per 2*chunk values, byte i = v[i] | v[chunk + i] << 4."""
    q = q.reshape(q.shape[0], -1, 2, chunk)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(q.shape[0], -1)


def _pack_crumbs(q: np.ndarray, chunk: int, bits: int = 2) -> np.ndarray:
    """Inverse of chunked bit fields: per (8 / bits) * chunk values, byte i holds v[j * chunk + i] at bits * j."""
    per = 8 // bits
    q = q.reshape(q.shape[0], -1, per, chunk).astype(np.uint8)
    shifts = (np.arange(per, dtype=np.uint8) * bits).reshape(1, 1, per, 1)
    return np.bitwise_or.reduce(q << shifts, axis=2).reshape(q.shape[0], -1)


def _k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins -> Q4_K / Q5_K's 12 bytes."""
    d = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    mm = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    md = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return np.concatenate([d, mm, md], axis=-1).astype(np.uint8)


def _q4_k(x):
    q, sc, m, d, dm = _affine(x, 32, 15, 6)
    return np.concatenate([d, dm, _k_scales(sc, m), _pack_nibbles(q, 32)], axis=-1)


def _q5_k(x):
    q, sc, m, d, dm = _affine(x, 32, 31, 6)
    return np.concatenate([d, dm, _k_scales(sc, m), _pack_crumbs(q >> 4, 32, bits=1),
                           _pack_nibbles(q & 15, 32)], axis=-1)


def _q2_k(x):
    q, sc, m, d, dm = _affine(x, 16, 3, 4)
    return np.concatenate([sc | (m << 4), _pack_crumbs(q, 32), d, dm], axis=-1)


def _symmetric(x: np.ndarray, low: int, high: int, scale_lo: int, scale_hi: int):
    """Per 16: value = d * sc * q, q in low..high (the extreme lands on `low`), sc in scale_lo..scale_hi."""
    g = x.reshape(x.shape[0], -1, 16)
    extreme = np.take_along_axis(g, np.abs(g).argmax(-1)[..., None], -1)[..., 0]
    step = extreme / low                                                   # signed: extreme -> low
    d_bytes, d = _f16(np.abs(step).max(-1) / max(-scale_lo, scale_hi))
    sc = np.clip(np.rint(_div(step, d)), scale_lo, scale_hi)
    q = np.clip(np.rint(_div(g, (d * sc)[..., None])), low, high)
    return q.reshape(x.shape[0], -1).astype(np.int16), sc.astype(np.int16), d_bytes


def _q6_k(x):
    q, sc, d = _symmetric(x, -32, 31, -128, 127)
    u = (q + 32).astype(np.uint8)
    ql = np.concatenate([_pack_nibbles(u[:, :128] & 15, 64), _pack_nibbles(u[:, 128:] & 15, 64)], axis=-1)
    return np.concatenate([ql, _pack_crumbs(u >> 4, 32), sc.astype(np.int8).view(np.uint8), d], axis=-1)


def _q3_k(x):
    q, sc, d = _symmetric(x, -4, 3, -32, 31)
    u, s = (q + 4).astype(np.uint8), (sc + 32).astype(np.uint8)            # q + 4 in 0..7; its bit 2 -> hmask
    scales = np.concatenate([(s[:, :8] & 15) | ((s[:, 8:] & 15) << 4),
                             _pack_crumbs(s >> 4, 4)], axis=-1)
    return np.concatenate([_pack_crumbs(u >> 2, 32, bits=1), _pack_crumbs(u & 3, 32), scales, d], axis=-1)


RANDOM = ("IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S")
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def _random_blocks(w: np.ndarray, qtype) -> np.ndarray:
    """Random bytes as blocks of qtype, each drawn again until gguf-py decodes it to finite values within the
    weight's range (a random float16 scale is mostly far outside it)."""
    rng, size, nbytes = np.random.default_rng(0), *gguf.GGML_QUANT_SIZES[qtype]
    top = float(np.abs(w).max())
    blocks = rng.integers(0, 256, (w.size // size, nbytes), dtype=np.uint8)
    for _ in range(10_000):
        with np.errstate(invalid="ignore", over="ignore"):                 # NaN / inf scales: drawn again
            values = gguf.quants.dequantize(blocks, qtype).reshape(len(blocks), -1)
        bad = ~(np.isfinite(values).all(-1) & (np.abs(values).max(-1) <= top) & (np.abs(values).max(-1) > top / 64))
        if not bad.any():
            return blocks.reshape(w.shape[0], -1)
        blocks[bad] = rng.integers(0, 256, (int(bad.sum()), nbytes), dtype=np.uint8)
    raise AssertionError(f"no valid random {qtype.name} blocks")


def _nearest_iq4(x: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Codes of IQ4's non-linear levels nearest x / step (per element)."""
    return np.abs(_div(x, step)[..., None] - IQ4_VALUES).argmin(-1).astype(np.uint8)


def _iq4_nl(x):
    """Per 32: d = the value of largest magnitude / -127 (it gets level -127), codes the nearest levels."""
    d_bytes, d = _f16(np.take_along_axis(x, np.abs(x).argmax(-1)[:, None], -1)[:, 0] / -127)
    return np.concatenate([d_bytes, _pack_nibbles(_nearest_iq4(x, d), 16)], axis=-1)


def _iq4_xs(x):
    """Per 256: d, and per 32 a six-bit scale ls (d * (ls - 32) the sub-block's step), as IQ4_NL's levels."""
    g = x.reshape(x.shape[0], 8, 32)
    step = np.take_along_axis(g, np.abs(g).argmax(-1)[..., None], -1)[..., 0] / -127      # [nb, 8]
    d_bytes, d = _f16(np.abs(step).max(-1) / 31)
    ls = np.clip(np.rint(_div(step, d)) + 32, 0, 63).astype(np.uint16)
    codes = _nearest_iq4(g, (d * (ls.astype(np.float32) - 32))[..., None])
    high = np.bitwise_or.reduce((ls >> 4) << (2 * np.arange(8, dtype=np.uint16)), axis=-1).astype(np.uint16)
    low = (ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)
    return np.concatenate([d_bytes, high[:, None].view(np.uint8), low.astype(np.uint8),
                           _pack_nibbles(codes.reshape(x.shape[0], -1), 16)], axis=-1)


_ENCODE = {"Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k, "IQ4_XS": _iq4_xs}
