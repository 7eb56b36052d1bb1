"""Hand-written GEMVs for kiln's 4-, 8- and 16-bit weights in float32: decode on a CPU at 1, 2, 3-4
and 5-8 rows (sequences).

Why: QuantMatmul's scheduled GEMV decodes every weight to a float before its multiply-add: per 16
values a load and a permute of two words, a variable shift, a mask, a conversion, the scale's
multiply-add (and the min's), then the activation's; one accumulator chain, and a 16-lane sum
added one lane at a time after each row. On a znver4 that ran SmolLM2's 4-bit projections at
15-17 GB/s of planes on 2 cores, far from the 50 GB/s they read: bound by instructions, not bytes.
Its tiled matmul (2+ rows) dequantizes each weight tile into a buffer first: at 2-4 rows that is
most of its time.

One row: the arithmetic is regrouped, for the same values (weights exactly as stored, float32
throughout): a group's scale s and min m (q4: m = -8 s) are per group, so

    sum_k x_k (q_k s + m) = s * sum_k x_k q_k + m * sum_k x_k

and the row's sum is sum over 32-value chunks of s * (x . q), plus sum over groups of m * (the
group's sum of x), computed once per call. Per chunk of 32 values: one 16-byte load widened to 16
lanes (4-bit: low nibbles are the even values, high nibbles the odd ones, against the activations
deinterleaved once per call; 8-bit: two loads of 16 codes), a mask and a shift, two conversions,
two multiply-adds and the scale's: 8 vector instructions per 32 values where the scheduled GEMV
spends ~14. Two accumulators take alternate chunks; the lanes are summed by halving. Only 4-bit
codes read x through a copy (xp); 8- and 16-bit ones read x itself (down 38 against 41 us for f16,
27 against 30 for q8, the rest the same, in alternating runs).

2-4 rows (`batch` 2 or 4, the call's rows at run time, rows past them zeros): each chunk's codes are
decoded and scaled once (2 multiplies) and serve every row (2 multiply-adds a row), each row on its
own accumulator; the min's term as at one row. The chunk loop's count is hidden from LLVM (it
unrolled a known count and hoisted every chunk's activations out of the weight-row loop, spilling
them: down at 4 rows 67 against 57 us). 8 rows at once lost to the tiled matmul where x outgrows
L1 (down, K 1536: 155 against 129 us); 5-8 rows take two passes of 4 over the weights (`block`):
at 8 rows 1.17-1.46x the tiled matmul, at 6 1.0-1.25x; more rows keep it.

Measured (tools/bench_cpu_gemv.py: znver4, 2 cores, planes rotated through 256 MB, the kernels'
passes alternating, best of 10; the host's bandwidth drifts ~1.5x over minutes, so only figures on
one line compare). Against QuantMatmul's own GEMV (1 row) / tiled matmul (2+ rows), us:
    q4m gate/up (3072 x 576)  1 row 48 / 83, 2 rows 72 / 123, 4 rows 104 / 169
    q4m down (576 x 1536)     1 row 26 / 40, 2 rows 39 / 62, 4 rows 59 / 85
    q8: 1.05-1.17x at 1 row, 1.5-2.1x at 2-4; f16: 1.1-1.3x at 1 row (near the bytes' floor),
    2.0-2.4x at 2-4 rows (down at 4 rows 1.2x); the Q8_0 LM head (49152 x 576) 1.2x at 1 row, 1.7-2.0x
    at 2-4; 8 rows (tiled both) 1.0x.
Compiled for haswell (AVX2) on the same host, one row: 56 against 92-95 us, 30 against 44.
SmolLM2 Q4_1 decode (kiln bench, alternating artifacts, prompt 64, gen 64): 1 sequence 185-187 tok/s
(unchanged; 125 before the one-row kernel), 2 sequences 254-259 against 156-161, 4 sequences 350-354
against 231-236; 8 sequences (prompt 128) 334-335 against 292-294 with the two-pass kernel.
Sums are in another order than the matmul's (float32 rounding, not the weights, differs).

Every row loop asks for its weights prefetch.PREFETCH_BYTES (4 KB) ahead of the row it reads
(prefetch.py: LLVM's llvm.prefetch, a prefetch instruction on x86 and AArch64). A row loop's reads
move to a new 4 KB page every few rows, where the CPU's own prefetcher starts over, and on a Sapphire
Rapids Xeon (2 cores) it did not keep up: tools/bench_cpu_gemv.py q4m, 2 threads, without / with, us a call:
one row gate/up 76-78 / 55-56, down 43-44 / 28, the LM head 1097-1142 / 782-792 (27 GB/s of planes
of the 32 the host reads); 2 rows 189-197 / 65-68 (without it the kernel had fallen behind the tiled
matmul's 118), 4 rows 140-143 / 83-86, 8 rows 274-278 / 161-162 and the LM head 6233-6253 / 2448-2455.

Matched (``branches``, targets/dequant_match.py): a function exactly kiln's `dequantize` (q4, q4m, q8 or
q8m with float32 or float16 scales (and mins; a GGUF's Q4_0 / Q4_1 / Q8_0 / Q5_0 / Q5_1 keep their
float16 ones, TargetProfile.half_scales, widened as read) and any group a multiple of 32, either code
form, or 8-bit codes in groups of 16 (GGUF's Q6_K as stored, a Q4_K_M file's LM head and half its down
projections: each half of a chunk scaled on its own; tools/bench_cpu_gemv.py --formats q8 --group 16,
Sapphire Rapids, 2 threads: 1.5-1.8x the scheduled GEMV, which they took before); or f16 / bf16,
16-bit floats without scales, two multiply-adds a chunk) into an `NT_matmul` of
float32 activations with float32 sums, no cast after, over symbolic rows ([rows, 1, K], decode's, or
[1, rows, K], a prefill's: its logits are one row a sequence, and a chunk of 1-8 tokens; the kernels'
buffers declared over the same memory); K a multiple of 64. Anything
else: None (QuantMatmul schedules it). QuantMatmul branches on the call's rows (BATCHES). One row,
tools/compare_llamacpp.py --rounds 3: F16 GGUF SmolLM2 decode 111 tok/s = 0.99x llama.cpp (98, 0.87x,
before); Q4_1: 165 = 1.15x (122, 0.85x); Q5_1 (q8m): 113 = 0.98x (109, 0.84x).

The one-row kernel's macros also serve MoE decode (expert_gemv_body, for targets/cpu/expert_matmul.py):
each output's row is a map of the output (an expert's row through the router's choice) and its store a
macro (the fused router weight), so a decode step's experts read only their rows, at this kernel's speed
(64 experts of 1536 x 2048, top 8, one token: 1.6-1.7 ms against RowReduction's gathered 4.2-4.4).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from kiln.compiler.quant_modules import FLOAT_KINDS, QuantFormat

from ..kernel_memo import parsed_once
from ..dequant_match import match_dequant_matmul, param_order, placed
from ..row_dispatch import over_params
from .lanes import LANES, add, fold16
from .prefetch import prefetch_read, rows_ahead

CHUNK = 32                  # values a chunk: 16 bytes of 4-bit codes, 32 of 8-bit
CHAINS = 2                  # accumulators taking alternate chunks (one row)
BATCHES = (1, 2, 4, 8)      # rows the kernels take (QuantMatmul's branches: 1, 2, 3-4, 5-8; more: its tiled matmul)
BLOCK = 4                   # rows a pass over the weights serves (8 rows: two passes)
_MIN_KINDS = ("q4m", "q8m")
SCALE_DTYPES = ("float32", "float16")   # scale (and min) planes read: float16 is a GGUF's own (half the bytes)


def branches(func: tirx.PrimFunc, int8_isa: str | None = None) -> list[tuple[int, tirx.PrimFunc]] | None:
    """If these kernels compute ``func`` (targets/dequant_match.py finds its format and buffers; float32
    throughout, no cast after, symbolic rows, K a multiple of 64, groups of whole chunks): for each of
    BATCHES, ``func`` with a body computing up to that many rows by gemv_kernel (the kernel's buffers
    viewed as func's, row_dispatch.over_params), the branches for dispatch_on_rows. Else None.
    With `int8_isa` (int8_gemv.int8_isa's, for `--decode-activations int8`), the formats int8_gemv
    takes get int8_gemv_kernel's instead (x quantized to int8)."""
    m = match_dequant_matmul(func, "float32", rows_second=True)     # decode's [rows, 1, K], prefill's [1, rows, K]
    if m is None or m.k % (2 * CHUNK) or not takes_group(m.kind, m.group) or not m.out.same_as(m.sums):
        return None
    scale_dtypes = {p.dtype for p in m.planes[1:] if p is not None}
    if m.sums.dtype != "float32" or not scale_dtypes <= set(SCALE_DTYPES) or len(scale_dtypes) > 1:
        return None
    order = param_order(func, m)
    if not isinstance(m.rows, tirx.Var) or order is None:
        return None
    scale_dtype = scale_dtypes.pop() if scale_dtypes else "float32"
    group = m.group or CHUNK
    from . import int8_gemv         # (here: int8_gemv builds its PrimFuncs with planes_func)

    def kernel(batch: int) -> tirx.PrimFunc:
        if int8_isa is not None and int8_gemv.takes(m.kind, m.k, group):
            return int8_gemv.int8_gemv_kernel(m.kind, m.n, m.k, group, scale_dtype, int8_isa, batch,
                                              None if batch == 1 else m.rows)
        return gemv_kernel(m.kind, m.n, m.k, group, batch, None if batch == 1 else m.rows, scale_dtype)

    return [(batch, over_params(func, placed(kernel(batch), order),
                                name="one_row_gemv" if batch == 1 else f"gemv_{batch}_rows"))
            for batch in BATCHES]


def takes_group(kind: str, group: int) -> bool:
    """Whether the kernels take `kind` codes in groups of `group` (0: none): whole chunks, or for 8-bit
    codes groups of 16 (a chunk's halves; GGUF's Q6_K as stored), each half its own scale."""
    return group % CHUNK == 0 or (group == LANES and kind in ("q8", "q8m"))


def nibble_col(c, h, i):
    """The column lane i of chunk c's half h holds in the 4-bit order: the chunk's even values, then its
    odd ones (a byte's low nibble, then its high one)."""
    return c * CHUNK + 2 * i + h


def nibble_code(Wb, row, c, h: int, i):
    """Chunk c's half h's code in lane i (int32) from the codes' bytes Wb: byte i's low or high nibble."""
    byte = T.Cast("int32", Wb[row, c * (CHUNK // 2) + i])
    return byte & 15 if h == 0 else byte >> 4


def _same(_piece, o):
    return o


def part_of(po, parts, count):
    """The part of each_part's parallel index po (a single part's: 0, no division in its loop)."""
    return 0 if isinstance(parts, int) and parts == 1 else po // count


def out_of(po, parts, count):
    """The output (within its part) of each_part's parallel index po."""
    return po if isinstance(parts, int) and parts == 1 else po % count


def _macros(kind: str, n: int, k: int, group: int, batch: int, rows, scale_dtype: str):
    """(each_part, few_rows): the kernels' bodies as TVMScript macros over W's planes of n rows (module
    docstring); gemv_kernel's, and the expert GEMV's (expert_gemv_body)."""
    chunks, groups, per = k // CHUNK, k // group, max(1, group // CHUNK)
    halves = group < CHUNK                      # 8-bit codes in groups of 16: each half its own scale
    four_bit, scaled = kind in ("q4", "q4m"), kind not in FLOAT_KINDS
    has_min = scaled and kind != "q8"
    w_dtype = QuantFormat(kind, group).planes(n, k)["qweight"][1]
    byte_cols = k // 2 if four_bit else k
    byte_dtype = "uint8" if four_bit else w_dtype
    ahead = rows_ahead(byte_cols * (2 if kind in FLOAT_KINDS else 1))

    @T.macro
    def prefetch(Wb, row, c):
        """Chunk c's codes prefetch.PREFETCH_BYTES on (`ahead` rows: the loop's next rows) asked for now."""
        if ahead > 0:
            T.evaluate(prefetch_read(T.address_of(
                Wb[T.min(row + ahead, n - 1), c * (CHUNK // 2 if four_bit else CHUNK)])))

    acc_len = CHAINS * LANES
    block = min(batch, BLOCK)                   # rows one pass over the weights serves
    rows = 1 if batch == 1 else rows
    rows_dtype = "int32" if batch == 1 else str(rows.ty.dtype)

    def x_in(X, b, c, h, i):
        """Row b's activation lane i of chunk c's half h multiplies (4-bit: the even values, then the odd)."""
        return X[b, 0, nibble_col(c, h, i)] if four_bit else X[b, 0, c * CHUNK + h * LANES + i]

    def x_at(xp, X, b, c, h, i):
        """One row (each_part's part b): the activation lane i of chunk c's half h multiplies: 4-bit,
        from xp (x deinterleaved: each chunk's even values, then its odd ones); wider codes, x itself."""
        return xp[b * k + c * CHUNK + h * LANES + i] if four_bit else X[b, 0, c * CHUNK + h * LANES + i]

    def x_row(xp, X, b, c, h, i):
        """Up to `batch` rows: row b's, from xp (every format: rows past the call's are zeros there)."""
        return xp[b * k + c * CHUNK + h * LANES + i]

    @T.macro
    def group_sums(xs, part, base, at, xp, X, b):
        """xs[base + g] = group g's sum of row b of x (the min's factor), read through `at`."""
        for g in range(groups):
            if halves:
                for i in T.vectorized(LANES):
                    part[i] = at(xp, X, b, g // 2, g % 2, i)
            else:
                for i in T.vectorized(LANES):
                    part[i] = T.float32(0)
                for c in range(per):
                    for i in T.vectorized(LANES):
                        part[i] = part[i] + (at(xp, X, b, g * per + c, 0, i) + at(xp, X, b, g * per + c, 1, i))
            fold16(part, 0, add)
            xs[base + g] = part[0]

    def code(Wb, row, c, h, i):
        """The code lane i of chunk c's half h multiplies, as float32 (4-bit: byte i's low / high nibble)."""
        if four_bit:
            return T.Cast("float32", nibble_code(Wb, row, c, h, i))
        if kind == "bf16":                              # bfloat16's bits are float32's high half
            return T.reinterpret("float32", T.shift_left(T.Cast("uint32", Wb[row, c * CHUNK + h * LANES + i]),
                                                         T.uint32(16)))
        return T.Cast("float32", Wb[row, c * CHUNK + h * LANES + i])

    def scale(S, row, g):
        """Group g's scale (or min), as float32."""
        return S[row, g] if scale_dtype == "float32" else T.Cast("float32", S[row, g])

    def chunk_scale(S, row, c, h):
        """The scale chunk c's half h takes (its group's)."""
        return scale(S, row, c * 2 + h if halves else c // per)

    def group_min(S, M, row, g):
        """The value a zero code stands for: q4's -8 scale, q4m's and q8m's min."""
        return scale(S, row, g) * T.float32(-8) if kind == "q4" else scale(M, row, g)

    @T.macro
    def finish_row(acc, base, S, M, row, xs, xbase):
        """acc[base] = the sum of acc[base : base + 16] and the min's term (each group's zero value
        times its sum of x, xs[xbase + g]): whole vectors of groups before the fold, the rest after."""
        if has_min:
            for v in range(groups // LANES):
                for i in T.vectorized(LANES):
                    acc[base + i] = acc[base + i] + group_min(S, M, row, v * LANES + i) * xs[xbase + v * LANES + i]
        fold16(acc, base, add)
        if has_min:
            for g in range(groups // LANES * LANES, groups):
                acc[base] = acc[base] + group_min(S, M, row, g) * xs[xbase + g]

    @T.macro
    def output(W, S, M, X, Y, row, o, xp, xs, store, piece):
        """Output o of part `piece`: row `row` of W (an expression, not a bound variable: a let there cost
        the dense GEMV 20% of SmolLM2's decode) times the part's x (X's row `piece`; 4-bit codes, xp's)."""
        Wb = T.decl_buffer((n, byte_cols), byte_dtype, data=W.data)
        acc = T.alloc_buffer((acc_len,), "float32")
        for i in T.vectorized(acc_len):
            acc[i] = T.float32(0)
        for co in range(chunks // CHAINS):
            prefetch(Wb, row, co * CHAINS)
            for ch in T.unroll(CHAINS):
                for i in T.vectorized(LANES):
                    if scaled and halves:
                        acc[ch * LANES + i] = (
                            acc[ch * LANES + i]
                            + x_at(xp, X, piece, co * CHAINS + ch, 0, i) * code(Wb, row, co * CHAINS + ch, 0, i)
                            * chunk_scale(S, row, co * CHAINS + ch, 0)
                            + x_at(xp, X, piece, co * CHAINS + ch, 1, i) * code(Wb, row, co * CHAINS + ch, 1, i)
                            * chunk_scale(S, row, co * CHAINS + ch, 1))
                    elif scaled:
                        acc[ch * LANES + i] = acc[ch * LANES + i] + (
                            x_at(xp, X, piece, co * CHAINS + ch, 0, i) * code(Wb, row, co * CHAINS + ch, 0, i)
                            + x_at(xp, X, piece, co * CHAINS + ch, 1, i) * code(Wb, row, co * CHAINS + ch, 1, i)
                        ) * chunk_scale(S, row, co * CHAINS + ch, 0)
                    else:
                        acc[ch * LANES + i] = (
                            acc[ch * LANES + i]
                            + x_at(xp, X, piece, co * CHAINS + ch, 0, i) * code(Wb, row, co * CHAINS + ch, 0, i)
                            + x_at(xp, X, piece, co * CHAINS + ch, 1, i) * code(Wb, row, co * CHAINS + ch, 1, i))
        for i in T.vectorized(LANES):
            acc[i] = acc[i] + acc[LANES + i]
        finish_row(acc, 0, S, M, row, xs, piece * groups)
        store(Y, piece, o, acc[0])

    @T.macro
    def each_part(W, S, M, X, Y, parts, count, row_of, store):
        """`parts` parts (a count or a symbolic size) of `count` outputs in one parallel loop: part p's
        output o the row row_of(p, o) of W times part p's k values of X (its p-th k floats), handed to
        store(Y, p, o, value); each part's copy and group sums before the loop. One part: the GEMV."""
        xp = T.alloc_buffer((parts * k if four_bit else 1,), "float32")
        xs = T.alloc_buffer((parts * groups,), "float32")
        part = T.alloc_buffer((LANES,), "float32")
        Xs = T.decl_buffer((parts, 1, k), "float32", data=X.data)     # each part's x a row
        for p in range(parts):
            if four_bit:
                for c in range(chunks):
                    for h in range(2):
                        for i in T.vectorized(LANES):
                            xp[p * k + c * CHUNK + h * LANES + i] = x_in(Xs, p, c, h, i)
            if has_min:
                group_sums(xs, part, p * groups, x_at, xp, Xs, p)
        for po in T.parallel(parts * count):
            output(W, S, M, Xs, Y, row_of(part_of(po, parts, count), out_of(po, parts, count)),
                   out_of(po, parts, count), xp, xs, store, part_of(po, parts, count))

    @T.macro
    def few_rows(W, S, M, X, Y):
        """Up to `batch` rows: each chunk's codes decoded (and scaled) once for every row; a row's sums
        on its own accumulator; rows past the call's, zeros (computed, not written)."""
        xp = T.alloc_buffer((batch * k,), "float32")     # x's rows in the order the codes are read
        xs = T.alloc_buffer((batch * groups,), "float32")
        part = T.alloc_buffer((LANES,), "float32")
        Wb = T.decl_buffer((n, byte_cols), byte_dtype, data=W.data)
        for b in range(batch):
            for c in range(chunks):
                for h in range(2):
                    if T.Cast(rows_dtype, b) < rows:
                        for i in T.vectorized(LANES):
                            xp[b * k + c * CHUNK + h * LANES + i] = x_in(X, b, c, h, i)
                    else:
                        for i in T.vectorized(LANES):
                            xp[b * k + c * CHUNK + h * LANES + i] = T.float32(0)
            if has_min:
                group_sums(xs, part, b * groups, x_row, xp, X, b)
        for blk in range(batch // block):
            if T.Cast(rows_dtype, blk * block) < rows:
                for row in T.parallel(n):
                    acc = T.alloc_buffer((block * LANES,), "float32")
                    w = T.alloc_buffer((CHUNK,), "float32")
                    for i in T.vectorized(block * LANES):
                        acc[i] = T.float32(0)
                    # `chunks` iterations (rows >= 1) in a count LLVM cannot see: a known count let it
                    # unroll the loop and hoist every chunk's activations out of the row loop, spilling them.
                    for c in range(T.min(T.Cast(rows_dtype, chunks), rows * chunks)):
                        prefetch(Wb, row, c)
                        for i in T.vectorized(LANES):                    # (code's h: a Python int)
                            if scaled:
                                w[i] = code(Wb, row, c, 0, i) * chunk_scale(S, row, c, 0)
                                w[LANES + i] = code(Wb, row, c, 1, i) * chunk_scale(S, row, c, 1)
                            else:
                                w[i] = code(Wb, row, c, 0, i)
                                w[LANES + i] = code(Wb, row, c, 1, i)
                        for b in T.unroll(block):
                            for i in T.vectorized(LANES):
                                acc[b * LANES + i] = (acc[b * LANES + i] + x_row(xp, X, blk * block + b, c, 0, i) * w[i]
                                                      + x_row(xp, X, blk * block + b, c, 1, i) * w[LANES + i])
                    for b in T.unroll(block):
                        finish_row(acc, b * LANES, S, M, row, xs, (blk * block + b) * groups)
                        if T.Cast(rows_dtype, blk * block + b) < rows:
                            Y[blk * block + b, 0, row] = acc[b * LANES]

    return each_part, few_rows


def expert_gemv_body(kind: str, n: int, k: int, group: int, scale_dtype: str, planes, x, parts, count: int,
                     row_of, store) -> tirx.Stmt:
    """Dot products with rows of an n x k weight in kiln's `kind` planes (the caller's buffers: codes,
    scale, min; None where the format has none) by the one-row GEMV's arithmetic, in `parts` parts (a count or a
    symbolic size) of `count` outputs, part p's activations x's p-th k values (float32): output o of
    part p is row row_of(p, o) (int32) times them, handed to the macro store(x, p, o, value). For
    targets/cpu/expert_matmul.py: decode's tokens (a part each, or a part each expert of each where
    every expert reads its own input), each expert's rows read through the router's choice. The
    statements, over the caller's buffers (no params of their own)."""
    each_part, _ = _macros(kind, n, k, group, 1, None, scale_dtype)
    codes, scale, minimum = planes
    scale = codes if scale is None else scale
    minimum = scale if minimum is None else minimum

    @T.prim_func(private=True, check_well_formed=False)
    def kernel():
        each_part(codes, scale, minimum, x, x, parts, count, row_of, store)

    return kernel.body


@parsed_once(size="rows")
def gemv_kernel(kind: str, n: int, k: int, group: int, batch: int = 1, rows=None,
                scale_dtype: str = "float32") -> tirx.PrimFunc:
    """Y[:rows, 0, :n] = X[:rows, 0, :k] . W[n, k] for kiln's `kind` planes (group `group`, scales and
    mins in `scale_dtype`, widened as read), float32: batch 1, one row (rows None); else `rows` (a
    symbolic size, 2 to `batch` at run time)."""
    each_part, few_rows = _macros(kind, n, k, group, batch, rows, scale_dtype)
    rows = 1 if batch == 1 else rows

    @T.macro
    def store_row(Y, _piece, o, value):
        Y[0, 0, o] = value

    @T.macro
    def each_row(W, S, M, X, Y):
        each_part(W, S, M, X, Y, 1, n, _same, store_row)

    return planes_func(kind, n, k, group, rows, scale_dtype, each_row if batch == 1 else few_rows)


def planes_func(kind: str, n: int, k: int, group: int, rows, scale_dtype: str, body) -> tirx.PrimFunc:
    """The kernel's PrimFunc: `kind`'s planes (codes; scales and mins where the format has them), x
    [rows, 1, k] and y [rows, 1, n] (float32), its statements the macro body(codes, scale, min, x, y)
    (a plane the format lacks passed as another one)."""
    w_shape, w_dtype = QuantFormat(kind, group).planes(n, k)["qweight"]
    groups = k // group
    if kind in _MIN_KINDS:
        @T.prim_func(private=True)
        def with_min(codes: T.Buffer(w_shape, w_dtype), scales: T.Buffer((n, groups), scale_dtype),
                     mins: T.Buffer((n, groups), scale_dtype), x: T.Buffer((rows, 1, k), "float32"),
                     y: T.Buffer((rows, 1, n), "float32")):
            T.func_attr({"tirx.noalias": True})
            body(codes, scales, mins, x, y)
        return with_min

    if kind in FLOAT_KINDS:
        @T.prim_func(private=True)
        def unscaled(codes: T.Buffer(w_shape, w_dtype), x: T.Buffer((rows, 1, k), "float32"),
                     y: T.Buffer((rows, 1, n), "float32")):
            T.func_attr({"tirx.noalias": True})
            body(codes, codes, codes, x, y)
        return unscaled

    @T.prim_func(private=True)
    def without_min(codes: T.Buffer(w_shape, w_dtype), scales: T.Buffer((n, groups), scale_dtype),
                    x: T.Buffer((rows, 1, k), "float32"), y: T.Buffer((rows, 1, n), "float32")):
        T.func_attr({"tirx.noalias": True})
        body(codes, scales, scales, x, y)
    return without_min
