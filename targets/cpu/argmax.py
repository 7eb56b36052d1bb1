"""greedy_tokens' chunk argmax (models/causal_lm.py, `greedy_argmax_chunks`) vectorised for a CPU.

Why: the kernel reduces each chunk of a row's logits to (first index of its maximum, the maximum)
with a two-value reducer, which no CPU rule vectorises (rfactor does not know it): a serial loop
of dependent compares and selects, parallel over the row's chunks. SmolLM2's 49,152 logits took
0.19 ms a decode step at one sequence (3% of the step) and 0.73 ms at four (6%), ~1 GB/s of logits
(`kiln bench --profile`, znver4, 2 cores).

Here each chunk is read twice, in vectors of LANES (SmolLM2: 84 -> 3.5 us at one row, 346 -> 10
us at four, the same winners bit for bit): its maximum m (a vector max, then halving),
then the first index holding m (a vector min over the indices of the lanes equal to m, absent ones
counted as the chunk's size). The same winners as the reducer wherever no logit is NaN: the largest
value, the first index among equal ones; a chunk whose values are all the lowest float or -inf
keeps the reducer's identity (-1, the lowest float), so an all -inf row gives token 0 as before.
(With NaN logits neither kernel follows numpy's argmax, which returns the first NaN.)

Matched (``match``): a function of exactly the two blocks _chunk_argmax_te emits (`argmax_chunk`,
`winner`), float32 logits [rows, 1, vocab] in, winners [rows, chunks, 2] out (a chunk's logits past
a multiple of LANES in a scalar tail). Anything else: None (the generic rules take it). A vocabulary
greedy_tokens does not split (no chunk count of >= 1,024 logits divides it: GPT-2's 50,257) keeps
its one serial reduction per row.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.script import tirx as T
from tvm.target import Target

from ..kernel_memo import parsed_once
from ..row_dispatch import is_scheduled, over_params, static_int
from .lanes import LANES, fold16


class ChunkArgmax(ScheduleRule):
    """chunk_argmax's kernel in place of a matched `greedy_argmax_chunks` function (llvm targets)."""

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm" or is_scheduled(func):
            return None
        shapes = match(func)
        if shapes is None:
            return None
        body = over_params(func, chunk_argmax(*shapes), name="chunk_argmax")
        return None if body is None else s_tir.Schedule(body)


def match(func: tirx.PrimFunc) -> tuple | None:
    """(rows, vocab, chunks) of a `greedy_argmax_chunks` function this kernel computes, else None."""
    sch = s_tir.Schedule(func)
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    if [b.name_hint for b in blocks] != ["argmax_chunk", "winner"] or len(func.params) != 2:
        return None
    x, winners = func.params
    if x.dtype != "float32" or winners.dtype != "float32" or len(x.shape) != 3 or len(winners.shape) != 3:
        return None
    rows = x.shape[0]
    one, vocab = (static_int(d) for d in x.shape[1:])
    chunks, two = (static_int(d) for d in winners.shape[1:])
    if not winners.shape[0].same_as(rows) or one != 1 or two != 2 or not vocab or not chunks:
        return None
    if vocab % chunks or [r.source for r in blocks[0].reads] != [x]:
        return None
    return rows, vocab, chunks


@parsed_once(size="rows")
def chunk_argmax(rows, vocab: int, chunks: int) -> tirx.PrimFunc:
    """winners[r, c] = (first index of chunk c's maximum in row r, as float32; the maximum), or
    (-1, the lowest float) where the chunk holds nothing above the lowest float."""
    size = vocab // chunks
    steps, tail = divmod(size, LANES)
    lowest = T.min_value("float32")

    def at_max(x, best, rc, j):
        """Index j of chunk rc (as float32) where it holds the maximum, else the chunk's size."""
        held = x[rc // chunks, 0, rc % chunks * size + j] == best[0]
        return T.Select(held, T.Cast("float32", j), T.float32(size))

    @T.prim_func(private=True)
    def kernel(x: T.Buffer((rows, 1, vocab), "float32"), winners: T.Buffer((rows, chunks, 2), "float32")):
        T.func_attr({"tirx.noalias": True})
        for rc in T.parallel(rows * chunks):
            best = T.alloc_buffer((LANES,), "float32")
            first = T.alloc_buffer((LANES,), "float32")
            for i in T.vectorized(LANES):
                best[i] = lowest
            for j in range(steps):
                for i in T.vectorized(LANES):
                    best[i] = T.max(best[i], x[rc // chunks, 0, rc % chunks * size + j * LANES + i])
            fold16(best, 0, T.max)
            for t in range(tail):
                best[0] = T.max(best[0], x[rc // chunks, 0, rc % chunks * size + steps * LANES + t])
            for i in T.vectorized(LANES):
                first[i] = T.float32(size)
            for j in range(steps):
                for i in T.vectorized(LANES):
                    first[i] = T.min(first[i], at_max(x, best, rc, j * LANES + i))
            fold16(first, 0, T.min)
            for t in range(tail):
                first[0] = T.min(first[0], at_max(x, best, rc, steps * LANES + t))
            winners[rc // chunks, rc % chunks, 0] = T.Select(
                best[0] > lowest, T.Cast("float32", rc % chunks * size) + first[0], T.float32(-1))
            winners[rc // chunks, rc % chunks, 1] = best[0]

    return kernel
