"""Rows for the sample_tokens kernel (models/sampling.py) and what the host Sampler draws for them."""

from __future__ import annotations

import numpy as np

from kiln.runtime.sampler import _draw


class _Fixed:
    """A generator whose one draw is u (what the kernel is handed in params)."""

    def __init__(self, u: float) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


def sampling_case(rows: int, vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """logits [rows, 1, vocab] and params [rows, 5] mixing greedy rows, temperatures, top-k (on, off,
    above the vocabulary), top-p and min-p; every combination within a few dozen rows."""
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((rows, 1, vocab)) * 3).astype(np.float32)
    logits[::7, 0, rng.integers(vocab)] += 12                 # a peaked row now and then
    logits[1::9, 0, :3] = logits[1::9, 0, :3].max()           # tied maxima (greedy takes the first)
    params = np.stack([rng.choice([0.0, 0.5, 1.0, 1.3], rows),
                       rng.choice([0, 1, 5, 40, vocab + 3], rows),
                       rng.choice([1.0, 0.9, 0.5, 0.99], rows),
                       rng.choice([0.0, 0.0, 0.05], rows),
                       rng.random(rows)], 1).astype(np.float32)
    return logits, params


def host_tokens(logits: np.ndarray, params: np.ndarray) -> np.ndarray:
    """The token runtime/sampler.py's Sampler picks for each row, with the row's u as its one draw."""
    out = []
    for x, (t, k, p, m, u) in zip(logits[:, 0], params):
        if t == 0 or k == 1:
            out.append(int(np.argmax(x)))
            continue
        k = int(k) if k < x.size else 0
        out.append(int(_draw((x / t)[None], np.array([k]), np.array([p], np.float32), np.array([m], np.float32),
                             [_Fixed(float(u))])[0]))
    return np.array(out)
