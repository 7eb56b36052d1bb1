"""Sampler: host-side prepare(requests) and sample(logits).

prepare() gathers each request's parameters into arrays once per step;
sample() turns logits [batch, vocab] into one token id per row. Greedy rows
take the argmax; the others apply temperature, top-k, then top-p, and draw
with the request's own generator (a seeded request always draws the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .request import Request


@dataclass(frozen=True)
class SamplingBatch:
    temperature: np.ndarray     # [batch] float32, 0 = greedy
    top_p: np.ndarray           # [batch]
    top_k: np.ndarray           # [batch] int, 0 = off
    rngs: list[np.random.Generator]


class Sampler:
    def prepare(self, requests: Sequence[Request]) -> SamplingBatch:
        return SamplingBatch(
            temperature=np.array([0.0 if r.params.greedy else r.params.temperature for r in requests], np.float32),
            top_p=np.array([r.params.top_p for r in requests], np.float32),
            top_k=np.array([r.params.top_k for r in requests], np.int64),
            rngs=[r.rng for r in requests])

    def sample(self, logits: np.ndarray, batch: SamplingBatch) -> list[int]:
        """logits: [batch, vocab] float32 -> token ids."""
        return [self._sample_row(logits[i], batch, i) for i in range(logits.shape[0])]

    @staticmethod
    def _sample_row(row: np.ndarray, b: SamplingBatch, i: int) -> int:
        if b.temperature[i] == 0:
            return int(np.argmax(row))
        probs = probabilities(row, float(b.temperature[i]), int(b.top_k[i]), float(b.top_p[i]))
        return int(np.searchsorted(np.cumsum(probs), b.rngs[i].random() * probs.sum(), side="right")
                   .clip(0, probs.size - 1))


def probabilities(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """The distribution sampled from: softmax(logits / T) restricted to top-k, then to the top-p nucleus."""
    x = logits.astype(np.float64) / temperature
    if 0 < top_k < x.size:
        kth = np.partition(x, -top_k)[-top_k]
        x = np.where(x >= kth, x, -np.inf)
    p = np.exp(x - x.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, top_p) + 1)]   # smallest prefix with mass >= top_p
        mask = np.zeros_like(p, dtype=bool)
        mask[keep] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return p
