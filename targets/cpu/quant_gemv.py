"""A hand-written one-row GEMV for kiln's 4-, 8- and 16-bit weights in float32 (batch-1 decode on a CPU).

Why: QuantMatmul's scheduled GEMV decodes every weight to a float before its multiply-add: per 16
values a load and a permute of two words, a variable shift, a mask, a conversion, the scale's
multiply-add (and the min's), then the activation's; one accumulator chain, and a 16-lane sum
added one lane at a time after each row. On a znver4 that ran SmolLM2's 4-bit projections at
15-17 GB/s of planes on 2 cores, far from the 50 GB/s they read: bound by instructions, not bytes.

Here the arithmetic is regrouped, for the same values (weights exactly as stored, float32
throughout): a group's scale s and min m (q4: m = -8 s) are per group, so

    sum_k x_k (q_k s + m) = s * sum_k x_k q_k + m * sum_k x_k

and the row's sum is sum over 32-value chunks of s * (x . q), plus sum over groups of m * (the
group's sum of x), computed once per call. Per chunk of 32 values: one 16-byte load widened to 16
lanes (4-bit: low nibbles are the even values, high nibbles the odd ones, against the activations
deinterleaved once per call; 8-bit: two loads of 16 codes), a mask and a shift, two conversions,
two multiply-adds and the scale's: 8 vector instructions per 32 values where the scheduled GEMV
spends ~14. Two accumulators take alternate chunks; the lanes are summed by halving.

Measured (znver4, 2 cores, cold planes, kernels alone, best of 15): SmolLM2's gate/up q4m (3072 x
576) 45-48 us against the scheduled GEMV's 82; down (576 x 1536) 24 against 39; qkv (960 x 576) 16
against 27; 8-bit 1.1-1.5x, 16-bit floats 1.02-1.16x (already near the bytes' floor, 30-32 GB/s)
(tools/bench_cpu_gemv.py). Its Q8_0 LM head (49152 x 576, 32 MB) alone: 0.72-0.99 ms against
1.1-1.3 (runs swing on a shared host); inside a decode step little gain (1.22 / 1.27 ms against
1.29 / 1.39 in back-to-back profiles): there it waits on memory either way.
Compiled for haswell (AVX2) on the same host: 56 against 92-95 us, 30 against 44.
SmolLM2 Q4_1 batch-1 decode: 179 / 164 tok/s against 125 / 119 (kiln bench, alternating runs).
Sums are in another order than the matmul's (float32 rounding, not the weights, differs).

Matched (``match``): a function exactly kiln's `dequantize` (q4, q4m, q8 or q8m with float32 scales
and any group a multiple of 32, either code form; or f16 / bf16, 16-bit floats without scales, two
multiply-adds a chunk) into an `NT_matmul` of float32 activations with float32 sums, no cast after,
over symbolic rows; K a multiple of 64. Anything else: None (QuantMatmul schedules it). QuantMatmul
runs the kernel where the call has one row. F16 GGUF SmolLM2 decode: 111 tok/s = 0.99x llama.cpp
(98, 0.87x, before); Q4_1: 165 = 1.15x (122, 0.85x); Q5_1 (q8m): 113 = 0.98x (109, 0.84x), one
tools/compare_llamacpp.py --rounds 3 run each.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import ir, s_tir, tirx
from tvm.script import tirx as T
from tvm_ffi import structural_equal

from kiln.compiler.quant_modules import BYTE_CODES, FLOAT_KINDS, QuantFormat, dequantize_element

CHUNK = 32                  # values a chunk: 16 bytes of 4-bit codes, 32 of 8-bit
LANES = 16                  # float32 lanes of the vectors written (LLVM splits them where registers are narrower)
CHAINS = 2                  # accumulators taking alternate chunks
_CODE_DTYPES = {"q4": "uint32", "q4m": "uint32", **BYTE_CODES, "f16": "float16", "bf16": "uint16"}
_MIN_KINDS = ("q4m", "q8m")


@dataclass(frozen=True)
class Match:
    kind: str               # q4, q4m, q8, q8m, f16, bf16
    group: int
    n: int
    k: int
    planes: tuple           # the function's buffers: codes, scale, min (None where the format has none)
    x: tirx.Buffer          # activations [rows, 1, K]
    y: tirx.Buffer          # sums [rows, 1, N]


def match(func: tirx.PrimFunc) -> Match | None:
    """The function's buffers and format if it is a dequantize + NT matmul this kernel computes."""
    sch = s_tir.Schedule(func)
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    if [b.name_hint for b in blocks] != ["dequantize", "NT_matmul"]:
        return None
    deq, mm = blocks
    reads = [r.source for r in deq.reads]
    if not 1 <= len(reads) <= 3 or deq.writes[0].source.dtype != "float32":
        return None
    codes, scale, minimum = (reads + [None, None])[:3]
    n, k = (_int(d) for d in deq.writes[0].source.shape)
    if n is None or k is None or k % (2 * CHUNK):
        return None
    group = CHUNK                                       # (16-bit floats have no groups)
    if scale is not None:
        groups = _int(scale.shape[1]) if len(scale.shape) == 2 else None
        if scale.dtype != "float32" or not groups or k % groups or (k // groups) % CHUNK or _int(scale.shape[0]) != n:
            return None
        group = k // groups
        if minimum is not None and [_int(d) for d in minimum.shape] != [n, groups]:
            return None
    v_n, v_k = (iv.var for iv in deq.iter_vars)
    kind = next((kind for kind in _CODE_DTYPES if _CODE_DTYPES[kind] == codes.dtype
                 and (scale is None) == (kind in FLOAT_KINDS) and (minimum is not None) == (kind in _MIN_KINDS)
                 and any(structural_equal(deq.body.value, dequantize_element(
                     QuantFormat(kind, group, "float32"), "float32", codes, scale, minimum, v_n, v_k, by_bits))
                     for by_bits in (False, True))), None)
    if kind is None:
        return None
    x = next((r.source for r in mm.reads if not r.source.same_as(deq.writes[0].source)), None)
    y = mm.writes[0].source
    if x is None or x.dtype != "float32" or y.dtype != "float32" or len(x.shape) != 3 or len(y.shape) != 3:
        return None
    rows = x.shape[0]
    if not isinstance(rows, tirx.Var) or not y.shape[0].same_as(rows):
        return None
    if [_int(d) for d in x.shape[1:]] != [1, k] or [_int(d) for d in y.shape[1:]] != [1, n]:
        return None
    i0, i1, i2, vk = (iv.var for iv in mm.iter_vars)
    if not structural_equal(mm.body.value, y[i0, i1, i2] + x[i0, i1, vk] * deq.writes[0].source[i2, vk]):
        return None
    return Match(kind, group, n, k, (codes, scale, minimum), x, y)


def one_row_body(func: tirx.PrimFunc, m: Match) -> tirx.PrimFunc:
    """``func`` with a body computing row 0 by the kernel (its buffers matched onto func's)."""
    kernel = gemv_kernel(m.kind, m.n, m.k, m.group)
    codes, scale, minimum = m.planes
    originals = [p for p in (codes, scale, minimum) if p is not None] + [m.x, m.y]
    matches = []
    for bound, original in zip(kernel.params, originals):       # (params are the buffers themselves)
        region = [ir.Range.from_min_extent(tirx.IntImm(str(d.ty.dtype), 0), d) for d in bound.shape]
        matches.append(s_tir.MatchBufferRegion(bound, tirx.BufferRegion(original, region)))
    view = s_tir.SBlock([], [], [], "one_row_gemv", kernel.body, match_buffers=matches)
    root = s_tir.SBlock([], [], [], "root", s_tir.SBlockRealize([], True, view))
    return func.with_body(s_tir.SBlockRealize([], True, root))


def gemv_kernel(kind: str, n: int, k: int, group: int) -> tirx.PrimFunc:
    """Y[0, 0, :n] = X[0, 0, :k] . W[n, k] for kiln's `kind` planes (group `group`), float32."""
    chunks, groups, per = k // CHUNK, k // group, group // CHUNK
    four_bit, scaled = kind in ("q4", "q4m"), kind not in FLOAT_KINDS
    has_min = scaled and kind != "q8"
    code_cols = k // 8 if four_bit else k
    byte_cols = k // 2 if four_bit else k
    byte_dtype = "uint8" if four_bit else _CODE_DTYPES[kind]
    acc_len = CHAINS * LANES

    def x_value(X, c, h, i):
        """Lane i of the chunk's half h as the codes are read: 4-bit, the even then the odd values."""
        return X[0, 0, c * CHUNK + 2 * i + h] if four_bit else X[0, 0, c * CHUNK + h * LANES + i]

    def code(Wb, row, c, h, i):
        """The code lane i of chunk c's half h multiplies, as float32 (4-bit: byte i's low / high nibble)."""
        if four_bit:
            byte = T.Cast("int32", Wb[row, c * 16 + i])
            return T.Cast("float32", byte & 15 if h == 0 else byte >> 4)
        if kind == "bf16":                              # bfloat16's bits are float32's high half
            return T.reinterpret("float32", T.shift_left(T.Cast("uint32", Wb[row, c * CHUNK + h * LANES + i]),
                                                         T.uint32(16)))
        return T.Cast("float32", Wb[row, c * CHUNK + h * LANES + i])

    def group_min(S, M, row, g):
        """The value a zero code stands for: q4's -8 scale, q4m's and q8m's min."""
        return S[row, g] * T.float32(-8) if kind == "q4" else M[row, g]

    @T.macro
    def halve(buf, base):
        """buf[base] = the sum of buf[base : base + LANES], by halves (vector adds, then 2 + 2)."""
        for i in T.vectorized(LANES // 2):
            buf[base + i] = buf[base + i] + buf[base + LANES // 2 + i]
        for i in T.vectorized(LANES // 4):
            buf[base + i] = buf[base + i] + buf[base + LANES // 4 + i]
        buf[base] = (buf[base] + buf[base + 2]) + (buf[base + 1] + buf[base + 3])

    @T.macro
    def body(W, S, M, X, Y):
        xp = T.alloc_buffer((k,), "float32")              # x in the order the codes are read
        xs = T.alloc_buffer((groups,), "float32")         # each group's sum of x (the min's factor)
        part = T.alloc_buffer((LANES,), "float32")
        Wb = T.decl_buffer((n, byte_cols), byte_dtype, data=W.data)
        for c in range(chunks):
            for h in range(2):
                for i in T.vectorized(LANES):
                    xp[c * CHUNK + h * LANES + i] = x_value(X, c, h, i)
        if has_min:
            for g in range(groups):
                for i in T.vectorized(LANES):
                    part[i] = T.float32(0)
                for c in range(per):
                    for i in T.vectorized(LANES):
                        part[i] = part[i] + (xp[(g * per + c) * CHUNK + i] + xp[(g * per + c) * CHUNK + LANES + i])
                halve(part, 0)
                xs[g] = part[0]
        for row in T.parallel(n):
            acc = T.alloc_buffer((acc_len,), "float32")
            for i in T.vectorized(acc_len):
                acc[i] = T.float32(0)
            for co in range(chunks // CHAINS):
                for ch in T.unroll(CHAINS):
                    for i in T.vectorized(LANES):
                        if scaled:
                            acc[ch * LANES + i] = acc[ch * LANES + i] + (
                                xp[(co * CHAINS + ch) * CHUNK + i] * code(Wb, row, co * CHAINS + ch, 0, i)
                                + xp[(co * CHAINS + ch) * CHUNK + LANES + i] * code(Wb, row, co * CHAINS + ch, 1, i)
                            ) * S[row, (co * CHAINS + ch) // per]
                        else:
                            acc[ch * LANES + i] = (
                                acc[ch * LANES + i]
                                + xp[(co * CHAINS + ch) * CHUNK + i] * code(Wb, row, co * CHAINS + ch, 0, i)
                                + xp[(co * CHAINS + ch) * CHUNK + LANES + i] * code(Wb, row, co * CHAINS + ch, 1, i))
            if has_min:
                for v in range(groups // LANES):            # whole vectors of groups into the second chain
                    for i in T.vectorized(LANES):
                        acc[LANES + i] = acc[LANES + i] + group_min(S, M, row, v * LANES + i) * xs[v * LANES + i]
            for i in T.vectorized(LANES):
                acc[i] = acc[i] + acc[LANES + i]
            halve(acc, 0)
            if has_min:
                for g in range(groups // LANES * LANES, groups):    # the groups left over
                    acc[0] = acc[0] + group_min(S, M, row, g) * xs[g]
            Y[0, 0, row] = acc[0]

    w_shape, w_dtype = (n, code_cols), _CODE_DTYPES[kind]
    if kind in _MIN_KINDS:
        @T.prim_func(private=True)
        def with_min(codes: T.Buffer(w_shape, w_dtype), scales: T.Buffer((n, groups), "float32"),
                     mins: T.Buffer((n, groups), "float32"), x: T.Buffer((1, 1, k), "float32"),
                     y: T.Buffer((1, 1, n), "float32")):
            T.func_attr({"tirx.noalias": True})
            body(codes, scales, mins, x, y)
        return with_min

    if not scaled:
        @T.prim_func(private=True)
        def unscaled(codes: T.Buffer(w_shape, w_dtype), x: T.Buffer((1, 1, k), "float32"),
                     y: T.Buffer((1, 1, n), "float32")):
            T.func_attr({"tirx.noalias": True})
            body(codes, codes, codes, x, y)
        return unscaled

    @T.prim_func(private=True)
    def without_min(codes: T.Buffer(w_shape, w_dtype), scales: T.Buffer((n, groups), "float32"),
                    x: T.Buffer((1, 1, k), "float32"), y: T.Buffer((1, 1, n), "float32")):
        T.func_attr({"tirx.noalias": True})
        body(codes, scales, scales, x, y)
    return without_min


def _int(dim) -> int | None:
    return int(dim) if isinstance(dim, tirx.IntImm) else None
