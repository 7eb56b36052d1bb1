"""Numpy side of the quantized formats (see quant_modules.QuantFormat for the layouts).

    quantize(fmt, w)          float [N, K] -> planes (what q4f32 / q4f16 / q8f32 store)
    dequantize(fmt, planes)   planes -> float [N, K], the reference the kernels are tested against

(llama.cpp's blocks -> planes, values unchanged, is quant_gguf.from_gguf_blocks.)

Everything works row by row along K, so converting the HF tensors of a fused weight
(q/k/v, gate/up) one at a time and concatenating the planes along N is exact.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kiln.models.prequantized import unpack_nibbles   # uint32 [N, K/8] -> uint8 codes [N, K]: pack_nibbles' inverse
from kiln.models.source import usable_cores

from .quant_modules import BYTE_KINDS, FLOAT_KINDS, QuantFormat

Planes = dict[str, np.ndarray]

# Rows are quantized a chunk at a time, about this many values, the chunks spread over every core.
# numpy's q4 search: its float32 groups and temporaries stay near the core, and each numpy call takes
# the GIL between chunks' work (an 8192x4096 float16 weight on 2 AMD EPYC cores, 1 / 2 threads,
# M values/s: 2**15 33.4 / 25.7, 2**17 43.1 / 64.1, 2**19 47.3 / 91.0, 2**20 48.8 / 94.3; the 8B on
# the H100 host's 12 worker threads reached 164 M/s). The host profile's compiled q4 quantizer (what
# conversion runs) releases the GIL for the whole chunk.
_CHUNK_VALUES = 1 << 20
_Q4_DIVISORS = np.arange(-9, -5.9, 0.25, dtype=np.float32)   # q4 candidate scales: extreme / d


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """uint8 codes 0..15 [N, K] -> uint32 [N, K/8]; element k sits in word k // 8 at bits 4 * (k % 8)."""
    n, k = q.shape
    pairs = np.ascontiguousarray(q[:, 0::2] | (q[:, 1::2] << 4))      # byte j: elements 2j, 2j + 1
    return pairs.view("<u4").astype(np.uint32, copy=False).reshape(n, k // 8)   # 4 bytes per word, little end first


def quantize(fmt: QuantFormat, w: np.ndarray, reference: bool = False) -> Planes:
    """Round a float weight [N, K] to `fmt`, group-wise along K.

    q4: the scale with the least squared error among candidates (see _q4_levels), computed by the
    host profile's compiled quantizer where it has one (the same bits; `reference`: by numpy here);
    q8: scale = max|w| / 127 (a power of two where that holds the group exactly: _q8_scale); q4m / q8m:
    [min, max] in 15 / 255 steps; f16 / bf16: each value rounded to the nearest (a value stored in that
    type is kept as it is).
    """
    if fmt.kind in FLOAT_KINDS:
        return {"qweight": _half(fmt.kind, w)}
    n, k = w.shape
    fmt.planes(n, k)                                     # validates K against the group size
    rows = max(1, _CHUNK_VALUES // k)
    if n > rows:
        parts = list(_chunks().map(lambda i: quantize(fmt, w[i:i + rows], reference), range(0, n, rows)))
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    if fmt.kind == "q4" and fmt.group_size == 32 and not reference and _host_q4() is not None:
        return _host_q4()(w, fmt.scale_dtype)
    groups = w.astype(np.float32).reshape(n, k // fmt.group_size, fmt.group_size)
    if fmt.kind in ("q4m", "q8m"):
        top = 15 if fmt.kind == "q4m" else 255
        lo, hi = groups.min(-1, keepdims=True), groups.max(-1, keepdims=True)
        scale = _stored(((hi - lo) / top), fmt.scale_dtype)
        minimum = _stored(lo, fmt.scale_dtype)
        q = np.clip(np.rint((groups - minimum) * _inverse(scale)), 0, top).astype(np.uint8).reshape(n, k)
        return {"qweight": pack_nibbles(q) if fmt.kind == "q4m" else q, "scale": scale[..., 0], "min": minimum[..., 0]}
    if fmt.kind == "q4":
        levels, scale = _q4_levels(groups)
        q = (levels + 8).astype(np.uint8)
        return {"qweight": pack_nibbles(q.reshape(n, k)), "scale": _stored(scale, fmt.scale_dtype)[..., 0]}
    scale = _q8_scale(groups, fmt.scale_dtype)
    q = np.clip(np.rint(groups * _inverse(scale)), -127, 127).astype(np.int8)
    return {"qweight": q.reshape(n, k), "scale": scale[..., 0]}


def _q8_scale(groups: np.ndarray, dtype: str) -> np.ndarray:
    """q8's scale per group: max|w| / 127, except for a group whose values are all whole multiples of the
    power of two that puts its largest in [64, 128) (MXFP4's: e2m1 codes times a power of two, which
    float q8 would round): that power of two, which holds them exactly."""
    amax = np.abs(groups).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        pow2 = _stored(np.exp2(np.floor(np.log2(amax, where=amax > 0, out=np.zeros_like(amax))) - 6), dtype)
    step = pow2.astype(np.float32)
    exact = (amax > 0) & np.all(groups == np.rint(groups / np.where(step == 0, 1, step)) * step, -1, keepdims=True)
    return np.where(exact, pow2, _stored(amax / 127, dtype))


@functools.cache
def _host_q4():
    """The q4 quantizer the machine running kiln offers (its profile's q4_quantizer), or None."""
    from kiln.targets import DEFAULT_TARGET, get_profile
    return get_profile(DEFAULT_TARGET).q4_quantizer


@functools.cache
def _chunks() -> ThreadPoolExecutor:
    """The threads every quantize() call shares for its row chunks, one per core: a weight's chunks
    spread over all of them (numpy releases the GIL), so one large weight (an 8B model's 525 M-value
    embedding) is not one core's work while the others wait for it."""
    return ThreadPoolExecutor(usable_cores(), thread_name_prefix="kiln-quantize")


def _q4_levels(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 groups [n, G, size] -> levels -8..7 [n, G, size] and scales [n, G, 1].

    Each candidate scale extreme / d (extreme: the group's value of largest magnitude; d in
    _Q4_DIVISORS, so the extreme lands on or near the grid's bottom level -8, which has no
    positive twin) rounds the group to levels l; the least-squares scale for those levels,
    sum(w l) / sum(l l), leaves a squared error of sum(w w) - sum(w l)^2 / sum(l l). The levels
    with the largest sum(w l)^2 / sum(l l) win, with their least-squares scale (llama.cpp's
    make_qx_quants, unweighted). On SmolLM2 this cuts the squared error by 22% against
    extreme / -8 alone.
    """
    extreme = np.take_along_axis(groups, np.abs(groups).argmax(-1)[..., None], axis=-1)   # [n, G, 1]
    inverse = _inverse(extreme)
    levels = np.empty_like(groups)
    best_fit = np.full(extreme.shape[:-1], -1, np.float32)        # [n, G]
    best_d = np.zeros_like(extreme)                               # the winner's d; 0: none won (all-zero, NaN)
    for d in _Q4_DIVISORS:
        _round_levels(groups, inverse * d, levels)
        fit = _dot(groups, levels) ** 2 * _inverse(_dot(levels, levels))
        better = fit > best_fit
        np.copyto(best_fit, fit, where=better)
        np.copyto(best_d[..., 0], d, where=better)
    _round_levels(groups, inverse * best_d, levels)               # the winner's levels, recomputed alike
    np.copyto(levels, 0, where=best_d == 0)
    scale = _dot(groups, levels) * _inverse(_dot(levels, levels))
    return levels, scale[..., None]


def _round_levels(groups: np.ndarray, step: np.ndarray, out: np.ndarray) -> None:
    """out = clip(rint(groups * step), -8, 7), in place."""
    np.multiply(groups, step, out=out)
    np.clip(np.rint(out, out=out), -8, 7, out=out)


def _half(kind: str, w: np.ndarray) -> np.ndarray:
    """float16, or bfloat16's bits (uint16: the top half of the float32, rounded to nearest even)."""
    if kind == "f16":
        return np.ascontiguousarray(w.astype(np.float16, copy=False))
    bits = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))
    rounded = np.where(np.isnan(w), bits | np.uint32(0x400000), rounded)     # NaN stays NaN
    return (rounded >> 16).astype(np.uint16)


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum(a * b) over the last axis, products and sum in float64 (exact for float16 and bfloat16
    weights, so any summation order gives these bits: the compiled quantizer's does), rounded to float32."""
    return np.einsum("...i,...i->...", a, b, dtype=np.float64).astype(np.float32)


def _stored(scale: np.ndarray, dtype: str) -> np.ndarray:
    """The scale as stored (rounded to its dtype); q8 and q4m round against it, so codes match it."""
    return scale.astype(dtype)


def _inverse(scale: np.ndarray) -> np.ndarray:
    s = scale.astype(np.float32)
    with np.errstate(divide="ignore"):
        return np.where(s == 0, np.float32(0), np.float32(1) / s)


def dequantize(fmt: QuantFormat, planes: Planes, dtype: str = "float32") -> np.ndarray:
    """planes -> float [N, K] in `dtype`, with the same operations the TE dequantize performs."""
    q = planes["qweight"]
    if fmt.kind == "f16":
        return q.astype(dtype)
    if fmt.kind == "bf16":
        return (q.astype(np.uint32) << 16).view(np.float32).astype(dtype)
    if fmt.kind not in BYTE_KINDS:
        q = unpack_nibbles(q)
    n, k = q.shape
    scale = np.repeat(planes["scale"].astype(dtype), fmt.group_size, axis=1)
    values = q.astype(dtype)
    if fmt.kind == "q4":
        return (values - np.asarray(8, dtype)) * scale
    if fmt.kind in ("q4m", "q8m"):
        return values * scale + np.repeat(planes["min"].astype(dtype), fmt.group_size, axis=1)
    return values * scale


__all__ = ["Planes", "dequantize", "pack_nibbles", "quantize", "unpack_nibbles"]
