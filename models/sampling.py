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
x >= v), found by bisection over the float's order-preserving 32-bit key, so it lands exactly on a
logit (32 passes over the row, only for rows that ask for top-k or top-p). Sums are float32 in
another order than numpy's, so a draw can differ from the host's where u falls within rounding of
a boundary between two tokens; the thresholds are exact values of the row.

One work-group of LANES threads per row on GPUs (tree reductions in shared memory); on CPUs one
row per parallel iteration with the lanes run in turn.
"""

from __future__ import annotations

import numpy as np
from tvm.script import tirx as T

LANES = 256                      # threads per row on a GPU (WebGPU's and Metal's work-group limit)
PARAMS = ("temperature", "top_k", "top_p", "min_p", "u")    # the columns of `params`, in order


def _key_of(f: float) -> int:
    """The kernel's key of a float32, computed here (OpenCL cannot reinterpret a constant)."""
    b = int(np.array(f, np.float32).view(np.int32))
    return b ^ 0x7FFFFFFF if b < 0 else b


def sample_kernel(vocab: int, gpu: bool):
    """The PrimFunc (logits [batch, 1, vocab] f32, params [batch, 5] f32, out [batch] i32)."""
    lanes = LANES if gpu else 1
    chunk = -(-vocab // lanes)                        # contiguous tokens per lane (the draw)
    strided = -(-vocab // lanes)                      # strided tokens per lane (the other passes)
    steps = lanes.bit_length() - 1
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

    def key(f):
        """A float32's 32-bit key: orders as the float does (negative floats flipped)."""
        b = T.reinterpret("int32", f)
        return T.if_then_else(b < 0, T.bitwise_xor(b, 0x7FFFFFFF), b)

    def unkey(k):
        return T.reinterpret("float32", T.if_then_else(k < 0, T.bitwise_xor(k, 0x7FFFFFFF), k))

    def fmax(a, b):
        return T.max(a, b)

    def add(a, b):
        return a + b

    def imin(a, b):
        return T.min(a, b)

    def imax(a, b):
        return T.max(a, b)

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
                # bisection bounds (keys): 0 lo, 1 hi, 2 mid, 3 a reduction's result
                bs = T.sblock_alloc_buffer((4,), "int32", scope="local")
                temperature: T.let[T.float32] = params[row, 0]
                top_k: T.let[T.int32] = T.Cast("int32", params[row, 1])
                top_p: T.let[T.float32] = params[row, 2]
                min_p: T.let[T.float32] = params[row, 3]
                u: T.let[T.float32] = params[row, 4]

                # the row's maximum
                for tx in lane(lanes):
                    part_f[0] = T.float32(lowest)
                    for i in range(strided):
                        if i * lanes + tx < vocab:
                            part_f[0] = T.max(part_f[0], logits[row, 0, i * lanes + tx])
                    red_f[tx] = part_f[0]
                tree(red_f, fmax)
                st[4] = red_f[0]
                sync()
                if temperature == T.float32(0) or top_k == 1:
                    # greedy: the first index holding the maximum
                    for tx in lane(lanes):
                        part_i[0] = vocab
                        for i in range(strided):
                            if i * lanes + tx < vocab:
                                if logits[row, 0, i * lanes + tx] == st[4]:
                                    part_i[0] = T.min(part_i[0], i * lanes + tx)
                        red_i[tx] = part_i[0]
                    tree(red_i, imin)
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
                        for _ in range(32):
                            if bs[0] < bs[1] - 1:
                                bs[2] = (bs[0] >> 1) + (bs[1] >> 1) + T.bitwise_and(T.bitwise_and(bs[0], bs[1]), 1)
                                for tx in lane(lanes):
                                    part_i[0] = 0
                                    for i in range(strided):
                                        if i * lanes + tx < vocab:
                                            if key(logits[row, 0, i * lanes + tx] / temperature) >= bs[2]:
                                                part_i[0] = part_i[0] + 1
                                    red_i[tx] = part_i[0]
                                tree(red_i, add)
                                bs[3] = red_i[0]
                                if bs[3] >= top_k:
                                    bs[0] = bs[2]
                                else:
                                    bs[1] = bs[2]
                                sync()
                        st[2] = unkey(bs[0])
                        st[1] = T.max(st[1], st[2])
                    if top_p < T.float32(1):
                        # target: top_p of the mass top-k keeps (all of it without top-k)
                        for tx in lane(lanes):
                            part_f[0] = T.float32(0)
                            for i in range(strided):
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
                        for _ in range(32):
                            if bs[0] < bs[1] - 1:
                                bs[2] = (bs[0] >> 1) + (bs[1] >> 1) + T.bitwise_and(T.bitwise_and(bs[0], bs[1]), 1)
                                for tx in lane(lanes):
                                    part_f[0] = T.float32(0)
                                    for i in range(strided):
                                        if i * lanes + tx < vocab:
                                            if key(logits[row, 0, i * lanes + tx] / temperature) >= bs[2]:
                                                part_f[0] = part_f[0] + T.exp(
                                                    logits[row, 0, i * lanes + tx] / temperature - st[0])
                                    red_f[tx] = part_f[0]
                                tree(red_f, add)
                                st[5] = red_f[0]
                                if st[5] >= st[3]:
                                    bs[0] = bs[2]
                                else:
                                    bs[1] = bs[2]
                                sync()
                        st[1] = T.max(st[1], unkey(bs[0]))
                    # the draw: each lane's contiguous chunk sum and its last token of positive weight
                    for tx in lane(lanes):
                        part_f[0] = T.float32(0)
                        part_i[0] = -1
                        for i in range(chunk):
                            if tx * chunk + i < vocab:
                                if logits[row, 0, tx * chunk + i] / temperature >= st[1]:
                                    if T.exp(logits[row, 0, tx * chunk + i] / temperature - st[0]) > T.float32(0):
                                        part_f[0] = part_f[0] + T.exp(logits[row, 0, tx * chunk + i] / temperature
                                                                      - st[0])
                                        part_i[0] = tx * chunk + i
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
                                for i in range(chunk):
                                    if bs[0] < 0 and part_i[0] * chunk + i < vocab:
                                        if logits[row, 0, part_i[0] * chunk + i] / temperature >= st[1]:
                                            if T.exp(logits[row, 0, part_i[0] * chunk + i] / temperature
                                                     - st[0]) > T.float32(0):
                                                bs[1] = part_i[0] * chunk + i
                                                part_f[0] = part_f[0] + T.exp(
                                                    logits[row, 0, part_i[0] * chunk + i] / temperature - st[0])
                                                if part_f[0] > st[3]:
                                                    bs[0] = bs[1]
                                # no crossing inside (rounding): the chunk's last kept token
                                out[row] = T.if_then_else(bs[0] >= 0, bs[0], T.max(bs[1], 0))

    return sample_tokens
