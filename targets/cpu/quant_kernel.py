"""The q4 quantizer compiled by TVM for this CPU: what weight conversion runs.

quant_pack._q4_levels (numpy) tries 13 candidate scales per group of 32 values, and each try is
a handful of numpy passes over a chunk: ~80 passes over memory for every weight, and a numpy call
that holds the GIL between them. On the H100 host's 12 worker threads the 8B's weights converted
at 164 M values a second in all, where one thread here does ~50 M. This kernel does the same
arithmetic on 16 groups at a time in SIMD registers (each group's 32 values transposed into the
lanes), one pass over the weight, and TVM's calls release the GIL, so quant_pack's row chunks
run on every core.

The same bits as the numpy reference: the same candidates in the same order, products and the
two dot products in float64 (exact for float16 and bfloat16 weights: quant_pack._dot computes
them the same way), the same float32 roundings (rint: round half to even), the first maximum
for a group's extreme, the first best candidate (tests/unit/test_quant_kernel.py holds the two to
each other). The host CPU profile offers it (TargetProfile.q4_quantizer) and
compiler/quant_pack.quantize takes it from there. Finite weights only: a group holding NaN or infinity gets a non-finite scale, and
q4_quantize refuses the weight (numpy would quantize it to garbage).
"""

from __future__ import annotations

import threading

import numpy as np

GROUP = 32
LANES = 16                        # groups a SIMD step
DIVISORS = [-9.0 + 0.25 * i for i in range(13)]     # quant_pack._Q4_DIVISORS, exactly


def q4_quantize_func(src_dtype: str, scale_dtype: str):
    """The PrimFunc: weights [groups, 32] of `src_dtype` -> packed codes [groups, 4] uint32 and
    scales [groups] of `scale_dtype` (kiln's q4 planes of the same rows, flattened)."""
    from tvm.script import tirx as T

    words = GROUP // 8

    def divisor(c):
        """DIVISORS[c] for a loop index c (evenly spaced, exact in float32)."""
        return T.float32(DIVISORS[0]) + T.float32(DIVISORS[1] - DIVISORS[0]) * T.Cast("float32", c)

    def reciprocal(v):
        return T.Select(v == T.float32(0), T.float32(0), T.float32(1) / v)

    exact_products = src_dtype == "float16"      # 11 x 4 bits: x * level is exact in float32

    def clipped(v, step):
        """clip(rint(v * step), -8, 7) (rint: nearbyint, half to even)."""
        return T.max(T.min(T.nearbyint(v * step), T.float32(7)), T.float32(-8))

    def product(v, level):
        if exact_products:
            return T.Cast("float64", v * level)
        return T.Cast("float64", v) * T.Cast("float64", level)

    @T.macro
    def tries(x, step, lv, wl, ll):
        """wl = sum(x * level) in float64 and ll = sum(level^2) (exact in float32: at most 32 * 64) per
        lane, level = clipped(x, step)."""
        for lane in T.vectorized(LANES):
            wl[lane] = T.float64(0)
            ll[lane] = T.float32(0)
        for i in T.serial(GROUP):
            for lane in T.vectorized(LANES):     # (buffers, not T.let: TVM's vectorizer takes a let's lane 0)
                lv[lane] = clipped(x[i, lane], step[lane])
                wl[lane] = wl[lane] + product(x[i, lane], lv[lane])
                ll[lane] = ll[lane] + lv[lane] * lv[lane]

    @T.prim_func
    def q4_quantize(w_handle: T.handle, q_handle: T.handle, s_handle: T.handle):
        T.func_attr({"global_symbol": "q4_quantize", "tirx.noalias": True})
        groups = T.int64()
        W = T.match_buffer(w_handle, (groups, GROUP), src_dtype)
        Q = T.match_buffer(q_handle, (groups, words), "uint32")
        S = T.match_buffer(s_handle, (groups,), scale_dtype)
        for block in T.serial((groups + LANES - 1) // LANES):
            # LANES groups from g0, a group a lane; the last block ends at the last group (re-doing a
            # few of the previous block's: the same bits; q4_quantize pads fewer than LANES groups)
            g0: T.let[T.int64] = T.min(block * LANES, groups - LANES)
            rows = T.alloc_buffer((LANES, GROUP), "float32")
            x = T.alloc_buffer((GROUP, LANES), "float32")
            extreme = T.alloc_buffer((LANES,), "float32")
            inv = T.alloc_buffer((LANES,), "float32")
            best_fit = T.alloc_buffer((LANES,), "float32")
            best_d = T.alloc_buffer((LANES,), "float32")
            step = T.alloc_buffer((LANES,), "float32")
            lv = T.alloc_buffer((LANES,), "float32")
            fit = T.alloc_buffer((LANES,), "float32")
            wl = T.alloc_buffer((LANES,), "float64")
            ll = T.alloc_buffer((LANES,), "float32")
            code = T.alloc_buffer((words, LANES), "uint32")
            for lane in T.serial(LANES):                     # contiguous loads, then the transpose
                for i in T.vectorized(GROUP):
                    rows[lane, i] = T.Cast("float32", W[g0 + lane, i])
            for i in T.serial(GROUP):
                for lane in T.vectorized(LANES):
                    x[i, lane] = rows[lane, i]
            for lane in T.vectorized(LANES):
                extreme[lane] = x[0, lane]
            for i in T.serial(1, GROUP):       # the first value of largest magnitude
                for lane in T.vectorized(LANES):
                    extreme[lane] = T.Select(T.fabs(x[i, lane]) > T.fabs(extreme[lane]), x[i, lane], extreme[lane])
            for lane in T.vectorized(LANES):
                inv[lane] = T.Select(extreme[lane] == T.float32(0), T.float32(0), T.float32(1) / extreme[lane])
                best_fit[lane] = T.float32(-1)
                best_d[lane] = T.float32(0)
            for c in T.unroll(len(DIVISORS)):
                for lane in T.vectorized(LANES):
                    step[lane] = inv[lane] * divisor(c)
                tries(x, step, lv, wl, ll)
                for lane in T.vectorized(LANES):
                    fit[lane] = T.Cast("float32", wl[lane]) * T.Cast("float32", wl[lane]) * reciprocal(ll[lane])
                    best_d[lane] = T.Select(fit[lane] > best_fit[lane], divisor(c), best_d[lane])
                    best_fit[lane] = T.Select(fit[lane] > best_fit[lane], fit[lane], best_fit[lane])
            # the winner's levels, its least-squares scale, the packed codes (finite weights: some
            # candidate always wins, its fit >= 0)
            for lane in T.vectorized(LANES):
                step[lane] = inv[lane] * best_d[lane]
            tries(x, step, lv, wl, ll)
            for lane in T.vectorized(LANES):
                S[g0 + lane] = T.Cast(scale_dtype, T.Cast("float32", wl[lane]) * reciprocal(ll[lane]))
            for word in T.serial(words):
                for lane in T.vectorized(LANES):
                    code[word, lane] = T.uint32(0)
                for j in T.serial(8):
                    for lane in T.vectorized(LANES):
                        code[word, lane] = code[word, lane] | T.shift_left(
                            T.Cast("uint32", clipped(x[word * 8 + j, lane], step[lane]) + T.float32(8)),
                            T.Cast("uint32", 4 * j))
            for lane in T.serial(LANES):
                for word in T.vectorized(words):
                    Q[g0 + lane, word] = code[word, lane]

    return q4_quantize


_LOCK = threading.Lock()
_BUILT: dict[tuple[str, str], object] = {}


def _compiled(src_dtype: str, scale_dtype: str):
    """The kernel for (weight dtype, scale dtype), built once a process for this CPU (~0.3 s here)."""
    import tvm

    from . import cpu_profile
    with _LOCK:
        if (src_dtype, scale_dtype) not in _BUILT:
            func = q4_quantize_func(src_dtype, scale_dtype)
            lib = tvm.compile(tvm.IRModule({"q4_quantize": func}), target=cpu_profile().tvm_target())
            _BUILT[src_dtype, scale_dtype] = lib["q4_quantize"]
        return _BUILT[src_dtype, scale_dtype]


def q4_quantize(w: np.ndarray, scale_dtype: str) -> dict[str, np.ndarray]:
    """kiln's q4 planes of a float weight [N, K] (K a multiple of 32): {"qweight": uint32 [N, K/8],
    "scale": [N, K/32]}, as quant_pack.quantize makes them."""
    import tvm
    n, k = w.shape
    src = str(w.dtype) if w.dtype in (np.float16, np.float32) else "float32"
    flat = np.ascontiguousarray(w if str(w.dtype) == src else w.astype(np.float32)).reshape(-1, GROUP)
    groups = flat.shape[0]
    if groups < LANES:                               # the kernel works LANES groups at a time
        flat = np.concatenate([flat, np.zeros((LANES - groups, GROUP), flat.dtype)])
    words, scales = _aligned_empty((len(flat), GROUP // 8), np.uint32), _aligned_empty((len(flat),), scale_dtype)
    # the kernel reads and writes these numpy arrays in place (DLPack; TVM wants 64-byte alignment)
    flat = flat if flat.ctypes.data % _ALIGN == 0 else _aligned_copy(flat)
    _compiled(src, scale_dtype)(*(tvm.runtime.from_dlpack(a) for a in (flat, words, scales)))
    scale = scales[:groups]
    if not np.isfinite(scale).all():                  # a NaN or infinity in a group makes its scale one
        bad = int(np.count_nonzero(~np.isfinite(scale)))
        raise ValueError(f"{bad} groups of 32 values hold NaN or infinity (or exceed {scale_dtype}'s range): "
                         "the checkpoint is corrupt; re-download or re-export it")
    return {"qweight": words[:groups].reshape(n, k // 8), "scale": scale.reshape(n, k // GROUP)}


_ALIGN = 64


def _aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(size + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start:start + size].view(dtype).reshape(shape)


def _aligned_copy(a: np.ndarray) -> np.ndarray:
    out = _aligned_empty(a.shape, a.dtype)
    out[...] = a
    return out
