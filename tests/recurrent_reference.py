"""numpy (float64) references of targets/recurrent.py's kernels, shared by the CPU and OpenCL tests: each
sequence's rows in order from its slot's state (zeros where its first row is position 0), the states after."""

from __future__ import annotations

import numpy as np


def conv_reference(x, state, indptr, slots, positions, w):
    """-> (out [tokens, channels], state after)."""
    taps = w.shape[1]
    state = state.astype(np.float64).copy()
    out = np.zeros(x.shape, np.float64)
    for b, slot in enumerate(slots):
        rows = x[indptr[b]:indptr[b + 1]].astype(np.float64)
        before = np.zeros((taps - 1, x.shape[1])) if positions[indptr[b]] == 0 else state[slot].T
        seq = np.concatenate([before, rows])                      # [taps - 1 + m, channels]
        for i in range(len(rows)):
            out[indptr[b] + i] = (seq[i:i + taps] * w.T).sum(0)
        state[slot] = seq[-(taps - 1):].T
    return out, state


def delta_reference(q, k, v, g, beta, state, indptr, slots, positions, delta=True):
    """-> (out [tokens, hv, dv], state after); without `delta` Mamba-2's scan (no S^T k taken off v)."""
    group = v.shape[1] // k.shape[1]
    state = state.astype(np.float64).copy()
    out = np.zeros(v.shape, np.float64)
    for b, slot in enumerate(slots):
        s = np.zeros(state.shape[1:]) if positions[indptr[b]] == 0 else state[slot]
        for t in range(indptr[b], indptr[b + 1]):
            for h in range(v.shape[1]):
                kt, qt = k[t, h // group].astype(np.float64), q[t, h // group].astype(np.float64)
                s[h] *= np.exp(np.asarray(g[t, h]))[..., None]     # g a head's (scalar) or a key channel's
                change = (v[t, h] - (kt @ s[h] if delta else 0)) * beta[t, h]
                s[h] += np.outer(kt, change)
                out[t, h] = qt @ s[h]
        state[slot] = s
    return out, state


def selective_scan_reference(x, dt, A, B, C, state, indptr, slots, positions):
    """Mamba-1's scan -> (out [tokens, channels], state after)."""
    state = state.astype(np.float64).copy()
    out = np.zeros(x.shape, np.float64)
    for b, slot in enumerate(slots):
        h = np.zeros(state.shape[1:]) if positions[indptr[b]] == 0 else state[slot]
        for t in range(indptr[b], indptr[b + 1]):
            h = np.exp(dt[t][:, None] * A) * h + (dt[t] * x[t])[:, None] * B[t][None, :]
            out[t] = h @ C[t]
        state[slot] = h
    return out, state
