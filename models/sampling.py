"""sample_tokens: the sampler's plain rows drawn where the logits are (runtime/sampler.py's rules).

batch_decode's logits [batch, 1, vocab] and five numbers per row (temperature, top_k, top_p,
min_p, u) -> one token per row [batch] int32, so a decode step copies back the tokens instead of
batch x vocab floats (50 MB a step for 256 of SmolLM2's rows) and the host sorts nothing.

Each row follows Sampler.sample for a row with no bias, mask, penalty or logprobs:

    temperature 0 or top_k 1    the first index of the row's maximum (np.argmax)
    otherwise                   x = logits / temperature; keep x >= thr, where thr is the largest of
                                  top_k:  the k-th largest x (ties at it kept)
                                  top_p:  the largest value v whose tokens x >= v hold top_p of the
                                          (top-k) mass of exp(x - max)
                                  min_p:  max(x) + log(min_p)
                                then the inverse CDF of the kept exp(x - max), in vocabulary order, at
                                u x their sum: the first token whose running sum exceeds it.

No sort: a threshold is the largest v with F(v) >= target for a non-increasing F (count or mass of
x >= v), found by searching the float's order-preserving 32-bit key, so it lands exactly on a logit:
each pass over the row counts 7 pivots at once, cutting the key range 8 ways (12 passes instead of
bisection's 32), only for rows that ask for top-k or top-p. Sums are float32 in another order than
numpy's, so a draw can differ from the host's where u falls within rounding of a boundary between
two tokens; the thresholds are exact values of the row.

One work-group per row on GPUs (LANES threads, WIDE_LANES where the target allows that many: each
pass over a 128,256-logit row is 501 dependent-latency loads a lane at 256 lanes, one SM's work while
the rest idle at batch 1; reductions in shared memory); on CPUs one row per
parallel iteration (_cpu_kernel: x / temperature and the weights computed once per row, the passes
in vectors; SmolLM2's 49,152 logits on a znver4, a row: temperature alone 0.21 ms against 0.40 for
the GPU variant's lanes run in turn, top-p 0.31 against 2.43, top-k + top-p 0.42 against 2.22).
Tested against the host Sampler on the CPU variant, and the GPU variant on OpenCL (pocl) and WebGPU
(wgpu on lavapipe).
"""

from __future__ import annotations

import functools

import numpy as np
from tvm.script import tirx as T

LANES = 256                      # threads per row on a GPU (WebGPU's and Metal's work-group limit)
WIDE_LANES = 1024                # where the target's work-groups take that many (CUDA)
SEGMENTS = 8                     # a threshold search splits its key range 8 ways per pass over the row
ROUNDS = 13                      # passes of a search: 12 narrow 2**32 keys to one at 8 segments (W -> W/8 + 7)


def _key_of(f: float) -> int:
    """The kernel's key of a float32, computed here (OpenCL cannot reinterpret a constant)."""
    b = int(np.array(f, np.float32).view(np.int32))
    return b ^ 0x7FFFFFFF if b < 0 else b


def lanes_for(max_num_threads: int | None) -> int:
    """Threads per row for a GPU target whose work-groups take at most `max_num_threads`."""
    return WIDE_LANES if (max_num_threads or 0) >= WIDE_LANES else LANES


@functools.cache
def sample_kernel(vocab: int, gpu: bool, lanes: int = LANES):
    """The PrimFunc (logits [batch, 1, vocab] f32, params [batch, 5] f32, out [batch] i32), `lanes`
    threads per row on a GPU (a power of two, 8 or more). Cached: parsing the TVMScript takes
    ~0.5 s, once per process and shape rather than once per compile."""
    if gpu and (lanes < 8 or lanes & (lanes - 1)):
        raise ValueError(f"sample_kernel: {lanes} lanes; give a power of two of at least 8")
    lanes = lanes if gpu else 1
    per_lane = -(-vocab // lanes)                     # tokens per lane: strided in the passes, contiguous in the draw
    steps = lanes.bit_length() - 1
    span = min(8, lanes)                              # per-pivot sums: lanes added per group
    groups = lanes // span
    scope = "shared" if gpu else "local"
    lowest = -3.4028234663852886e38
    lowest_key = _key_of(lowest)

    def lane(n):
        return T.thread_binding(n, thread="threadIdx.x") if gpu else T.serial(n)

    def rows(n):
        return T.thread_binding(n, thread="blockIdx.x") if gpu else T.parallel(n)

    @T.macro
    def sync():
        if gpu:
            T.tvm_storage_sync("shared")

    @T.macro
    def tree(red, combine):
        """red[0] = combine over red[0:lanes], every lane waiting for the result."""
        sync()
        for k in T.unroll(steps):
            for tx in lane(lanes):
                if tx < (lanes >> (k + 1)):
                    red[tx] = combine(red[tx], red[tx + (lanes >> (k + 1))])
            sync()

    @T.macro
    def sum_rows(red, red2, red3, acc):
        """red3[j] = the sum over red[j, 0:lanes], for every pivot j: lanes sum groups of `span`
        into red2, then one lane per pivot sums the groups (a tree per pivot would put several
        shared accesses under one `if`, where TVM cannot place the barriers it wants)."""
        sync()
        for tx in lane(max(lanes, (SEGMENTS - 1) * groups)):         # on a CPU (one lane): a loop
            if tx < (SEGMENTS - 1) * groups:
                acc[0] = T.float32(0)
                for e in range(span):
                    acc[0] = acc[0] + red[tx // groups + 1, tx % groups * span + e]
                red2[tx // groups + 1, tx % groups] = acc[0]
        sync()
        for tx in lane(max(lanes, SEGMENTS - 1)):
            if tx < SEGMENTS - 1:
                acc[0] = T.float32(0)
                for q in range(groups):
                    acc[0] = acc[0] + red2[tx + 1, q]
                red3[tx + 1] = acc[0]
        sync()

    @T.macro
    def split(bs, pv):
        """Pivots splitting the keys (lo, hi) into SEGMENTS parts (steps of at least 1; in uint32,
        where hi - lo cannot overflow, and pivots past hi never wrap: hi <= key(max) + 1)."""
        pv[0] = bs[0]
        pv[SEGMENTS] = bs[1]
        for j in range(1, SEGMENTS):
            pv[j] = T.Cast("int32", T.Cast("uint32", bs[0]) + T.max(
                (T.Cast("uint32", bs[1]) - T.Cast("uint32", bs[0])) // T.uint32(SEGMENTS), T.uint32(1)) * T.uint32(j))

    @T.macro
    def narrow(bs, pv):
        """(lo, hi) = (pv[c], pv[c + 1]) for the last pivot c that still meets the target (0: none)."""
        for j in range(SEGMENTS):          # not pv[bs[2]]: a data-dependent index crashes LLVM's AMDGPU backend
            if j == bs[2]:
                bs[0] = pv[j]
                bs[1] = T.min(pv[j + 1], pv[SEGMENTS])

    def key(f):
        """A float32's 32-bit key: orders as the float does (negative floats flipped)."""
        b = T.reinterpret("int32", f)
        return T.if_then_else(b < 0, T.bitwise_xor(b, 0x7FFFFFFF), b)

    def unkey(k):
        return T.reinterpret("float32", T.if_then_else(k < 0, T.bitwise_xor(k, 0x7FFFFFFF), k))

    def add(a, b):
        return a + b

    @T.macro
    def search(x, row, temperature, st, bs, pv, acc_f, kx, wx, red_p, red_g, red_s, target, weighted):
        """Narrow the keys (bs[0], bs[1]) to the largest key v whose tokens x / temperature >= v
        number (weighted: hold the mass exp(x / temperature - st[0])) at least target; every lane
        ends with the same bounds."""
        for rnd in range(ROUNDS):  # noqa: B007 (a round of the search)
            if bs[0] < bs[1] - 1:
                split(bs, pv)
                for tx in lane(lanes):
                    for j in range(SEGMENTS):
                        acc_f[j] = T.float32(0)
                    for i in range(per_lane):
                        if i * lanes + tx < vocab:
                            kx[0] = key(x[row, 0, i * lanes + tx] / temperature)
                            if kx[0] >= pv[1]:
                                if weighted:
                                    wx[0] = T.exp(x[row, 0, i * lanes + tx] / temperature - st[0])
                                else:
                                    wx[0] = T.float32(1)
                                for j in range(1, SEGMENTS):
                                    if kx[0] >= pv[j]:
                                        acc_f[j] = acc_f[j] + wx[0]
                    for j in range(1, SEGMENTS):
                        red_p[j, tx] = acc_f[j]
                sum_rows(red_p, red_g, red_s, wx)
                bs[2] = 0
                for j in range(1, SEGMENTS):
                    st[5] = red_s[j]
                    if st[5] >= target:
                        bs[2] = j
                narrow(bs, pv)
                sync()

    if not gpu:
        return _cpu_kernel(vocab, key, unkey, split, narrow)

    @T.prim_func(private=True, s_tir=True)
    def sample_tokens(var_logits: T.handle, var_params: T.handle, var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        batch = T.int32()
        logits = T.match_buffer(var_logits, (batch, 1, vocab), "float32")
        params = T.match_buffer(var_params, (batch, 5), "float32")
        out = T.match_buffer(var_out, (batch,), "int32")
        for row in rows(batch):
            with T.sblock("sample"):
                red_f = T.sblock_alloc_buffer((lanes,), "float32", scope=scope)
                red_i = T.sblock_alloc_buffer((lanes,), "int32", scope=scope)
                part_f = T.sblock_alloc_buffer((1,), "float32", scope="local")
                part_i = T.sblock_alloc_buffer((1,), "int32", scope="local")
                # row state, the same in every lane: 0 max(x), 1 threshold, 2 top-k threshold, 3 target,
                # 4 the row's raw maximum, 5 a reduction's result (shared memory is read into
                # locals before any branch tests it: TVM's barrier placement wants no shared
                # loads in conditions)
                st = T.sblock_alloc_buffer((6,), "float32", scope="local")
                # search bounds (keys): 0 lo, 1 hi, 2 the segment picked, 3 a reduction's result
                bs = T.sblock_alloc_buffer((4,), "int32", scope="local")
                pv = T.sblock_alloc_buffer((SEGMENTS + 1,), "int32", scope="local")      # lo, pivots, hi
                # per pivot: this lane's count or mass of x >= pivot (counts in float32: exact below 2**24)
                acc_f = T.sblock_alloc_buffer((SEGMENTS,), "float32", scope="local")
                red_p = T.sblock_alloc_buffer((SEGMENTS, lanes), "float32", scope=scope)
                red_g = T.sblock_alloc_buffer((SEGMENTS, groups), "float32", scope=scope)
                red_s = T.sblock_alloc_buffer((SEGMENTS,), "float32", scope=scope)
                kx = T.sblock_alloc_buffer((1,), "int32", scope="local")
                wx = T.sblock_alloc_buffer((1,), "float32", scope="local")
                temperature: T.let[T.float32] = params[row, 0]
                top_k: T.let[T.int32] = T.Cast("int32", params[row, 1])
                top_p: T.let[T.float32] = params[row, 2]
                min_p: T.let[T.float32] = params[row, 3]
                u: T.let[T.float32] = params[row, 4]

                # the row's maximum
                for tx in lane(lanes):
                    part_f[0] = T.float32(lowest)
                    for i in range(per_lane):
                        if i * lanes + tx < vocab:
                            part_f[0] = T.max(part_f[0], logits[row, 0, i * lanes + tx])
                    red_f[tx] = part_f[0]
                tree(red_f, T.max)
                st[4] = red_f[0]
                sync()
                if temperature == T.float32(0) or top_k == 1:
                    # greedy: the first index holding the maximum
                    for tx in lane(lanes):
                        part_i[0] = vocab
                        for i in range(per_lane):
                            if i * lanes + tx < vocab:
                                if logits[row, 0, i * lanes + tx] == st[4]:
                                    part_i[0] = T.min(part_i[0], i * lanes + tx)
                        red_i[tx] = part_i[0]
                    tree(red_i, T.min)
                    for tx in lane(lanes):
                        if tx == 0:
                            out[row] = T.min(red_i[0], vocab - 1)
                else:
                    st[0] = st[4] / temperature                # max(x / t) == max(x) / t for t > 0
                    st[1] = T.float32(lowest)
                    if min_p > T.float32(0):
                        st[1] = st[0] + T.log(min_p)
                    st[2] = T.float32(lowest)
                    if top_k > 0 and top_k < vocab:
                        # the largest v with count(x >= v) >= top_k: the k-th largest x
                        bs[0] = lowest_key
                        bs[1] = key(st[0]) + 1
                        search(logits, row, temperature, st, bs, pv, acc_f, kx, wx, red_p, red_g, red_s,
                               T.Cast("float32", top_k), False)
                        st[2] = unkey(bs[0])
                        st[1] = T.max(st[1], st[2])
                    if top_p < T.float32(1):
                        # target: top_p of the mass top-k keeps (all of it without top-k)
                        for tx in lane(lanes):
                            part_f[0] = T.float32(0)
                            for i in range(per_lane):
                                if i * lanes + tx < vocab:
                                    if logits[row, 0, i * lanes + tx] / temperature >= st[2]:
                                        part_f[0] = part_f[0] + T.exp(logits[row, 0, i * lanes + tx] / temperature
                                                                      - st[0])
                            red_f[tx] = part_f[0]
                        tree(red_f, add)
                        st[3] = top_p * red_f[0]
                        sync()
                        # the largest v whose tokens x >= v hold the target mass
                        bs[0] = key(st[2])
                        bs[1] = key(st[0]) + 1
                        search(logits, row, temperature, st, bs, pv, acc_f, kx, wx, red_p, red_g, red_s, st[3], True)
                        st[1] = T.max(st[1], unkey(bs[0]))
                    # the draw: each lane's contiguous chunk sum and its last token of positive weight
                    for tx in lane(lanes):
                        part_f[0] = T.float32(0)
                        part_i[0] = -1
                        for i in range(per_lane):
                            if tx * per_lane + i < vocab:
                                if logits[row, 0, tx * per_lane + i] / temperature >= st[1]:
                                    if T.exp(logits[row, 0, tx * per_lane + i] / temperature - st[0]) > T.float32(0):
                                        part_f[0] = part_f[0] + T.exp(logits[row, 0, tx * per_lane + i] / temperature
                                                                      - st[0])
                                        part_i[0] = tx * per_lane + i
                        red_f[tx] = part_f[0]
                        red_i[tx] = part_i[0]
                    sync()
                    for tx in lane(lanes):
                        if tx == 0:
                            # one lane walks the chunk sums, then the chunk the target falls in
                            part_f[0] = T.float32(0)
                            for j in range(lanes):
                                part_f[0] = part_f[0] + red_f[j]
                            st[3] = u * part_f[0]
                            part_f[0] = T.float32(0)
                            part_i[0] = -1
                            for j in range(lanes):
                                st[5] = red_f[j]
                                if part_i[0] < 0:
                                    if part_f[0] + st[5] > st[3]:
                                        part_i[0] = j
                                    else:
                                        part_f[0] = part_f[0] + st[5]
                            if part_i[0] < 0:
                                # rounding put the target past the end: the last kept token
                                bs[0] = -1
                                for j in range(lanes):
                                    bs[0] = T.max(bs[0], red_i[j])
                                out[row] = T.max(bs[0], 0)
                            else:
                                bs[0] = -1
                                bs[1] = -1
                                for i in range(per_lane):
                                    if bs[0] < 0 and part_i[0] * per_lane + i < vocab:
                                        if logits[row, 0, part_i[0] * per_lane + i] / temperature >= st[1]:
                                            if T.exp(logits[row, 0, part_i[0] * per_lane + i] / temperature
                                                     - st[0]) > T.float32(0):
                                                bs[1] = part_i[0] * per_lane + i
                                                part_f[0] = part_f[0] + T.exp(
                                                    logits[row, 0, part_i[0] * per_lane + i] / temperature - st[0])
                                                if part_f[0] > st[3]:
                                                    bs[0] = bs[1]
                                # no crossing inside (rounding): the per_lane's last kept token
                                out[row] = T.if_then_else(bs[0] >= 0, bs[0], T.max(bs[1], 0))

    return sample_tokens


CPU_LANES = 16                   # the CPU variant's vectors (LLVM splits them where registers are narrower)
EXP_FLOOR = -87.0                # exp of less is 0 in the CPU variant (exact float32 exp: < 1.7e-38, subnormal)
# exp(r) - 1 - r - r^2 / 2 on |r| <= ln 2 / 2 over r^3: the polynomial of Cephes' expf (relative error ~1e-7)
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)


def vector_exp(d):
    """exp(d) for float32 d <= 0 as plain arithmetic that vectorises (LLVM turns a vector `exp` into
    a libm call per lane): d = n ln 2 + r (ln 2 in two parts, r exact), exp(r) by _EXP_POLY, times 2^n
    built in the exponent bits; 0 below EXP_FLOOR, where 2^n would leave the normal floats."""
    x = T.max(d, T.float32(EXP_FLOOR))
    n = T.floor(x * T.float32(1.4426950408889634) + T.float32(0.5))
    r = x - n * T.float32(0.693359375) - n * T.float32(-2.12194440e-4)
    p = T.float32(_EXP_POLY[0])
    for c in _EXP_POLY[1:]:
        p = p * r + T.float32(c)
    scale = T.reinterpret("float32", T.shift_left(T.Cast("int32", n) + 127, 23))
    return T.Select(d < T.float32(EXP_FLOOR), T.float32(0), (p * r * r + r + T.float32(1)) * scale)


def _cpu_kernel(vocab: int, key, unkey, split, narrow):
    """sample_tokens for a CPU: one row per parallel iteration, the same rules and thresholds as the
    GPU variant, its passes written for one core. Each row's x / temperature and exp(x / temperature
    - max) are computed once into row buffers (the GPU variant recomputes them in every pass: 13
    passes of scalar exp calls a search, 2.2-2.4 ms for a top-p row of SmolLM2's 49,152 logits on a
    znver4); the searches' passes then count or sum in vectors of CPU_LANES, a partial sum per lane
    and pivot. The draw walks the kept weights in vocabulary order, one sum, as before."""
    full, tail = divmod(vocab, CPU_LANES)
    width = SEGMENTS * CPU_LANES
    lowest = -3.4028234663852886e38
    lowest_key = _key_of(lowest)

    @T.macro
    def fold(buf, base, combine):
        """buf[base] = combine over buf[base : base + CPU_LANES], by halves."""
        for i in T.vectorized(8):
            buf[base + i] = combine(buf[base + i], buf[base + i + 8])
        for i in T.vectorized(4):
            buf[base + i] = combine(buf[base + i], buf[base + i + 4])
        buf[base] = combine(combine(buf[base], buf[base + 2]), combine(buf[base + 1], buf[base + 3]))

    def add(a, b):
        return a + b

    def vkey(f):
        """key, in a Select (both arms are safe): a vectorisable loop (if_then_else is not)."""
        b = T.reinterpret("int32", f)
        return T.Select(b < 0, T.bitwise_xor(b, 0x7FFFFFFF), b)

    def weight(w, i, weighted):
        return w[i] if weighted else T.float32(1)

    @T.macro
    def search(xs, w, bs, pv, vec, target, weighted):
        """Narrow the keys (bs[0], bs[1]) to the largest key v whose tokens xs >= v number
        (weighted: hold the mass w) at least target."""
        for rnd in range(ROUNDS):  # noqa: B007 (a round of the search)
            if bs[0] < bs[1] - 1:
                split(bs, pv)
                for i in T.vectorized(width):
                    vec[i] = T.float32(0)
                for c in range(full):
                    for j in T.unroll(SEGMENTS - 1):
                        for i in T.vectorized(CPU_LANES):
                            vec[(j + 1) * CPU_LANES + i] = vec[(j + 1) * CPU_LANES + i] + T.Select(
                                vkey(xs[c * CPU_LANES + i]) >= pv[j + 1], weight(w, c * CPU_LANES + i, weighted),
                                T.float32(0))
                for t in range(tail):
                    for j in range(1, SEGMENTS):
                        if key(xs[full * CPU_LANES + t]) >= pv[j]:
                            vec[j * CPU_LANES] = vec[j * CPU_LANES] + weight(w, full * CPU_LANES + t, weighted)
                bs[2] = 0
                for j in range(1, SEGMENTS):
                    fold(vec, j * CPU_LANES, add)
                    if vec[j * CPU_LANES] >= target:
                        bs[2] = j
                narrow(bs, pv)

    @T.macro
    def masked_sum(xs, w, vec, threshold):
        """vec[0] = the sum of w where xs >= threshold."""
        for i in T.vectorized(CPU_LANES):
            vec[i] = T.float32(0)
        for c in range(full):
            for i in T.vectorized(CPU_LANES):
                vec[i] = vec[i] + T.Select(xs[c * CPU_LANES + i] >= threshold, w[c * CPU_LANES + i], T.float32(0))
        fold(vec, 0, add)
        for t in range(tail):
            if xs[full * CPU_LANES + t] >= threshold:
                vec[0] = vec[0] + w[full * CPU_LANES + t]

    @T.prim_func(private=True, s_tir=True)
    def sample_tokens(var_logits: T.handle, var_params: T.handle, var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        batch = T.int32()
        logits = T.match_buffer(var_logits, (batch, 1, vocab), "float32")
        params = T.match_buffer(var_params, (batch, 5), "float32")
        out = T.match_buffer(var_out, (batch,), "int32")
        for row in T.parallel(batch):
            with T.sblock("sample"):
                xs = T.sblock_alloc_buffer((vocab,), "float32")          # x / temperature
                w = T.sblock_alloc_buffer((vocab,), "float32")           # exp(x / temperature - max)
                vec = T.sblock_alloc_buffer((width,), "float32")         # per pivot, a partial sum per lane
                # row state: 0 max(x / t), 1 threshold, 2 top-k threshold, 3 target, 4 the raw maximum
                st = T.sblock_alloc_buffer((5,), "float32")
                # search bounds (keys): 0 lo, 1 hi, 2 the segment picked; then the draw's indices
                bs = T.sblock_alloc_buffer((4,), "int32")
                pv = T.sblock_alloc_buffer((SEGMENTS + 1,), "int32")     # lo, pivots, hi
                part_f = T.sblock_alloc_buffer((1,), "float32")
                temperature: T.let[T.float32] = params[row, 0]
                top_k: T.let[T.int32] = T.Cast("int32", params[row, 1])
                top_p: T.let[T.float32] = params[row, 2]
                min_p: T.let[T.float32] = params[row, 3]
                u: T.let[T.float32] = params[row, 4]

                # the row's maximum
                for i in T.vectorized(CPU_LANES):
                    vec[i] = T.float32(lowest)
                for c in range(full):
                    for i in T.vectorized(CPU_LANES):
                        vec[i] = T.max(vec[i], logits[row, 0, c * CPU_LANES + i])
                fold(vec, 0, T.max)
                for t in range(tail):
                    vec[0] = T.max(vec[0], logits[row, 0, full * CPU_LANES + t])
                st[4] = vec[0]
                if temperature == T.float32(0) or top_k == 1:
                    # greedy: the first index holding the maximum (vocab where none: all -inf or NaN)
                    for i in T.vectorized(CPU_LANES):
                        vec[i] = T.float32(vocab)
                    for c in range(full):
                        for i in T.vectorized(CPU_LANES):
                            vec[i] = T.min(vec[i], T.Select(logits[row, 0, c * CPU_LANES + i] == st[4],
                                                            T.Cast("float32", c * CPU_LANES + i), T.float32(vocab)))
                    fold(vec, 0, T.min)
                    for t in range(tail):
                        if logits[row, 0, full * CPU_LANES + t] == st[4]:
                            vec[0] = T.min(vec[0], T.float32(full * CPU_LANES + t))
                    out[row] = T.min(T.Cast("int32", vec[0]), vocab - 1)
                else:
                    st[0] = st[4] / temperature                # max(x / t) == max(x) / t for t > 0
                    for c in range(full):
                        for i in T.vectorized(CPU_LANES):
                            xs[c * CPU_LANES + i] = logits[row, 0, c * CPU_LANES + i] / temperature
                    for t in range(tail):
                        xs[full * CPU_LANES + t] = logits[row, 0, full * CPU_LANES + t] / temperature
                    for c in range(full):
                        for i in T.vectorized(CPU_LANES):
                            w[c * CPU_LANES + i] = vector_exp(xs[c * CPU_LANES + i] - st[0])
                    for t in range(tail):
                        w[full * CPU_LANES + t] = vector_exp(xs[full * CPU_LANES + t] - st[0])
                    st[1] = T.float32(lowest)
                    if min_p > T.float32(0):
                        st[1] = st[0] + T.log(min_p)
                    st[2] = T.float32(lowest)
                    if top_k > 0 and top_k < vocab:
                        # the largest v with count(x >= v) >= top_k: the k-th largest x
                        bs[0] = lowest_key
                        bs[1] = key(st[0]) + 1
                        search(xs, w, bs, pv, vec, T.Cast("float32", top_k), False)
                        st[2] = unkey(bs[0])
                        st[1] = T.max(st[1], st[2])
                    if top_p < T.float32(1):
                        # target: top_p of the mass top-k keeps (all of it without top-k)
                        masked_sum(xs, w, vec, st[2])
                        st[3] = top_p * vec[0]
                        # the largest v whose tokens x >= v hold the target mass
                        bs[0] = key(st[2])
                        bs[1] = key(st[0]) + 1
                        search(xs, w, bs, pv, vec, st[3], True)
                        st[1] = T.max(st[1], unkey(bs[0]))
                    # the draw: the kept weights' sum, then the first token whose running sum passes u x it
                    part_f[0] = T.float32(0)
                    bs[3] = -1
                    for i in T.serial(vocab):
                        if xs[i] >= st[1] and w[i] > T.float32(0):
                            part_f[0] = part_f[0] + w[i]
                            bs[3] = i
                    st[3] = u * part_f[0]
                    part_f[0] = T.float32(0)
                    bs[0] = -1
                    for i in T.serial(vocab):
                        if bs[0] < 0 and xs[i] >= st[1] and w[i] > T.float32(0):
                            part_f[0] = part_f[0] + w[i]
                            if part_f[0] > st[3]:
                                bs[0] = i
                    # no crossing (rounding): the last kept token
                    out[row] = T.if_then_else(bs[0] >= 0, bs[0], T.max(bs[3], 0))

    return sample_tokens

