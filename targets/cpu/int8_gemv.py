"""GEMVs of 1-8 rows over 4-bit weights with int8 activations: `kiln compile --decode-activations int8`.

Why: quant_gemv.py's one-row kernel keeps every value exact (weights as stored, float32 activations)
and spends 8 vector instructions on 32 values (widen, mask, shift, two conversions, three
multiply-adds): on 2 znver4 cores its 4-bit projections read 10-18 GB/s of the 36 the host reads,
bound by instructions. llama.cpp's answer, taken here as an opt-in: the activations are quantized
once a call to int8, per 32 values (a chunk: scale dx = max|x| / 127, codes rint(x / dx)), and each
chunk's 32 products of 4-bit codes and int8 activations are summed by integer dot-product
instructions, 4 byte pairs into each 32-bit lane: vpdpbusd (AVX-512 VNNI with VL, or AVX-VNNI),
else AVX2's vpmaddubsw + vpmaddwd, or AArch64's sdot (FEAT_DotProd; `--target aarch64` and
`android` add +dotprod for such a build: TargetProfile.int8_features; each 256-bit step is two
128-bit sdots, checked under QEMU, speed unmeasured). A row's 64 values (two chunks, 32 bytes of codes) take one load,
a mask, a shift and a mask (the low and high nibbles in place: 0x0F0F0F0F), two dot products, the
two chunks' scales times their dx (one 4-byte load, its conversion and a shuffle), a conversion and
a multiply-add, all on 256-bit vectors: 12 where the exact kernel spends 16 of 512 bits.

    sum_k x_k (q_k s_g + m_g) ~= sum_c s_g(c) dx_c (xq_c . q_c) + sum_g m_g (sum of x over group g)

The min's term (q4m's min, q4's -8 s) keeps the exact float32 sums of x. The error is x's rounding
to 8 bits (llama.cpp's Q8_0 / Q8_1 activations, the same): 0.3-0.7% of the largest output on random
weights (tools/bench_cpu_gemv.py --int8); SmolLM2 Q4_1's perplexity over 400 tokens fed through
decode steps 21.82 against 21.56 exact (+1.2%). Matmuls of 9 rows or more (prefill, larger
batches) keep float32 activations.

2-8 rows (`batch` 2, 4 or 8; decode of that many sequences, a prefill's logits rows or a chunk of
that few tokens): each row's x quantized alike, each pair's codes unpacked once for every row of a
pass (BLOCK rows a pass over the weights, as quant_gemv's few_rows), two dot products, a conversion,
the scales times the row's dx and a multiply-add a row; tools/bench_cpu_gemv.py --int8 --rows
2,4,8 (q4m, float16 scales, 2 znver4 cores): qkv 1.52-1.87x, gate/up 1.60-1.85x, down 1.66-2.04x
quant_gemv's exact kernels; SmolLM2 Q4_1 decode of 4 sequences 395 against 317 tok/s, of 8 415
against 324. Built for haswell (AVX2: vpmaddubsw) on the same host: 1.37-1.73x at 1 row, 1.81-2.45x
at 4.

Measured (tools/bench_cpu_gemv.py --int8 --scale-dtype float16, SmolLM2's shapes, 2 znver4 cores,
256 MB of planes rotated, the two kernels alternating, us a call, int8 / exact): q4m qkv 16.5 / 23.0,
o 10.9 / 14.2, gate/up 43.0 / 66.4, down 27.2 / 35.4, a q4m LM head 597 / 993. 8-bit codes stay
exact: their exact kernel already reads near the host's bandwidth (Q8_0's SmolLM2 LM head 33 GB/s),
and the same arithmetic on them (|q| against x's codes given q's sign, vpsignb) measured 0.93-1.08x
with float32 scales, 0.97-1.33x with float16 ones, the LM head 1.00-1.01x.

Lanes: the codes' bytes of chunk c's half h (4-bit order, quant_gemv.nibble_col: byte i's low nibble
is value 2i, its high nibble 2i + 1) meet xe (x's even values, per chunk) and xo (its odd ones),
so 32-bit lane j of a pair's dot products sums chunk 2p + j // 4's values 8 (j % 4) .. 8 (j % 4) + 7
(interleaved); dxv repeats each chunk's dx over its 4 lanes, and the scale vector is shuffled alike.
"""

from __future__ import annotations

import platform

import tvm
from tvm import tirx
from tvm.script import tirx as T
from tvm.target import Target

from ..kernel_memo import parsed_once
from ..profile import INT8_DECODE_ATTR
from .lanes import LANES, add, fold16
from .prefetch import prefetch_read, rows_ahead
from .quant_gemv import planes_func

CHUNK = 32                  # values an activation scale serves (and a weight group's smallest size)
KINDS = ("q4", "q4m")       # the formats this kernel takes (unsigned 4-bit codes: vpdpbusd's first operand)
LINE = 64                   # bytes a prefetch asks for (a cache line: every other pair of chunks)
NIBBLES = 0x0F0F0F0F        # each byte's low nibble, in a 32-bit lane
ISAS = ("vnni", "avx2", "sdot")
BLOCK = 4                   # rows a pass over the weights serves (quant_gemv's: 8 rows, two passes)


def int8_isa(target: Target) -> str | None:
    """The dot-product instructions `target` has for the kernel: "vnni" (AVX-512 VNNI with VL, or
    AVX-VNNI: vpdpbusd on 256 bits), "avx2" (vpmaddubsw and vpmaddwd), "sdot" (AArch64's dot product,
    ARMv8.2's FEAT_DotProd: Cortex-A55/A75 and later, Apple M1 and A13 on, Graviton 2 on), or None."""
    from tvm.target.codegen import target_has_features
    if "llvm" not in target.kind.name:
        return None
    triple = str(target.attrs.get("mtriple", "")) or platform.machine()
    try:
        if triple.startswith(("aarch64", "arm64")):
            return "sdot" if target_has_features(["dotprod"], target) else None
        if target_has_features(["avx512vnni", "avx512vl"], target) or target_has_features(["avxvnni"], target):
            return "vnni"
        return "avx2" if target_has_features(["avx2"], target) else None
    except Exception:       # noqa: BLE001 (a target LLVM cannot resolve features for takes no kernel)
        return None


def takes(kind: str, k: int, group: int) -> bool:
    """Whether int8_gemv_kernel computes `kind` weights of K `k` in groups of `group`."""
    return kind in KINDS and group % CHUNK == 0 and k % (2 * CHUNK) == 0


def _dot(isa: str, acc, a, b):
    """acc (int32x8) plus, in each lane, the 4 products of a's unsigned bytes with b's signed ones
    (a, b: int32x8 holding 32 bytes each). sdot multiplies signed bytes: a's codes (0-15) are the
    same bytes signed; its 128-bit form runs on each half (LLVM splits the 256-bit vectors alike)."""
    a8, b8 = T.reinterpret("int8x32", a), T.reinterpret("int8x32", b)
    if isa == "sdot":
        def half(v, h, lanes):
            return T.Shuffle([v], list(range(h * lanes, (h + 1) * lanes)))
        return T.Shuffle([T.call_llvm_pure_intrin("int32x4", "llvm.aarch64.neon.sdot", half(acc, h, 4),
                                                  half(a8, h, 16), half(b8, h, 16)) for h in range(2)],
                         list(range(8)))
    if isa == "vnni":
        return T.call_llvm_pure_intrin("int32x8", "llvm.x86.avx512.vpdpbusd.256", acc, a8, b8)
    pairs = T.call_llvm_pure_intrin("int16x16", "llvm.x86.avx2.pmadd.ub.sw", a8, b8)   # |15 * 127 * 2| fits int16
    return acc + T.call_llvm_pure_intrin("int32x8", "llvm.x86.avx2.pmadd.wd", pairs, T.Broadcast(T.int16(1), 16))


@parsed_once(size="rows")
def int8_gemv_kernel(kind: str, n: int, k: int, group: int, scale_dtype: str, isa: str, batch: int = 1,
                     rows=None) -> tirx.PrimFunc:
    """y[:rows, 0, :n] ~= x[:rows, 0, :k] . W[n, k] for kiln's `kind` planes (KINDS, group a multiple of
    32, scales and mins in `scale_dtype`), x quantized to int8 per 32 values (module docstring); `isa`
    from int8_isa. batch 1: one row (rows None); else `rows` (a symbolic size, 2 to `batch` at run
    time), BLOCK rows a pass over the weights. quant_gemv.gemv_kernel's signatures."""
    if not takes(kind, k, group) or isa not in ISAS or (batch > 1) != (rows is not None):
        raise ValueError(f"int8_gemv_kernel takes {KINDS} with groups of 32s and K a multiple of 64 "
                         f"on {ISAS}, and rows with a batch; got {kind}, group {group}, K {k}, {isa}, "
                         f"batch {batch}")
    chunks, groups, per = k // CHUNK, k // group, group // CHUNK
    pairs, words = chunks // 2, k // 8              # a row's pairs of chunks, its 32-bit words of codes
    has_min = kind == "q4m"
    ahead = rows_ahead(k // 2)
    mask = T.Broadcast(T.int32(NIBBLES), 8)
    block = min(batch, BLOCK)
    rows_dtype = "int32" if rows is None else str(rows.ty.dtype)

    def scale(S, row, g):
        return S[row, g] if scale_dtype == "float32" else T.Cast("float32", S[row, g])

    def zero_of(S, M, row, g):
        """The value a zero code stands for in group g: q4m's min, q4's -8 scale."""
        return scale(M, row, g) if has_min else scale(S, row, g) * T.float32(-8)

    def pair_scales(S, row, p):
        """float32x8: chunk 2p's group scale in lanes 0-3, chunk 2p + 1's in lanes 4-7."""
        if per == 1:
            two = S.vload([row, 2 * p], f"{scale_dtype}x2")
            two = two if scale_dtype == "float32" else T.Cast("float32x2", two)
            return T.Shuffle([two, two, two, two], [0, 0, 0, 0, 1, 1, 1, 1])
        if per % 2 == 0:                            # both chunks in one group
            return T.Broadcast(scale(S, row, 2 * p // per), 8)
        return T.Shuffle([T.Broadcast(scale(S, row, 2 * p // per), 4),
                          T.Broadcast(scale(S, row, (2 * p + 1) // per), 4)], list(range(8)))

    def pair_dot(W32, xe32, xo32, row, b, p):
        """int32x8: chunks 2p and 2p + 1 of row `row` of W, its codes times x row b's int8 codes (lanes:
        module docstring): the low nibbles against x's even values (xe32), the high against its odd
        (xo32). An expression, not a let: TVM gives a vector let a buffer of its own (an allocation a row)."""
        low = W32.vload([row, p * 8], "int32x8") & mask
        high = T.shift_right(W32.vload([row, p * 8], "int32x8"), T.Broadcast(T.int32(4), 8)) & mask
        first = _dot(isa, T.Broadcast(T.int32(0), 8), low, xe32.vload([b * words + p * 8], "int32x8"))
        return _dot(isa, first, high, xo32.vload([b * words + p * 8], "int32x8"))

    def pair_sum(W32, S, xe32, xo32, dxv, row, b, p):
        """float32x8: pair p's products for x row b, scaled (its lanes' scales times their dx)."""
        return T.Cast("float32x8", pair_dot(W32, xe32, xo32, row, b, p)) * (
            pair_scales(S, row, p) * dxv.vload([b * chunks * 4 + p * 8], "float32x8"))

    @T.macro
    def prefetch(W32, row, p):
        if ahead > 0 and p * 32 % LINE == 0:
            T.evaluate(prefetch_read(T.address_of(W32[T.min(row + ahead, n - 1), p * 8])))

    @T.macro
    def quantize_x(X, b, xe, xo, dxv, xs, part, inv):
        """x row b's int8 codes (xe: each chunk's even values, xo: its odd ones), each chunk's dx over
        its 4 lanes (dxv), and each group's float32 sum of x (xs), at row b's offsets."""
        for g in range(groups):
            xs[b * groups + g] = T.float32(0)
        for c in range(chunks):
            for i in T.vectorized(LANES):
                part[i] = T.max(T.fabs(X[b, 0, c * CHUNK + i]), T.fabs(X[b, 0, c * CHUNK + LANES + i]))
            fold16(part, 0, T.max)
            for i in T.vectorized(4):
                dxv[b * chunks * 4 + c * 4 + i] = part[0] / T.float32(127)
            inv[0] = T.Select(part[0] > T.float32(0), T.float32(1) / dxv[b * chunks * 4 + c * 4], T.float32(0))
            for i in T.vectorized(LANES):
                xe[b * k // 2 + c * LANES + i] = T.Cast("int8", T.nearbyint(X[b, 0, c * CHUNK + 2 * i] * inv[0]))
                xo[b * k // 2 + c * LANES + i] = T.Cast("int8",
                                                        T.nearbyint(X[b, 0, c * CHUNK + 2 * i + 1] * inv[0]))
            for i in T.vectorized(LANES):
                part[i] = X[b, 0, c * CHUNK + i] + X[b, 0, c * CHUNK + LANES + i]
            fold16(part, 0, add)
            xs[b * groups + c // per] = xs[b * groups + c // per] + part[0]

    @T.macro
    def finish(acc, base, S, M, row, xs, b):
        """acc[base] = the sum of acc[base : base + 8] and the zero values' term (x row b's group sums)."""
        for v in range(groups // 8):                    # 8 groups a vector
            for i in T.vectorized(8):
                acc[base + i] = acc[base + i] + zero_of(S, M, row, v * 8 + i) * xs[b * groups + v * 8 + i]
        for i in T.vectorized(4):
            acc[base + i] = acc[base + i] + acc[base + i + 4]
        acc[base] = (acc[base] + acc[base + 2]) + (acc[base + 1] + acc[base + 3])
        for g in range(groups // 8 * 8, groups):
            acc[base] = acc[base] + zero_of(S, M, row, g) * xs[b * groups + g]

    @T.macro
    def one_row(W, S, M, X, Y):
        xe = T.alloc_buffer((k // 2,), "int8")
        xo = T.alloc_buffer((k // 2,), "int8")
        dxv = T.alloc_buffer((chunks * 4,), "float32")
        xs = T.alloc_buffer((groups,), "float32")
        part = T.alloc_buffer((LANES,), "float32")
        inv = T.alloc_buffer((1,), "float32")
        quantize_x(X, 0, xe, xo, dxv, xs, part, inv)
        W32 = T.decl_buffer((n, words), "int32", data=W.data)
        xe32 = T.decl_buffer((words,), "int32", data=xe.data)
        xo32 = T.decl_buffer((words,), "int32", data=xo.data)
        for row in T.parallel(n):
            acc = T.alloc_buffer((16,), "float32")          # two chains of 8 lanes (alternate pairs)
            acc[T.ramp(0, 1, 16)] = T.Broadcast(T.float32(0), 16)
            for p in range(pairs):
                prefetch(W32, row, p)
                acc[T.ramp(p % 2 * 8, 1, 8)] = acc[T.ramp(p % 2 * 8, 1, 8)] + pair_sum(W32, S, xe32, xo32, dxv,
                                                                                       row, 0, p)
            for i in T.vectorized(8):
                acc[i] = acc[i] + acc[8 + i]
            finish(acc, 0, S, M, row, xs, 0)
            Y[0, 0, row] = acc[0]

    @T.macro
    def few_rows(W, S, M, X, Y):
        """Up to `batch` rows, `block` a pass over W: each pair's codes unpacked once for its rows, a
        row's sums on its own accumulator; rows past the call's: zero codes and dx (computed, not
        written)."""
        xe = T.alloc_buffer((batch * k // 2,), "int8")
        xo = T.alloc_buffer((batch * k // 2,), "int8")
        dxv = T.alloc_buffer((batch * chunks * 4,), "float32")
        xs = T.alloc_buffer((batch * groups,), "float32")
        part = T.alloc_buffer((LANES,), "float32")
        inv = T.alloc_buffer((1,), "float32")
        for b in range(batch):
            if T.Cast(rows_dtype, b) < rows:
                quantize_x(X, b, xe, xo, dxv, xs, part, inv)
            else:
                for i in T.vectorized(k // 2):
                    xe[b * k // 2 + i] = T.int8(0)
                    xo[b * k // 2 + i] = T.int8(0)
                for i in T.serial(chunks * 4):
                    dxv[b * chunks * 4 + i] = T.float32(0)
                for g in range(groups):
                    xs[b * groups + g] = T.float32(0)
        W32 = T.decl_buffer((n, words), "int32", data=W.data)
        xe32 = T.decl_buffer((batch * words,), "int32", data=xe.data)
        xo32 = T.decl_buffer((batch * words,), "int32", data=xo.data)
        for blk in range(batch // block):
            if T.Cast(rows_dtype, blk * block) < rows:
                for row in T.parallel(n):
                    acc = T.alloc_buffer((block * 8,), "float32")
                    acc[T.ramp(0, 1, block * 8)] = T.Broadcast(T.float32(0), block * 8)
                    # `pairs` iterations (rows >= 1) in a count LLVM cannot see (quant_gemv's few_rows:
                    # a known count let it hoist every pair's x out of the row loop, spilling them)
                    for p in range(T.min(T.Cast(rows_dtype, pairs), rows * pairs)):
                        prefetch(W32, row, p)
                        for b in T.unroll(block):
                            acc[T.ramp(b * 8, 1, 8)] = acc[T.ramp(b * 8, 1, 8)] + pair_sum(
                                W32, S, xe32, xo32, dxv, row, blk * block + b, p)
                    for b in T.unroll(block):
                        finish(acc, b * 8, S, M, row, xs, blk * block + b)
                        if T.Cast(rows_dtype, blk * block + b) < rows:
                            Y[blk * block + b, 0, row] = acc[b * 8]

    return planes_func(kind, n, k, group, 1 if batch == 1 else rows, scale_dtype,
                       one_row if batch == 1 else few_rows)


@tvm.transform.module_pass(opt_level=0, name="MarkInt8Decode")
def mark_int8_decode(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """The module's INT8_DECODE_ATTR (`kiln compile --decode-activations int8`) copied onto each of its
    PrimFuncs, where QuantMatmul reads it (schedule rules see a function, not its module)."""
    if not (mod.attrs and mod.attrs.get(INT8_DECODE_ATTR)):
        return mod
    funcs = {gv: f.with_attr(INT8_DECODE_ATTR, True) for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    for gv, func in funcs.items():
        mod[gv] = func
    return mod
