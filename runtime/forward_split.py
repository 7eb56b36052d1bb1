"""How one forward's tokens split into the calls a compiled artifact can take: at most its max batch
size of logit rows a call (row_bounded) and at most its prefill chunk of tokens (prefill_chunks).
Plans only, on the host: runtime/model_runner.py runs them."""

from __future__ import annotations

import numpy as np


def row_bounded(items: list, bound: int):
    """Split one forward's (index, tokens, full) items into forwards that return at most `bound`
    logit rows (a full item one per token, others one): in order, each sequence once per forward."""
    part, rows = [], 0
    for i, toks, full in sorted(items, key=lambda item: bool(item[2])):    # single-row items first
        while len(toks):
            take = min(len(toks), bound - rows) if full else len(toks)
            if take <= 0 or rows + (take if full else 1) > bound:
                yield part
                part, rows = [], 0
                continue
            part.append((i, toks[:take], full))
            rows += take if full else 1
            toks = toks[take:]
    if part:
        yield part


def prefill_chunks(seq_ids: list[int], tokens: list[list[int]], budget: int, limit=None):
    """Split a ragged prefill into calls of at most `budget` tokens, and at most limit(seq_id) of one
    sequence (a sliding window's bound, asked before each call): yields [(seq_id, n, ids)]."""
    pending = [(s, np.asarray(t, dtype=np.int32)) for s, t in zip(seq_ids, tokens)]
    while pending:
        chunk, used, rest = [], 0, []
        for s, t in pending:
            take = min(len(t), budget - used, limit(s) if limit else len(t))
            if take <= 0 or any(c[0] == s for c in chunk):
                rest.append((s, t))
                continue
            chunk.append((s, take, t[:take]))
            used += take
            if take < len(t):
                rest.append((s, t[take:]))
        pending = rest
        yield chunk
