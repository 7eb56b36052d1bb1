"""numpy references of attention kernels, shared by the CPU and OpenCL kernel tests."""

from __future__ import annotations

import numpy as np


def owned_attention_reference(q, pages, pages_of, rows, sinks, window: int, scale: float,
                              slopes=None) -> np.ndarray:
    """targets/owned_kv.py's attention in float64: each query row (sequence, position) over its sequence's keys
    at positions max(p - window + 1, 0)..p (every earlier one where window is 0), read from the pages the
    sequence holds (pages_of), with each head's sink logit in its softmax; with `slopes`, ALiBi's bias by key
    position as BLOOM adds it (slope * j: the softmax is the same for slope * (j - p))."""
    h_q, h_kv, page = q.shape[1], pages.shape[2], pages.shape[3]
    out = np.zeros(q.shape, np.float64)
    for t, (b, p) in enumerate(rows):
        lo = max(p - window + 1, 0) if window else 0
        keys = [(pages_of[b][j // page], j % page) for j in range(lo, p + 1)]
        for h in range(h_q):
            k = np.stack([pages[pg, 0, h // (h_q // h_kv), r] for pg, r in keys]).astype(np.float64)
            v = np.stack([pages[pg, 1, h // (h_q // h_kv), r] for pg, r in keys]).astype(np.float64)
            s = k @ q[t, h] * scale
            if slopes is not None:
                s = s + slopes[h] * np.arange(lo, p + 1)
            m = max(s.max(), sinks[h])
            e = np.exp(s - m)
            out[t, h] = e @ v / (e.sum() + np.exp(sinks[h] - m))
    return out
