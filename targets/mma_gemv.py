"""A 4- and 8-bit GEMV for 1-16 rows on the tensor cores' m16n8k16 MMA (CUDA), dequantized in registers.

Why: q4_gemv.py's kernel issues 5.25 SASS instructions a weight value at one row (dlight's GEMV
8.1), 12.6 at 4 rows and 21.6 at 8, where an H100 reading 4-bit weights at its bandwidth leaves
room for ~5: those kernels are capped by the SM's issue rate, the more so the more rows. Here the
products and sums for up to 8 activation rows are one `mma.sync.m16n8k16` (float16 in, float32
sums) a 16 x 16 block of weights, so one row costs what eight do (and 9-16 rows a second MMA over
the same weight registers: `groups`); what is left a value is the dequantization, two values an
integer operation: in a 32-bit word of codes (compiler/quant_modules.py: q4, value k of a row at
bits 4 * (k % 8) of word k // 8; q8, one int8 a byte), values j and j + P (P = 4 for q4, 2 for q8)
sit 16 bits apart, so

    q4: (word >> 4j) & 0x000F000F | 0x64006400   read as float16 x 2 = 1024 + code
    q8: (word >> 8j) & 0x00FF00FF ^ 0x64806480   read as float16 x 2 = 1024 + 128 + code

(the XOR flips the int8's sign bit into 128 + code and sets 0x6400's bits, disjoint from the byte),
minus 1032 (q4) or 1152 (q8) and times the group's scale: the float16 weight the dequantize op
rounds to, bit for bit (q4_gemv.float16_pair: q4's odd pairs masked 4 bits up without a shift, the
mask and the OR or XOR one PTX lop3).

Layout: a warp takes 16 weight rows (the MMA's M) and lane (g, t) = (lane // 4, lane % 4) loads
rows g and g + 8 of them, the values 32t..32t+31 of each 128-value chunk of K: one scale group a
row (one 128-bit load for q4, two for q8). The MMA's K positions need not be the weight's: any
order that the A (weights) and B (activations) fragments share gives the same sums. Step s of the
8 a chunk takes the lane's pairs 2s and 2s + 1 as the A registers of K positions 2t, 2t + 1 and
2t + 8, 2t + 9, for both rows; the B registers of the same K positions, on lane (g, t), are
activation row g's values at those same weight positions (its 32 values of the chunk, loaded as 4
vectors; row 8 + g for the second MMA). Rows past the call's count are zeros in B (never read) and
not written. The warps of a block split K between them and add their sums in shared memory, in
order.

Matched (MMAGEMV.apply) as q4_gemv.py matches (kiln's q4 or q8 float16 dequantize -> NT_matmul ->
optionally a cast), over one row or symbolic rows; N a multiple of 16, K of 128 (kernel_shape).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .kernel_memo import parsed_once
from .dependent_launch import supports
from .dequant_match import EPILOGUES
from .norm_prologue import apply_norm_matched, has_norm
from .q4_gemv import CODES, LANES, apply_matched, float16_pair

TILE = 16                       # weight rows a warp computes (the MMA's M)
COLS = 8                        # activation rows an MMA takes (its N)
CHUNK = 128                     # weight values of a row a warp's lanes load at a time (4 lanes x 4 words x 8)
STEPS = CHUNK // 16             # MMA steps a chunk (K 16 each)
MAX_ROWS = 2 * COLS             # two MMAs a step at most: activation rows 0-7 and 8-15


def norm_fits(k: int, warps: int, split: tuple[int, int]) -> bool:
    """Whether a block of `warps` warps can play the add + RMSNorm kernel's `split` (threads, vector
    lanes) over a row of k: its threads whole warps, a power of two of them, a multiple of the block's,
    and k whole vectors of each."""
    virtual, lanes_n = split
    return (virtual % (warps * LANES) == 0 and k % (virtual * lanes_n) == 0
            and (virtual // LANES) & (virtual // LANES - 1) == 0)


@parsed_once(size="count")
def mma_gemv(n: int, k: int, out_dtype: str, bits: int = 4, warps: int = 4, unroll: int = 2,
             threads: bool = True, count=None, groups: int = 1, pdl: bool = False, ahead: int = 0,
             loads_first: bool = False, pipeline: bool = False, epilogue: str | None = None,
             norm: float | None = None, norm_rows: int = 1, norm_split: tuple[int, int] = (256, 4)) -> tirx.PrimFunc:
    """out[b, 0, :n] = (x[b, 0, :k] . dequantized W[n, k]) for b < count (at most COLS x groups;
    None: 1, static) over kiln's float16-scaled planes of `bits` (4: q4, W words [n, k/8]; 8: q8,
    W int8 [n, k]; scales [n, k/32]). `warps` split K; `unroll`: chunks a warp loads before it
    computes them; `groups`: MMAs a step, 8 activation rows each, over the same A registers.
    `threads`: the CUDA kernel; False: the same fragments in serial loops and the MMA computed from
    its documented register layout (for a CPU to check both). `pdl` (sm_90+): the kernel loads its
    first weights, then waits for the kernel before it (griddepcontrol.wait) and lets the next one
    launch, so that under programmatic dependent launch its weights stream while the kernel before
    it finishes (targets/dependent_launch.py, which tags the function that launch: without it the
    wait is a no-op). `ahead`: each lane asks L2 for the weights and scales it will load `ahead`
    iterations later (prefetch.global.L2: no register, nothing waits on it; iterations 1 to `ahead`
    before the first loads, and before a `pdl` kernel waits), so that a warp's loads are in flight
    beyond the ones nvcc keeps in registers: the shipped kernel's SASS issues its first loads, then
    alternates one load with its MMAs (2026-11-28, sm_90), one chunk in flight a warp.
    `loads_first`: a block-scope fence (__threadfence_block) between an iteration's loads and its
    MMAs, which nvcc and ptxas do not move loads across: every load of the iteration is issued
    before the warp waits for the first (in the SASS: its 12 128-bit loads, then MEMBAR, then its
    16 MMAs), at more registers a thread. A `pdl` kernel's wait does the same in its way.
    `pipeline` (where K takes 2 iterations or more): the iterations unrolled and the weights in two
    register sets, an iteration's MMAs after the loads of the next iteration's weights, so that a
    warp has a set in flight while it computes the other (its activations still loaded the
    iteration they are used: they come from L1/L2); with `loads_first` the fence then sits after
    those loads and the activations'. Not with `pdl` or `ahead`. In the cuda-sm90 SASS of the 8B's
    projections (2026-12-04): iterations 0 and 1's weights loaded before the first MMA, iteration
    it + 2's among iteration it's MMAs, at 90-100 registers a thread (72 without).
    `epilogue` (a targets/dequant_match.py EPILOGUES name, "silu_glu"): the weight's rows are gate
    (the first n / 2) and up (the rest) of n / 2 outputs, Y [rows, 1, n / 2]; tile j's MMA rows 0-7
    are gate rows 8j..8j+7 and rows 8-15 the up rows of the same outputs, so after the block's sums
    lane (g, t) holds both of output 8j + g and writes the epilogue of their out_dtype values: what
    the matched function computes from its cast sums, bit for bit (the same sums, the same order).
    `norm` (the epsilon of an add + RMSNorm before the matmul, compiler/passes/fuse_norm_matmul.py):
    the activations are rms_norm(X + R) by the weight WN, computed by each block once as its prologue
    into shared memory (at most `norm_rows` rows: norm_rows x k float16); the sum X + R is also
    written to YR (by block 0). The values are the fused add + RMSNorm kernel's bit for bit
    (targets/gpu.py AddRMSNorm): `norm_split` is that kernel's (threads, vector lanes) for a row
    (add_rms_norm.gpu_row_split), and the block's threads play its threads (each as many as it takes)
    in its order: each sums the squares of its values in order, each warp's sums meet as TVM's
    allreduce adds them (shuffles down 16, 8, 4, 2, 1 into lane 0), then the warps' in a tree (the
    same shuffles over the warps' sums), and each value is rsqrt(ss / k + eps) * f32(y) * f32(w)
    rounded to float16."""
    if pipeline and (pdl or ahead):
        raise ValueError("mma_gemv's pipeline takes neither pdl nor ahead")
    threads_n = warps * LANES                                  # the block's threads
    virtual, lanes_n = norm_split                              # the norm kernel's threads and vector
    if norm is not None and (pdl or ahead or not norm_fits(k, warps, norm_split) or norm_rows > MAX_ROWS):
        raise ValueError(f"mma_gemv's norm takes no pdl or ahead, {virtual} threads a multiple of the block's "
                         f"{threads_n} and a power of two warps, and k a multiple of {virtual * lanes_n}")
    plays = virtual // threads_n                               # the norm kernel's threads a thread plays
    rounds = k // (virtual * lanes_n)                          # each one's vectors of a row
    norm_warps = virtual // LANES
    iters = k // (CHUNK * warps * unroll)
    pipelined = pipeline and iters > 1
    slots = 2 * unroll if pipelined else unroll               # weight register sets of `unroll` chunks

    def weight_slot(it, u):
        """The register slot of chunk u of iteration it's weights (the two sets alternate under `pipeline`)."""
        return it % 2 * unroll + u if pipelined else u
    tiles = n // TILE
    rows = T.int64(1) if count is None else count            # the activations' (and outputs') rows
    code = CODES[bits]
    per_word, apart = code["per_word"], code["apart"]
    words = 32 // per_word                                   # a lane's words of a row a chunk
    pairs = per_word // 2                                    # pairs a word
    w_shape, w_dtype = ((T.int64(n), T.int64(k // 8)), "uint32") if bits == 4 else ((T.int64(n), T.int64(k)), "int8")
    combine = EPILOGUES[epilogue] if epilogue is not None else None
    outs = n // 2 if combine is not None else n               # Y's last dim

    def row_a(tile, g):
        """The weight row of MMA row g (0-7) of a tile; with an epilogue a gate row."""
        return tile * COLS + g if combine is not None else tile * TILE + g

    def row_b(tile, g):
        """The weight row of MMA row g + 8 of a tile; with an epilogue the up row of row_a's output."""
        return n // 2 + tile * COLS + g if combine is not None else tile * TILE + g + 8

    @T.macro
    def load_weights(wa, wb, sa, sb, W, S, tile, chunk, g, t, u):
        """Chunk `chunk` of lane (g, t) into slot u of its registers: rows g and g + 8 of the tile's
        weights and their scales."""
        if bits == 4:
            for i in T.vectorized(4):
                wa[u * 4 + i] = W[row_a(tile, g), chunk * 16 + t * 4 + i]
            for i in T.vectorized(4):
                wb[u * 4 + i] = W[row_b(tile, g), chunk * 16 + t * 4 + i]
        else:                                               # 32 int8 as 8 words, two 128-bit loads
            for h in T.unroll(2):
                wa[T.Ramp(u * 8 + h * 4, 1, 4)] = T.reinterpret(
                    "uint32x4", W[row_a(tile, g), T.Ramp(chunk * CHUNK + t * 32 + h * 16, 1, 16)])
                wb[T.Ramp(u * 8 + h * 4, 1, 4)] = T.reinterpret(
                    "uint32x4", W[row_b(tile, g), T.Ramp(chunk * CHUNK + t * 32 + h * 16, 1, 16)])
        sa[u] = S[row_a(tile, g), chunk * 4 + t]
        sb[u] = S[row_b(tile, g), chunk * 4 + t]

    @T.macro
    def prefetch_weights(W, S, tile, chunk, g, t):
        """Chunk `chunk`'s weights and scales of lane (g, t), asked of L2 (its `load_weights` addresses)."""
        if bits == 4:
            T.evaluate(T.ptx.prefetch.global_.L2(T.address_of(W[row_a(tile, g), chunk * 16 + t * 4])))
            T.evaluate(T.ptx.prefetch.global_.L2(T.address_of(W[row_b(tile, g), chunk * 16 + t * 4])))
        else:
            for h in T.unroll(2):
                T.evaluate(T.ptx.prefetch.global_.L2(T.address_of(W[row_a(tile, g), chunk * CHUNK + t * 32 + h * 16])))
                T.evaluate(T.ptx.prefetch.global_.L2(T.address_of(W[row_b(tile, g), chunk * CHUNK + t * 32 + h * 16])))
        T.evaluate(T.ptx.prefetch.global_.L2(T.address_of(S[row_a(tile, g), chunk * 4 + t])))
        T.evaluate(T.ptx.prefetch.global_.L2(T.address_of(S[row_b(tile, g), chunk * 4 + t])))

    @T.macro
    def load_activations(xs, X, chunk, g, t, u):
        """Of each group's activation rows (row 8c + g), the 32 values of chunk `chunk` at the K
        positions of lane (g, t)'s weights, into slot u."""
        for c in T.unroll(groups):
            if T.Cast("int64", c * COLS + g) < rows:
                for v in T.unroll(4):
                    for i in T.vectorized(8):
                        xs[(u * groups + c) * 32 + v * 8 + i] = X[c * COLS + g, 0, chunk * CHUNK + t * 32 + v * 8 + i]
            else:
                for i in T.unroll(32):
                    xs[(u * groups + c) * 32 + i] = T.float16(0)

    @T.macro
    def fragments(a, b, wa, wb, sa, sb, xs, w, u, s):
        """The A (8 float16) and each group's B (4 float16) registers of MMA step s of a chunk whose
        weights are in slot w and activations in slot u."""
        # pairs 2s and 2s + 1 of the lane's: word (2s) // pairs, pair (2s) % pairs (and the next)
        a[T.Ramp(0, 1, 2)] = float16_pair(wa[w * words + 2 * s // pairs], 2 * s % pairs, sa[w], bits, threads)    # row g,   K 2t, 2t+1
        a[T.Ramp(2, 1, 2)] = float16_pair(wb[w * words + 2 * s // pairs], 2 * s % pairs, sb[w], bits, threads)    # row g+8, K 2t, 2t+1
        a[T.Ramp(4, 1, 2)] = float16_pair(wa[w * words + (2 * s + 1) // pairs], (2 * s + 1) % pairs, sa[w], bits, threads)
        a[T.Ramp(6, 1, 2)] = float16_pair(wb[w * words + (2 * s + 1) // pairs], (2 * s + 1) % pairs, sb[w], bits, threads)
        for c in T.unroll(groups):                          # the activations at the same K positions
            first = (u * groups + c) * 32 + per_word * (2 * s // pairs) + 2 * s % pairs
            second = (u * groups + c) * 32 + per_word * ((2 * s + 1) // pairs) + (2 * s + 1) % pairs
            b[c * 4 + 0] = xs[first]
            b[c * 4 + 1] = xs[first + apart]
            b[c * 4 + 2] = xs[second]
            b[c * 4 + 3] = xs[second + apart]

    @T.macro
    def mmas(acc, a, b, wa, wb, sa, sb, xs, it):
        """Iteration it's MMAs on the tensor cores (after the `loads_first` fence): every step of its
        chunks, each group's activation rows."""
        if loads_first:
            T.evaluate(T.call_extern("void", "__threadfence_block"))
        for u in T.unroll(unroll):
            for s in T.unroll(STEPS):
                fragments(a, b, wa, wb, sa, sb, xs, weight_slot(it, u), u, s)
                for c in T.unroll(groups):
                    T.evaluate(T.ptx_legacy.mma("m16n8k16", "row", "col", "fp16", "fp16", "fp32", a.data, 0,
                                                b.data, c * 4, acc.data, c * 4, False, dtype="float32"))

    @T.macro
    def store(Y, total, tile, lane, c, e):
        """Element e of a lane's group-c MMA sums: weight row g + 8 (e // 2), activation row
        8c + 2t + e % 2."""
        if T.Cast("int64", c * COLS + 2 * (lane % 4) + e % 2) < rows:
            Y[c * COLS + 2 * (lane % 4) + e % 2, 0, tile * TILE + lane // 4 + 8 * (e // 2)] = T.Cast(out_dtype, total)

    @T.macro
    def reduce_store(Y, red, total, tile, lane, c):
        """A lane's group-c sums added over the block's warps in order, then stored: each of them, or
        with the epilogue each activation row's gate and up sums (elements e and e + 2) as one output."""
        for e in T.unroll(4):
            total[e] = red[0, lane, c * 4 + e]
            for w in T.unroll(1, warps):
                total[e] = total[e] + red[w, lane, c * 4 + e]
        if combine is None:
            for e in T.unroll(4):
                store(Y, total[e], tile, lane, c, e)
        else:
            for e in T.unroll(2):
                if T.Cast("int64", c * COLS + 2 * (lane % 4) + e) < rows:
                    Y[c * COLS + 2 * (lane % 4) + e, 0, tile * COLS + lane // 4] = combine(
                        T.Cast(out_dtype, total[e]), T.Cast(out_dtype, total[e + 2]))

    def value(thread, m, j):
        """The first value in a row of vector j of the norm kernel's thread thread + m * threads_n (the
        m-th a thread plays): it takes vectors j * virtual + its index, in turn."""
        return (j * virtual + m * threads_n + thread) * lanes_n

    @T.macro
    def sum_of(yv, X, R, r, thread, m, j):
        """y = X + R at that vector, into yv (each time it is needed: fewer registers than keeping it)."""
        for i in T.vectorized(lanes_n):
            yv[i] = X[r, 0, value(thread, m, j) + i] + R[r, 0, value(thread, m, j) + i]

    @T.macro
    def norm_sums(yv, ssq, X, R, YR, bx, thread, base):
        """Thread `thread`'s share of the norm prologue's first half: for each norm-kernel thread it
        plays, the float32 squares of y = X + R at that thread's values of each row summed in its order
        to ssq[(base * norm_rows + r) * plays + m] (and y written to YR by block 0)."""
        for r in T.unroll(norm_rows):
            for m in T.unroll(plays):
                ssq[(base * norm_rows + r) * plays + m] = T.float32(0)
                if T.Cast("int64", r) < rows:
                    for j in T.unroll(rounds):
                        sum_of(yv, X, R, r, thread, m, j)
                        if bx == 0:
                            for i in T.vectorized(lanes_n):
                                YR[r, 0, value(thread, m, j) + i] = yv[i]
                        for i in T.unroll(lanes_n):
                            ssq[(base * norm_rows + r) * plays + m] = ssq[(base * norm_rows + r) * plays + m] + T.Cast(
                                "float32", yv[i]) * T.Cast("float32", yv[i])

    @T.macro
    def norm_scale(stage, yv, part, tree, inv, wv, X, R, WN, thread):
        """The second half, once each norm warp's sum is in part[warp, row]: the warps' sums added as a
        tree (halves: warp i and i + h for i < h), then the thread's values of each row (y again),
        rsqrt(ss / k + eps) * y * w in float32 rounded to float16, into the staged rows."""
        for r in T.unroll(norm_rows):
            if T.Cast("int64", r) < rows:
                for w in T.unroll(norm_warps):
                    tree[w] = part[w, r]
                for h in T.unroll(norm_warps.bit_length() - 1):      # halves of norm_warps >> (h + 1)
                    for w in T.unroll(max(norm_warps // 2, 1)):
                        if w < T.shift_right(norm_warps, h + 1):
                            tree[w] = tree[w] + tree[w + T.shift_right(norm_warps, h + 1)]
                inv[0] = T.rsqrt(tree[0] / T.float32(k) + T.float32(norm))
                for m in T.unroll(plays):
                    for j in T.unroll(rounds):
                        sum_of(yv, X, R, r, thread, m, j)
                        for i in T.vectorized(lanes_n):
                            wv[i] = WN[value(thread, m, j) + i]
                        for i in T.unroll(lanes_n):
                            stage[r, 0, value(thread, m, j) + i] = T.Cast(
                                "float16", inv[0] * T.Cast("float32", yv[i]) * T.Cast("float32", wv[i]))

    @T.macro
    def load_inputs(xs, X, stage, chunk, g, t, u):
        """load_activations from X, or with `norm` from the block's normalised rows."""
        if norm is None:
            load_activations(xs, X, chunk, g, t, u)
        else:
            load_activations(xs, stage, chunk, g, t, u)

    stage_shape = (norm_rows, 1, k) if norm is not None else (1, 1, 1)     # the normalised rows (norm)
    part_shape = (norm_warps, norm_rows) if norm is not None else (1, 1)    # each norm warp's sums

    @T.macro
    def block(W, S, X, Y, R, WN, YR):
        """The CUDA kernel's body: a block of `warps` warps a 16-row tile (with `norm`, its prologue first)."""
        for bx in T.thread_binding(tiles, thread="blockIdx.x"):
            red = T.alloc_buffer((warps, LANES, groups * 4), "float32", scope="shared")
            stage = T.alloc_buffer(stage_shape, "float16", scope="shared")
            part = T.alloc_buffer(part_shape, "float32", scope="shared")
            for ty in T.thread_binding(warps, thread="threadIdx.y"):
                for tx in T.thread_binding(LANES, thread="threadIdx.x"):
                    acc = T.alloc_buffer((groups * 4,), "float32", scope="local")
                    a = T.alloc_buffer((8,), "float16", scope="local")
                    b = T.alloc_buffer((groups * 4,), "float16", scope="local")
                    wa = T.alloc_buffer((slots * words,), "uint32", scope="local")
                    wb = T.alloc_buffer((slots * words,), "uint32", scope="local")
                    sa = T.alloc_buffer((slots,), "float16", scope="local")
                    sb = T.alloc_buffer((slots,), "float16", scope="local")
                    xs = T.alloc_buffer((unroll * groups * 32,), "float16", scope="local")
                    total = T.alloc_buffer((4,), "float32", scope="local")
                    if norm is not None:
                        # iteration 0's weights first: they stream from memory while the prologue runs
                        for u in T.unroll(unroll):
                            load_weights(wa, wb, sa, sb, W, S, bx, u * warps + ty, tx // 4, tx % 4, u)
                        ssq = T.alloc_buffer((norm_rows * plays,), "float32", scope="local")
                        yv = T.alloc_buffer((lanes_n,), "float16", scope="local")
                        tree = T.alloc_buffer((norm_warps,), "float32", scope="local")
                        inv = T.alloc_buffer((1,), "float32", scope="local")
                        wv = T.alloc_buffer((lanes_n,), "float16", scope="local")
                        norm_sums(yv, ssq, X, R, YR, bx, ty * LANES + tx, 0)
                        for i in T.unroll(norm_rows * plays):           # each warp's sums into lane 0,
                            for o in T.unroll(5):                       # as TVM's allreduce: 16, 8, 4, 2, 1 down
                                ssq[i] = ssq[i] + T.tvm_warp_shuffle_down(
                                    T.tvm_warp_activemask(), ssq[i], T.shift_right(LANES // 2, o), LANES, LANES)
                            if tx == 0:                                 # (i = r * plays + m)
                                part[i % plays * warps + ty, i // plays] = ssq[i]
                        T.tvm_storage_sync("shared")
                        norm_scale(stage, yv, part, tree, inv, wv, X, R, WN, ty * LANES + tx)
                        T.tvm_storage_sync("shared")
                    for e in T.unroll(groups * 4):
                        acc[e] = T.float32(0)
                    if pipelined:                                # set 0: iteration 0's weights
                        if norm is None:
                            for u in T.unroll(unroll):
                                load_weights(wa, wb, sa, sb, W, S, bx, u * warps + ty, tx // 4, tx % 4, u)
                        for it in T.unroll(iters):
                            if it + 1 < iters:                   # the next iteration's, to the other set
                                for u in T.unroll(unroll):
                                    load_weights(wa, wb, sa, sb, W, S, bx, ((it + 1) * unroll + u) * warps + ty,
                                                 tx // 4, tx % 4, weight_slot(it + 1, u))
                            for u in T.unroll(unroll):
                                load_inputs(xs, X, stage, (it * unroll + u) * warps + ty, tx // 4, tx % 4, u)
                            mmas(acc, a, b, wa, wb, sa, sb, xs, it)
                    else:
                        if ahead > 0 and iters > 1:                  # iterations 1..ahead to L2
                            for j, u in T.grid(min(ahead, iters - 1), unroll):
                                prefetch_weights(W, S, bx, ((j + 1) * unroll + u) * warps + ty, tx // 4, tx % 4)
                        for it in T.serial(iters):
                            if ahead > 0 and ahead + 1 < iters:          # iteration it + ahead to L2
                                if it > 0 and it + ahead < iters:
                                    for u in T.unroll(unroll):
                                        prefetch_weights(W, S, bx, ((it + ahead) * unroll + u) * warps + ty,
                                                         tx // 4, tx % 4)
                            for u in T.unroll(unroll):              # every load of the slots first
                                if norm is None or it > 0:              # (with the norm: 0's went first)
                                    load_weights(wa, wb, sa, sb, W, S, bx, (it * unroll + u) * warps + ty,
                                                 tx // 4, tx % 4, u)
                                if not pdl:
                                    load_inputs(xs, X, stage, (it * unroll + u) * warps + ty, tx // 4, tx % 4, u)
                            if pdl:
                                if it == 0:     # the first weights are on their way: now the inputs
                                    T.evaluate(T.ptx.griddepcontrol.wait())
                                    T.evaluate(T.ptx.griddepcontrol.launch_dependents())
                                for u in T.unroll(unroll):
                                    load_activations(xs, X, (it * unroll + u) * warps + ty, tx // 4, tx % 4, u)
                            mmas(acc, a, b, wa, wb, sa, sb, xs, it)
                    for e in T.unroll(groups * 4):
                        red[ty, tx, e] = acc[e]
                    T.tvm_storage_sync("shared")
                    if ty == 0:
                        for c in T.unroll(groups):
                            reduce_store(Y, red, total, bx, tx, c)

    @T.macro
    def mma_emulated(red, frag_a, frag_b, ty):
        """Every lane's MMA sums of one step, from the fragments the lanes built, into red[ty]."""
        # mma.m16n8k16 (PTX ISA, "matrix fragments"): A[m, q] on lane 4 (m % 8) + (q % 8) // 2,
        # register element 4 (q // 8) + 2 (m // 8) + q % 2; B[q, c] on lane 4c + (q % 8) // 2,
        # element 2 (q // 8) + q % 2; D[m, c] on lane 4 (m % 8) + c // 2, element 2 (m // 8) + c % 2.
        for lane, c, e in T.grid(LANES, groups, 4):
            for q in T.serial(16):
                red[ty, lane, c * 4 + e] = red[ty, lane, c * 4 + e] + T.Cast("float32", frag_a[
                    4 * (lane // 4) + (q % 8) // 2, 4 * (q // 8) + 2 * (e // 2) + q % 2]) * T.Cast(
                    "float32", frag_b[4 * (2 * (lane % 4) + e % 2) + (q % 8) // 2, c * 4 + 2 * (q // 8) + q % 2])

    @T.macro
    def lane_fragments(frag_a, frag_b, wa, wb, sa, sb, X, stage, chunk, lane, w, u, s):
        """Lane `lane`'s fragments of step s (weights in slot w, activations of `chunk` into slot u)."""
        a = T.alloc_buffer((8,), "float16")
        b = T.alloc_buffer((groups * 4,), "float16")
        xs = T.alloc_buffer((unroll * groups * 32,), "float16")
        load_inputs(xs, X, stage, chunk, lane // 4, lane % 4, u)
        fragments(a, b, wa, wb, sa, sb, xs, w, u, s)
        for e in T.serial(8):
            frag_a[lane, e] = a[e]
        for e in T.serial(groups * 4):
            frag_b[lane, e] = b[e]

    @T.macro
    def norm_emulated(stage, X, R, WN, YR, bx):
        """The norm prologue of block bx as its threads compute it: each thread's sums, each warp's
        shuffles down (lane l adds lane l + d's value, its own where l + d is past the warp), lane 0's
        to part, the tree and the scale."""
        ssq = T.alloc_buffer((threads_n * norm_rows * plays,), "float32")
        other = T.alloc_buffer((threads_n * norm_rows * plays,), "float32")
        part = T.alloc_buffer(part_shape, "float32")
        yv = T.alloc_buffer((lanes_n,), "float16")
        tree = T.alloc_buffer((norm_warps,), "float32")
        inv = T.alloc_buffer((1,), "float32")
        wv = T.alloc_buffer((lanes_n,), "float16")
        for thread in T.serial(threads_n):
            norm_sums(yv, ssq, X, R, YR, bx, thread, thread)
        for o in T.serial(5):
            for i in T.serial(threads_n * norm_rows * plays):
                other[i] = ssq[i]
            for w, lane, i in T.grid(warps, LANES, norm_rows * plays):
                down = T.if_then_else(lane + T.shift_right(LANES // 2, o) < LANES,
                                      lane + T.shift_right(LANES // 2, o), lane)
                ssq[(w * LANES + lane) * norm_rows * plays + i] = (other[(w * LANES + lane) * norm_rows * plays + i]
                                                                   + other[(w * LANES + down) * norm_rows * plays + i])
        for w, r, m in T.grid(warps, norm_rows, plays):
            part[m * warps + w, r] = ssq[((w * LANES) * norm_rows + r) * plays + m]
        for thread in T.serial(threads_n):
            norm_scale(stage, yv, part, tree, inv, wv, X, R, WN, thread)

    lead = 1 if pipelined else 0        # iterations the serial form loads weights ahead of their MMAs

    @T.macro
    def serial_body(W, S, X, Y, R, WN, YR):
        red = T.alloc_buffer((warps, LANES, groups * 4), "float32")
        frag_a = T.alloc_buffer((LANES, 8), "float16")
        frag_b = T.alloc_buffer((LANES, groups * 4), "float16")
        stage = T.alloc_buffer(stage_shape, "float16")
        # each lane's weight registers (lane L's slot w at L * slots + w); with `pipeline` kept across
        # iterations, loaded and read in the kernel's order: the next iteration's set before this one's MMAs
        wa = T.alloc_buffer((LANES * slots * words,), "uint32")
        wb = T.alloc_buffer((LANES * slots * words,), "uint32")
        sa = T.alloc_buffer((LANES * slots,), "float16")
        sb = T.alloc_buffer((LANES * slots,), "float16")
        for bx in T.serial(tiles):
            if norm is not None:
                norm_emulated(stage, X, R, WN, YR, bx)
            for ty in T.serial(warps):
                for lane, e in T.grid(LANES, groups * 4):
                    red[ty, lane, e] = T.float32(0)
                if pipelined:                               # iteration 0's weights before the loop
                    for lane, u in T.grid(LANES, unroll):
                        load_weights(wa, wb, sa, sb, W, S, bx, u * warps + ty, lane // 4, lane % 4,
                                     lane * slots + weight_slot(0, u))
                for it in T.serial(iters):
                    # the weights loaded now: this iteration's, or under `pipeline` the next one's
                    if it + lead < iters:
                        for lane, u in T.grid(LANES, unroll):
                            load_weights(wa, wb, sa, sb, W, S, bx, ((it + lead) * unroll + u) * warps + ty,
                                         lane // 4, lane % 4, lane * slots + weight_slot(it + lead, u))
                    for u, s in T.grid(unroll, STEPS):
                        for lane in T.serial(LANES):
                            lane_fragments(frag_a, frag_b, wa, wb, sa, sb, X, stage, (it * unroll + u) * warps + ty,
                                           lane, lane * slots + weight_slot(it, u), u, s)
                        mma_emulated(red, frag_a, frag_b, ty)
            for lane, c in T.grid(LANES, groups):
                total = T.alloc_buffer((4,), "float32")
                reduce_store(Y, red, total, bx, lane, c)

    # The CUDA kernel or its serial form, over the kernel's params (with `norm`: its three more).
    body = block if threads else serial_body
    attrs = {"tirx.noalias": True, "tirx.is_scheduled": True} if threads else {"tirx.noalias": True}
    x_shape, y_shape, k_shape = (rows, T.int64(1), T.int64(k)), (rows, T.int64(1), T.int64(outs)), (T.int64(k),)
    if norm is None:
        @T.prim_func(private=True)
        def kernel(W: T.Buffer(w_shape, w_dtype),
                   S: T.Buffer((T.int64(n), T.int64(k // 32)), "float16"),
                   X: T.Buffer(x_shape, "float16"),
                   Y: T.Buffer(y_shape, out_dtype)):
            T.func_attr(attrs)
            body(W, S, X, Y, None, None, None)
        return kernel

    @T.prim_func(private=True)
    def kernel_norm(W: T.Buffer(w_shape, w_dtype),
                    S: T.Buffer((T.int64(n), T.int64(k // 32)), "float16"),
                    X: T.Buffer(x_shape, "float16"),
                    Y: T.Buffer(y_shape, out_dtype),
                    R: T.Buffer(x_shape, "float16"),
                    WN: T.Buffer(k_shape, "float16"),
                    YR: T.Buffer(x_shape, "float16")):
        T.func_attr(attrs)
        body(W, S, X, Y, R, WN, YR)
    return kernel_norm


# Warps a block (K split between them): enough in all that each SM has ~16 warps' loads in flight
# (an H100's 132 SMs, 16 x 32 lanes x 64 bytes ~ 32 KB an SM); for 4096-row projections that is 8 a
# block of 16 rows, for wider ones 4.
WARPS_IN_ALL = 2048


def kernel_shape(n: int, k: int, unroll: int = 2, most_warps: int = 8) -> tuple[int, int] | None:
    """(warps, unroll) for an n x k weight, or None where K is not a multiple of 128 (a chunk):
    `most_warps` a block where 4 would leave fewer than WARPS_IN_ALL in all; `unroll` chunks a load
    where K divides, else 2, else 1."""
    want = most_warps if n // TILE * 4 < WARPS_IN_ALL else 4
    return next(((w, u) for w in (want, 4, 2, 1) if w <= want for u in dict.fromkeys((unroll, 2, 1)) if u <= unroll
                 if n % TILE == 0 and k % (CHUNK * w * u) == 0), None)


class MMAGEMV:
    """mma_gemv for a matched `bits` (4: q4, 8: q8) float16-scaled dequantize-matmul on CUDA; None
    for anything else (the next rule decides). `batch` 1: a OneRowGEMV rule (the function's rows
    bound to 1), giving a Schedule of the kernel with its params in the function's order; `batch`
    2-16: a LOW_BATCH_BRANCHES rule for up to `batch` rows (symbolic; two MMAs a step above 8),
    giving the kernel as a body over the function's own params. `pdl`: mma_gemv's, where the target
    has griddepcontrol (sm_90+); `ahead`, `loads_first`, `pipeline`: mma_gemv's. A function whose
    cast sums feed an EPILOGUES entry (the gate-up projection's, under a `glu_epilogue` profile) gets
    the kernel computing it; one whose activations are an add + RMSNorm's (a `norm_prologue` profile's),
    at 1-4 rows, the kernel computing that first (targets/norm_prologue.py)."""

    takes_epilogues = True          # computes EPILOGUES (targets/glu_epilogue.py asks)
    takes_norms = True              # computes an add + RMSNorm before it (targets/norm_prologue.py)

    def __init__(self, bits: int = 4, unroll: int = 2, batch: int = 1, most_warps: int = 8,
                 pdl: bool = False, ahead: int = 0, loads_first: bool = False,
                 pipeline: bool = False) -> None:
        if bits not in CODES:
            raise ValueError(f"MMAGEMV takes {' or '.join(map(str, CODES))}-bit codes, not {bits}")
        if not 1 <= batch <= MAX_ROWS:
            raise ValueError(f"MMAGEMV takes 1 to {MAX_ROWS} rows (the MMA's columns, twice), not {batch}")
        if most_warps not in (4, 8, 16):
            raise ValueError(f"MMAGEMV splits K between 4, 8 or 16 warps a block at most, not {most_warps}")
        self.bits, self.unroll, self.batch, self.most_warps, self.pdl = bits, unroll, batch, most_warps, pdl
        self.ahead, self.loads_first, self.pipeline = ahead, loads_first, pipeline

    def apply(self, func, target, _tunable):
        def build(n, k, out_dtype, count, epilogue=None, norm=None, norm_rows=1, norm_split=(256, 4)):
            shape = kernel_shape(n, k, self.unroll, self.most_warps)
            # (kernel_shape asks n % 16: whole tiles, with an epilogue too.) No norm where 8-bit weights
            # meet a thread playing two of the norm kernel's: in the 8B's LM head (4 warps a block) it
            # held 96 registers a thread where 72 fit 7 blocks an SM (cuda-sm90 SASS, 2026-12-04); the
            # final norm stays a kernel of its own there.
            if shape is None or (norm is not None and (self.ahead or not norm_fits(k, shape[0], norm_split) or (
                    self.bits == 8 and shape[0] * LANES < norm_split[0]))):
                return None
            return mma_gemv(n, k, out_dtype, self.bits, *shape, count=count, groups=-(-self.batch // COLS),
                            pdl=self.pdl and supports(target) and norm is None, ahead=self.ahead,
                            loads_first=self.loads_first, pipeline=self.pipeline, epilogue=epilogue, norm=norm,
                            norm_rows=norm_rows, norm_split=norm_split)
        if has_norm(func):
            return apply_norm_matched(func, target, self.batch, build, kind=f"q{self.bits}")
        return apply_matched(func, target, self.batch, build, kind=f"q{self.bits}", epilogues=tuple(EPILOGUES))


__all__ = ["MMAGEMV", "mma_gemv"]
