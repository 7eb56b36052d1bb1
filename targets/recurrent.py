"""Kernels of recurrent layers over per-sequence state slots (the KV cache kiln owns, models/owned_kv.py):
Qwen3.5's, Qwen3-Next's and Kimi Linear's gated delta rules (a causal depthwise convolution, then the delta rule),
Mamba-2's (the same convolution, then its selective scan: the delta rule without the delta) and Mamba-1's (the
convolution, then a selective scan whose decay differs a state entry).

A recurrent layer keeps no keys and values a token: its state is a fixed size a sequence, held in a slot
of the layer's state tensors ([slots, ...] float32; the runtime hands each sequence a slot,
runtime/kv_caches.py). A forward's rows are sequences' consecutive new tokens (q_indptr marks each
sequence's rows, state_slots its slot); a sequence whose first row is position 0 starts from a zero state,
whatever its slot held. Each kernel reads the state, runs the sequence's rows in order and writes the
state back in place, so chunked prefill, decode and mixed batches all take it.

    conv:   out[t, c] = sum_j w[c, j] * x[t - (taps - 1) + j, c]   (x before the chunk: the state's last
            taps - 1 inputs; the state then holds the chunk's last taps - 1)
    delta:  S <- S * exp(g_t);  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  out_t = S^T q_t
            (S [dk, dv] a value head's, its key head value head // (hv / hk); q, k l2-normed by the caller;
            Kimi Linear's KDA: g_t a decay a key channel, S <- diag(exp(g_t)) S)
    scan:   S <- S * exp(g_t) + k_t (beta_t v_t)^T;  out_t = S^T q_t      (Mamba-2's SSD as a recurrence: k, q
            its B and C [groups, state], v its x [heads, head dim], beta its dt, g dt * A)
    mamba1: h[c] <- exp(dt_t[c] A[c]) * h[c] + dt_t[c] x_t[c] B_t;  y_t[c] = h[c] . C_t   (h [channels, state])

Written for exactness first: on CPUs a task a sequence and 64 (conv) or 16 (Mamba-1's scan) channels,
innermost, or a sequence and value head (delta, scan); on GPUs a thread a channel and a block a sequence and
256 (conv) or 128 (Mamba-1) channels, or a thread a value column (the delta rule's columns are independent) and
a block a sequence and head.
"""

from __future__ import annotations

import math

from tvm.script import tirx as T

from .kernel_memo import parsed_once


@parsed_once()
def state_conv(channels: int, taps: int, dtype: str, gpu: bool = False):
    """The causal depthwise conv over the chunk and the state's last inputs. Arguments: x [tokens, channels],
    state [slots, channels, taps - 1] float32 (updated in place), q_indptr, state_slots, positions,
    w [channels, taps], out [tokens, channels]."""
    keep = taps - 1
    threads = min(256, channels)
    rounds = -(-channels // threads)
    width = math.gcd(channels, 64)          # CPU tasks: a sequence and this many channels, innermost (contiguous)
    blocks = channels // width

    lanes = 1 if gpu else width             # the channels a call takes (a GPU thread: one)

    @T.macro
    def conv_lanes(b, c0, x, state, q_indptr, state_slots, positions, w, out, acc):
        """`lanes` channels from c0, row by row, the channels innermost."""
        start = q_indptr[b]
        m = q_indptr[b + 1] - start
        slot = state_slots[b]
        if m > 0:
            fresh = positions[start] == 0
            for i in T.serial(m):
                for cc in T.serial(lanes):
                    acc[cc] = T.float32(0.0)
                for j in T.serial(taps):
                    if i - keep + j >= 0:
                        for cc in T.serial(lanes):
                            acc[cc] = acc[cc] + T.Cast("float32", w[c0 + cc, j]) * T.Cast(
                                "float32", x[start + i - keep + j, c0 + cc])
                    elif not fresh:
                        for cc in T.serial(lanes):
                            acc[cc] = acc[cc] + T.Cast("float32", w[c0 + cc, j]) * state[slot, c0 + cc, i + j]
                for cc in T.serial(lanes):
                    out[start + i, c0 + cc] = T.Cast(dtype, acc[cc])
            for k in T.serial(keep):                  # ascending: each reads an entry at or after the one it writes
                if m - keep + k >= 0:
                    for cc in T.serial(lanes):
                        state[slot, c0 + cc, k] = T.Cast("float32", x[start + m - keep + k, c0 + cc])
                elif fresh:
                    for cc in T.serial(lanes):
                        state[slot, c0 + cc, k] = T.float32(0.0)
                else:
                    for cc in T.serial(lanes):
                        state[slot, c0 + cc, k] = state[slot, c0 + cc, m + k]

    @T.prim_func
    def recurrent_conv(var_x: T.handle, var_state: T.handle, var_q_indptr: T.handle, var_state_slots: T.handle,
                       var_positions: T.handle, var_w: T.handle, var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        n, slots, b1, b = T.int32(), T.int64(), T.int32(), T.int32()
        o1, o2, o3 = T.int32(), T.int32(), T.int32()
        x = T.match_buffer(var_x, (n, channels), dtype)
        state = T.match_buffer(var_state, (slots, channels, keep), "float32")
        q_indptr = T.match_buffer(var_q_indptr, (b1,), "int32", elem_offset=o1)
        state_slots = T.match_buffer(var_state_slots, (b,), "int32", elem_offset=o2)
        positions = T.match_buffer(var_positions, (n,), "int32", elem_offset=o3)
        w = T.match_buffer(var_w, (channels, taps), dtype)
        out = T.match_buffer(var_out, (n, channels), dtype)
        if gpu:
            for sc in T.thread_binding(b * rounds, thread="blockIdx.x"):       # a block a sequence and
                for ci in T.thread_binding(threads, thread="threadIdx.x"):     # `threads` channels
                    acc = T.alloc_buffer((1,), "float32", scope="local")
                    if sc % rounds * threads + ci < channels:
                        conv_lanes(sc // rounds, sc % rounds * threads + ci, x, state, q_indptr, state_slots,
                                   positions, w, out, acc)
        else:
            for task in T.parallel(b * blocks):
                acc = T.alloc_buffer((width,), "float32")
                conv_lanes(task // blocks, task % blocks * width, x, state, q_indptr, state_slots, positions, w, out,
                           acc)

    return recurrent_conv


@parsed_once()
def gated_delta(hk: int, hv: int, dk: int, dv: int, gpu: bool = False, delta: bool = True, channels: bool = False):
    """The gated delta rule over each sequence's rows, its state [dk, dv] a value head in its slot. Arguments
    (float32): q, k [tokens, hk, dk] (l2-normed, q scaled), v [tokens, hv, dv], g, beta [tokens, hv], state
    [slots, hv, dk, dv] (updated in place), q_indptr, state_slots, positions, out [tokens, hv, dv]. Without
    `delta` the update writes beta v, not beta (v - e^g S^T k): Mamba-2's scan (the module's docstring). With
    `channels`, g is [tokens, hv, dk]: a decay a key channel, S's row kk times exp(g[kk]) (Kimi Linear's KDA)."""
    if hv % hk:
        raise ValueError(f"{hv} value heads do not group over {hk} key heads")
    if channels and not delta:
        raise ValueError("a decay per key channel is the delta rule's (KDA's), not the scan's")
    group = hv // hk
    threads = min(128, dv)
    rounds = -(-dv // threads)

    @T.macro
    def column(b, h, col, q, k, v, g, beta, state, q_indptr, state_slots, positions, out, st):
        """One value column of head h: S[:, col] in place, token by token (GPU threads)."""
        start = q_indptr[b]
        m = q_indptr[b + 1] - start
        slot = state_slots[b]
        if m > 0:
            if positions[start] == 0:
                for kk in T.serial(dk):
                    state[slot, h, kk, col] = T.float32(0.0)
            for i in T.serial(m):
                if channels:                # decayed first, a row its own rate: S^T k then reads the decayed S
                    st[1] = T.float32(0.0)
                    for kk in T.serial(dk):
                        state[slot, h, kk, col] = state[slot, h, kk, col] * T.exp(g[start + i, h, kk])
                        st[1] = st[1] + state[slot, h, kk, col] * k[start + i, h // group, kk]
                    st[0] = T.float32(1.0)
                else:
                    st[0] = T.exp(g[start + i, h])
                    st[1] = T.float32(0.0)
                    if delta:
                        for kk in T.serial(dk):
                            st[1] = st[1] + state[slot, h, kk, col] * k[start + i, h // group, kk]
                st[2] = (v[start + i, h, col] - st[1] * st[0]) * beta[start + i, h]
                st[3] = T.float32(0.0)
                for kk in T.serial(dk):
                    state[slot, h, kk, col] = state[slot, h, kk, col] * st[0] + k[start + i, h // group, kk] * st[2]
                    st[3] = st[3] + state[slot, h, kk, col] * q[start + i, h // group, kk]
                out[start + i, h, col] = st[3]

    @T.macro
    def head(b, h, q, k, v, g, beta, state, q_indptr, state_slots, positions, out, mem):
        """A value head's whole state in place, token by token, its columns innermost (CPU tasks)."""
        start = q_indptr[b]
        m = q_indptr[b + 1] - start
        slot = state_slots[b]
        if m > 0:
            if positions[start] == 0:
                for kk, col in T.grid(dk, dv):
                    state[slot, h, kk, col] = T.float32(0.0)
            for i in T.serial(m):
                for col in T.serial(dv):
                    mem[col] = T.float32(0.0)
                if channels:                # decayed first, a row its own rate; the delta then reads that S
                    for kk in T.serial(dk):
                        decay = T.exp(g[start + i, h, kk])
                        for col in T.serial(dv):
                            state[slot, h, kk, col] = state[slot, h, kk, col] * decay
                            mem[col] = mem[col] + state[slot, h, kk, col] * k[start + i, h // group, kk]
                    for col in T.serial(dv):
                        mem[col] = (v[start + i, h, col] - mem[col]) * beta[start + i, h]
                        out[start + i, h, col] = T.float32(0.0)
                    for kk, col in T.grid(dk, dv):
                        state[slot, h, kk, col] = state[slot, h, kk, col] + k[start + i, h // group, kk] * mem[col]
                        out[start + i, h, col] = out[start + i, h, col] + state[slot, h, kk, col] * q[
                            start + i, h // group, kk]
                else:
                    if delta:
                        for kk, col in T.grid(dk, dv):
                            mem[col] = mem[col] + state[slot, h, kk, col] * k[start + i, h // group, kk]
                    for col in T.serial(dv):      # the delta, decay folded in: beta (v - e^g S^T k) (or beta v)
                        mem[col] = (v[start + i, h, col] - mem[col] * T.exp(g[start + i, h])) * beta[start + i, h]
                        out[start + i, h, col] = T.float32(0.0)
                    for kk, col in T.grid(dk, dv):
                        state[slot, h, kk, col] = (state[slot, h, kk, col] * T.exp(g[start + i, h])
                                                   + k[start + i, h // group, kk] * mem[col])
                        out[start + i, h, col] = out[start + i, h, col] + state[slot, h, kk, col] * q[
                            start + i, h // group, kk]

    @T.prim_func
    def recurrent_delta(var_q: T.handle, var_k: T.handle, var_v: T.handle, var_g: T.handle, var_beta: T.handle,
                        var_state: T.handle, var_q_indptr: T.handle, var_state_slots: T.handle,
                        var_positions: T.handle, var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        n, slots, b1, b = T.int32(), T.int64(), T.int32(), T.int32()
        o1, o2, o3 = T.int32(), T.int32(), T.int32()
        q = T.match_buffer(var_q, (n, hk, dk), "float32")
        k = T.match_buffer(var_k, (n, hk, dk), "float32")
        v = T.match_buffer(var_v, (n, hv, dv), "float32")
        g = T.match_buffer(var_g, (n, hv, dk) if channels else (n, hv), "float32")
        beta = T.match_buffer(var_beta, (n, hv), "float32")
        state = T.match_buffer(var_state, (slots, hv, dk, dv), "float32")
        q_indptr = T.match_buffer(var_q_indptr, (b1,), "int32", elem_offset=o1)
        state_slots = T.match_buffer(var_state_slots, (b,), "int32", elem_offset=o2)
        positions = T.match_buffer(var_positions, (n,), "int32", elem_offset=o3)
        out = T.match_buffer(var_out, (n, hv, dv), "float32")
        if gpu:
            for bh in T.thread_binding(b * hv, thread="blockIdx.x"):
                for ci in T.thread_binding(threads, thread="threadIdx.x"):
                    for co in T.serial(rounds):
                        st = T.alloc_buffer((4,), "float32", scope="local")
                        if co * threads + ci < dv:
                            column(bh // hv, bh % hv, co * threads + ci, q, k, v, g, beta, state, q_indptr,
                                   state_slots, positions, out, st)
        else:
            for task in T.parallel(b * hv):
                mem = T.alloc_buffer((dv,), "float32")
                head(task // hv, task % hv, q, k, v, g, beta, state, q_indptr, state_slots, positions, out, mem)

    return recurrent_delta


@parsed_once()
def selective_scan(channels: int, state_size: int, gpu: bool = False):
    """Mamba-1's selective scan over each sequence's rows, its state [channels, state_size] in its slot: a channel's
    decay a state entry, h <- exp(dt A) h + dt B x;  y = h . C. Arguments (float32): x, dt [tokens, channels],
    A [channels, state_size] (-exp(A_log)), B, C [tokens, state_size], state [slots, channels, state_size] (updated
    in place), q_indptr, state_slots, positions, out [tokens, channels] (y, before D x and the gate)."""
    threads = min(128, channels)
    rounds = -(-channels // threads)
    width = math.gcd(channels, 16)          # CPU tasks: a sequence and this many channels
    blocks = channels // width
    lanes = 1 if gpu else width

    @T.macro
    def scan_lanes(b, c0, x, dt, A, B, C, state, q_indptr, state_slots, positions, out, acc):
        """`lanes` channels from c0, token by token, each channel's state entries innermost."""
        start = q_indptr[b]
        m = q_indptr[b + 1] - start
        slot = state_slots[b]
        if m > 0:
            if positions[start] == 0:
                for cc, n in T.grid(lanes, state_size):
                    state[slot, c0 + cc, n] = T.float32(0.0)
            for i in T.serial(m):
                for cc in T.serial(lanes):
                    acc[cc] = T.float32(0.0)
                    for n in T.serial(state_size):
                        state[slot, c0 + cc, n] = (T.exp(dt[start + i, c0 + cc] * A[c0 + cc, n])
                                                   * state[slot, c0 + cc, n]
                                                   + dt[start + i, c0 + cc] * B[start + i, n] * x[start + i, c0 + cc])
                        acc[cc] = acc[cc] + state[slot, c0 + cc, n] * C[start + i, n]
                    out[start + i, c0 + cc] = acc[cc]

    @T.prim_func
    def recurrent_selective_scan(var_x: T.handle, var_dt: T.handle, var_A: T.handle, var_B: T.handle,
                                 var_C: T.handle, var_state: T.handle, var_q_indptr: T.handle,
                                 var_state_slots: T.handle, var_positions: T.handle, var_out: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        n_rows, slots, b1, b = T.int32(), T.int64(), T.int32(), T.int32()
        o1, o2, o3 = T.int32(), T.int32(), T.int32()
        x = T.match_buffer(var_x, (n_rows, channels), "float32")
        dt = T.match_buffer(var_dt, (n_rows, channels), "float32")
        A = T.match_buffer(var_A, (channels, state_size), "float32")
        B = T.match_buffer(var_B, (n_rows, state_size), "float32")
        C = T.match_buffer(var_C, (n_rows, state_size), "float32")
        state = T.match_buffer(var_state, (slots, channels, state_size), "float32")
        q_indptr = T.match_buffer(var_q_indptr, (b1,), "int32", elem_offset=o1)
        state_slots = T.match_buffer(var_state_slots, (b,), "int32", elem_offset=o2)
        positions = T.match_buffer(var_positions, (n_rows,), "int32", elem_offset=o3)
        out = T.match_buffer(var_out, (n_rows, channels), "float32")
        if gpu:
            for sc in T.thread_binding(b * rounds, thread="blockIdx.x"):       # a block a sequence and
                for ci in T.thread_binding(threads, thread="threadIdx.x"):     # `threads` channels
                    acc = T.alloc_buffer((1,), "float32", scope="local")
                    if sc % rounds * threads + ci < channels:
                        scan_lanes(sc // rounds, sc % rounds * threads + ci, x, dt, A, B, C, state, q_indptr,
                                   state_slots, positions, out, acc)
        else:
            for task in T.parallel(b * blocks):
                acc = T.alloc_buffer((width,), "float32")
                scan_lanes(task // blocks, task % blocks * width, x, dt, A, B, C, state, q_indptr, state_slots,
                           positions, out, acc)

    return recurrent_selective_scan
