"""A 4-bit GEMV for a few rows that dequantizes two values per integer operation (CUDA).

Why: on an H100 (2026-11-26) the 8B's 4-bit GEMVs under dlight's GEMV schedule and its 8-bit LM
head ran at the same ~3e12 weight values a second, twice the bytes a value for the 8-bit one: the
kernels are capped by the SM's issue rate, not by memory. dlight's kernel spends ~8.1 SASS
instructions a value at one row (tools/sass_counts.py): a shift and a mask for each code, an
int-to-float conversion, the subtraction and the scale as half-precision pairs after repacking
them, a conversion of the weight and one of the activation to float32, the multiply-add; its 2-
and 4-row buckets dequantize again for every row.

Here the arithmetic is written for the packed layout (compiler/quant_modules.py: value k of a row
at bits 4 * (k % 8) of word k // 8): values j and j + 4 of a word sit 16 bits apart, so

    (word >> 4j) & 0x000F000F | 0x64006400      read as two float16 = 1024 + code, one pair

(1024 + c in float16 is exact, 0x6400 being 1024's bits with an empty 10-bit mantissa), minus 1032
and times the scale as float16 pairs: the same float16 value (c - 8) * scale the dequantize op
rounds to, bit for bit. Pairs 2i and 2i + 1 share one shift, word >> 8i: the odd pair is masked
where it sits (0x00F000F0), reads as 1024 + 16 c, and x / 16 - 72 (exact, one FMA) makes it c - 8;
on CUDA the mask and the OR are one PTX lop3 (float16_pair's asm), which nvcc would split in two. Then each weight to float32 and a float32 multiply-add per activation row,
as the matmul defines. Each warp takes `per_warp` weight rows, its lanes consecutive words
(coalesced 32-bit loads, as dlight's), so an activation's conversion serves `per_warp` rows and a
weight's dequantization every activation row; the lanes' sums meet in shuffles. Counted on the
cuda-sm90 build of the 8B's layers (SASS instructions a weight value): 5.25 at one row (dlight's
8.1), 8.5 for 2 rows, 12.6 for 4, 21.6 for 8; 4.5 at one row with the shared shift and the lop3.

Matched (Q4GEMV.apply): a function exactly `dequantize` (kiln's q4 in float16, group 32, either
code form) -> `NT_matmul` (float32 sums of float16 activations times the weights) -> optionally a
cast of the sums, over one row or symbolic rows; N a multiple of warps x per_warp, K of 256.
Anything else: None.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.backend.cuda.op import cuda_func_call
from tvm.script import tirx as T

from .dequant_match import match_dequant_matmul, param_order, placed
from .kernel_memo import parsed_once
from .row_dispatch import over_params, static_int

LANES = 32                      # a warp
WORD = 8                        # 4-bit values a packed word
PAIR_MASK, FLOAT16_1024 = 0x000F000F, 0x64006400

# Per code width (bits), for float16_pair: values a 32-bit word of codes, how far apart a pair's two
# values sit (j and j + apart: 16 bits apart in the word), the pair's mask, the bits that make the
# masked pair read as float16 1024 + (code + offset) (XOR: for q8 it also flips the int8 sign bit
# into offset 128; for q4 it only sets 0x6400's bits, disjoint from the code's), and 1024 + offset.
CODES = {4: {"per_word": 8, "apart": 4, "mask": PAIR_MASK, "magic": FLOAT16_1024, "minus": 1032},
         8: {"per_word": 4, "apart": 2, "mask": 0x00FF00FF, "magic": 0x64806480, "minus": 1152}}


# One LOP3 for a pair's mask and XOR, written as PTX: nvcc splits `(x & mask) ^ magic` into two
# whatever it is fed (both constants immediates).
AND_XOR = "kiln_and_xor"
AND_XOR_CUDA = r"""
__device__ __forceinline__ unsigned int kiln_and_xor(unsigned int a, unsigned int b, unsigned int c) {
  unsigned int d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
"""


def and_xor(x, mask, magic: int, asm: bool = False):
    """(x & mask) ^ magic (mask: an int or a uint32 expression); asm: one PTX lop3 (CUDA kernels only)."""
    mask = T.uint32(mask) if isinstance(mask, int) else mask
    if asm:
        return cuda_func_call(AND_XOR, x, mask, T.uint32(magic), source_code=AND_XOR_CUDA, return_type="uint32")
    return T.bitwise_xor(T.bitwise_and(x, mask), T.uint32(magic))


def float16_pair(word, j, scale, bits: int = 4, asm: bool = False):
    """Values j and j + apart of a 32-bit word of `bits`-bit codes (q4: kiln's packed word; q8: four
    int8) times their group's float16 `scale`: the float16 pair the dequantize op rounds to, bit for
    bit (1024 + (code + offset) and its subtraction are exact in float16; one rounding, the scale's).
    q4 pairs 2i and 2i + 1 share one shift (word >> 8i): the odd pair's codes are masked where they
    sit, 4 bits up, and read as 1024 + 16 code, which x / 16 - 72 makes code - 8 (exact, one FMA).
    asm: the mask and XOR as one PTX lop3 (CUDA kernels)."""
    code = CODES[bits]
    shift, up = (8 * (j // 2), j % 2) if bits == 4 else (bits * j, 0)     # ints, or expressions of a loop's j
    shifted = word if isinstance(shift, int) and shift == 0 else T.shift_right(word, T.Cast("uint32", shift))
    # Where j is a loop's (unrolled), its selects fold once TVM unrolls the loop.
    pick = (lambda odd, even: odd if up else even) if isinstance(up, int) else (
        lambda odd, even: T.Select(up == 1, odd, even))
    mask = pick(T.uint32(code["mask"] << 4), T.uint32(code["mask"]))
    pair = T.reinterpret("float16x2", and_xor(shifted, mask, code["magic"], asm))
    up_minus = 64 + code["minus"] - 1024                    # (1024 + 16 code) / 16 - up_minus = code - 8
    pair = pick(pair * T.Broadcast(T.float16(1 / 16), 2) - T.Broadcast(T.float16(up_minus), 2),
                pair - T.Broadcast(T.float16(code["minus"]), 2))
    return pair * T.Broadcast(scale, 2)


@parsed_once(size="count")
def q4_gemv(n: int, k: int, out_dtype: str, per_warp: int = 2, warps: int = 4, threads: bool = True,
            batch: int = 1, count=None) -> tirx.PrimFunc:
    """out[b, 0, :n] = (x[b, 0, :k] . dequantized W[n, k]) for b < count (at most `batch`; count
    None: 1, static) over kiln's q4 float16 planes (W words [n, k/8], scales [n, k/32]).
    `per_warp`: weight rows a warp computes. `threads`: bound to CUDA blocks, threads and shuffles;
    False: the same arithmetic in serial loops (for a CPU to check it)."""
    words_per_row, groups = k // WORD, k // 32
    steps, blocks = words_per_row // LANES, n // (warps * per_warp)
    warps_total = blocks * warps
    rows = T.int64(1) if count is None else count            # the activations' (and outputs') rows

    @T.macro
    def lane_sums(acc, xf, wf, W, S, X, warp, lane):
        for i in T.unroll(per_warp * batch):
            acc[i] = T.float32(0)
        for step in T.unroll(steps):            # every load issued ahead, as dlight does
            word = step * LANES + lane
            for b in T.unroll(batch):
                if T.Cast("int64", b) < rows:
                    for i in T.vectorized(WORD):
                        xf[b * WORD + i] = T.Cast("float32", X[b, 0, word * WORD + i])
                else:                           # (unrolled: TVM's CUDA code for a float32x8 zero does not compile)
                    for i in T.unroll(WORD):
                        xf[b * WORD + i] = T.float32(0)
            for r in T.unroll(per_warp):
                row = warp * per_warp + r
                for j in T.unroll(4):
                    wf[T.Ramp(0, 1, 2)] = T.Cast("float32x2", float16_pair(W[row, word], j, S[row, word // 4], asm=threads))
                    for b in T.unroll(batch):
                        acc[r * batch + b] = (acc[r * batch + b] + xf[b * WORD + j] * wf[0]
                                              + xf[b * WORD + j + 4] * wf[1])

    if threads:
        @T.prim_func(private=True)
        def kernel(W: T.Buffer((T.int64(n), T.int64(words_per_row)), "uint32"),
                   S: T.Buffer((T.int64(n), T.int64(groups)), "float16"),
                   X: T.Buffer((rows, T.int64(1), T.int64(k)), "float16"),
                   Y: T.Buffer((rows, T.int64(1), T.int64(n)), out_dtype)):
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            for bx in T.thread_binding(blocks, thread="blockIdx.x"):
                for ty in T.thread_binding(warps, thread="threadIdx.y"):
                    for tx in T.thread_binding(LANES, thread="threadIdx.x"):
                        acc = T.alloc_buffer((per_warp * batch,), "float32", scope="local")
                        xf = T.alloc_buffer((batch * WORD,), "float32", scope="local")
                        wf = T.alloc_buffer((2,), "float32", scope="local")
                        lane_sums(acc, xf, wf, W, S, X, bx * warps + ty, tx)
                        for r, b in T.grid(per_warp, batch):
                            for o in T.unroll(5):                   # offsets 16, 8, 4, 2, 1
                                acc[r * batch + b] = acc[r * batch + b] + T.tvm_warp_shuffle_down(
                                    T.tvm_warp_activemask(), acc[r * batch + b], T.shift_right(LANES // 2, o),
                                    LANES, LANES)
                            if tx == 0 and T.Cast("int64", b) < rows:
                                Y[b, 0, (bx * warps + ty) * per_warp + r] = T.Cast(out_dtype, acc[r * batch + b])
        return kernel

    @T.prim_func(private=True)
    def serial(W: T.Buffer((T.int64(n), T.int64(words_per_row)), "uint32"),
               S: T.Buffer((T.int64(n), T.int64(groups)), "float16"),
               X: T.Buffer((rows, T.int64(1), T.int64(k)), "float16"),
               Y: T.Buffer((rows, T.int64(1), T.int64(n)), out_dtype)):
        T.func_attr({"tirx.noalias": True})
        partial = T.alloc_buffer((warps_total, LANES, per_warp * batch), "float32")
        for warp, lane in T.grid(warps_total, LANES):
            acc = T.alloc_buffer((per_warp * batch,), "float32")
            xf = T.alloc_buffer((batch * WORD,), "float32")
            wf = T.alloc_buffer((2,), "float32")
            lane_sums(acc, xf, wf, W, S, X, warp, lane)
            for i in T.serial(per_warp * batch):
                partial[warp, lane, i] = acc[i]
        for warp, r, b in T.grid(warps_total, per_warp, batch):
            total = T.alloc_buffer((1,), "float32")
            total[0] = T.float32(0)
            for lane in T.serial(LANES):
                total[0] = total[0] + partial[warp, lane, r * batch + b]
            if T.Cast("int64", b) < rows:
                Y[b, 0, warp * per_warp + r] = T.Cast(out_dtype, total[0])
    return serial


class Q4GEMV:
    """q4_gemv for a matched 4-bit dequantize-matmul on CUDA; None for anything else (the next rule
    decides). `batch` 1: a OneRowGEMV rule (targets/gpu.py; the function's rows bound to 1), giving
    a Schedule of the kernel with its params in the function's order. `batch` > 1: a
    LOW_BATCH_BRANCHES rule for up to `batch` rows, giving the kernel as a body over the function's
    own params (its rows symbolic; rows past the call's count are neither read nor written)."""

    def __init__(self, per_warp: int = 2, warps: int = 4, batch: int = 1) -> None:
        self.per_warp, self.warps, self.batch = per_warp, warps, batch

    def apply(self, func, target, _tunable):
        def build(n, k, out_dtype, count):
            if n % (self.per_warp * self.warps) or k % (LANES * WORD):
                return None
            return q4_gemv(n, k, out_dtype, self.per_warp, self.warps, batch=self.batch, count=count)
        return apply_matched(func, target, self.batch, build)


def apply_matched(func, target, batch: int, build, kind: str = "q4", epilogues=()):
    """What a quantized GEMV rule gives: None unless `func` is kiln's `kind` (q4 or q8) dequantize-
    matmul in float16, group 32, float32 sums (targets/dequant_match.py) on CUDA over the rows `batch`
    asks for (1: one static row; more: symbolic rows); else build(n, k, out_dtype, count) (count None
    for the static row; it may decline with None) with its params placed as func has them: a Schedule
    for one row (OneRowGEMV), a body over func's own params otherwise (row_dispatch over_params).
    `epilogues`: the dequant_match EPILOGUES the kernel computes; build then also takes epilogue= (the
    matched one, or None; out_dtype is then both the cast sums' and the output's: float16)."""
    if not isinstance(func, tirx.PrimFunc) or target.kind.name != "cuda":
        return None
    m = match_dequant_matmul(func, "float16", kinds=(kind,), epilogues=epilogues)
    one = gemv_rows(m, batch)
    order = param_order(func, m) if one is not None else None     # W, S, X, Y: where func has them
    if order is None:
        return None
    extra = {"epilogue": m.epilogue} if epilogues else {}
    return placed_kernel(func, build(m.n, m.k, str(m.out.dtype), None if one else m.rows, **extra), order, one)


def gemv_rows(m, batch: int) -> bool | None:
    """None unless the match `m` is what the GEMVs take (group 32, float16 scales, float32 sums; an
    epilogue over float16 cast sums) over the rows `batch` asks for; else whether that is one static row."""
    if m is None or m.group != 32 or m.planes[1].dtype != "float16" or m.sums.dtype != "float32":
        return None
    if m.epilogue is not None and m.out.dtype != "float16":
        return None                                     # the epilogue's inputs: float16 cast sums
    one = static_int(m.rows) == 1
    return one if (one or isinstance(m.rows, tirx.Var)) and one == (batch == 1) else None


def placed_kernel(func, kernel, order: list[int], one: bool):
    """`kernel` (or None: declined) with its params where `order` says func has them: a Schedule for one
    static row, else a body over func's own params (row_dispatch over_params)."""
    if kernel is None:
        return None
    return s_tir.Schedule(placed(kernel, order)) if one else over_params(func, placed(kernel, order))


__all__ = ["Q4GEMV", "apply_matched", "gemv_rows", "placed_kernel", "q4_gemv"]
