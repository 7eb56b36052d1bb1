"""A matmul whose cast sums feed a gated activation (the gate-up projection under a `glu_epilogue`
profile, compiler/passes/fuse_dequantize_matmul.py): its row branches and the two kernels above them.

The MMA GEMV computes the activation as its epilogue at 1-16 rows (targets/mma_gemv.py `epilogue`);
no other rule does (dlight's tiled matmul asserts on a consumer it cannot inline). Above the GEMV's
rows, or where it does not apply, the function runs as it did unfused: `apart` splits it into its
head (dequantize, matmul, cast: the usual row branches) and its tail (the activation over the cast
sums, one elementwise kernel), and `joined` makes them one function again, two kernels, the cast
sums between them a workspace output (targets/workspace_outputs.py: Relax plans it, a CUDA graph
replays over it).
"""

from __future__ import annotations

from tvm import s_tir, tirx

from .dequant_match import HEAD
from .workspace_outputs import WORKSPACE_ATTR, workspace_count


def apart(func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, tirx.PrimFunc, tirx.Buffer] | None:
    """(head, tail, sums) where `func` is dequantize -> NT_matmul -> cast -> blocks after it, each a
    loop nest of its own at the root: head computes the cast `sums` (its output, func's other inputs),
    tail the rest from them (func's output); else None."""
    parts = split_at(func, 3)
    if parts is None or tuple(b.name_hint for b in parts[3][:2]) != HEAD or not func.params:
        return None
    head, tail, sums, _ = parts
    if not tail.params[-1].same_as(func.params[-1]) or any(p.same_as(func.params[-1]) for p in head.params):
        return None
    return head, tail, sums


def split_at(func: tirx.PrimFunc, at: int):
    """(head, tail, between, blocks) where `func`'s root holds loop nests of one block each, more than
    `at`, and exactly one buffer it allocates (`between`) is written by the first `at` and read by the
    rest: head computes those (params: func's that they use, in func's order, then `between`), tail
    the rest (params: `between`, then func's that they use); else None. `blocks`: the nests' blocks."""
    if not isinstance(func, tirx.PrimFunc) or not isinstance(func.body, s_tir.SBlockRealize):
        return None
    root = func.body.block
    nests = list(root.body) if isinstance(root.body, tirx.SeqStmt) else []
    blocks = [_only_block(nest) for nest in nests]
    if len(nests) <= at or any(b is None for b in blocks):
        return None

    def touched(part):
        return [r.source for b in part for r in (*b.reads, *b.writes)]

    def among(buffer, buffers):
        return any(buffer.same_as(b) for b in buffers)

    written = [w.source for b in blocks[:at] for w in b.writes]
    crossing = [a for a in root.alloc_buffers if among(a, written) and among(a, touched(blocks[at:]))]
    if len(crossing) != 1 or any(among(p, written) and among(p, touched(blocks[at:])) for p in func.params):
        return None
    between = crossing[0]
    head_allocs = [a for a in root.alloc_buffers if among(a, touched(blocks[:at])) and not a.same_as(between)]
    tail_allocs = [a for a in root.alloc_buffers if not among(a, head_allocs) and not a.same_as(between)]
    head = _function([p for p in func.params if among(p, touched(blocks[:at]))] + [between], nests[:at], head_allocs)
    tail = _function([between] + [p for p in func.params if among(p, touched(blocks[at:]))], nests[at:], tail_allocs)
    return head, tail, between, blocks


def joined(func: tirx.PrimFunc, head: tirx.PrimFunc, tail: tirx.PrimFunc, between: tirx.Buffer) -> tirx.PrimFunc:
    """One function over func's params running the scheduled `head`, then the scheduled `tail`, as
    two kernels: head's and tail's workspace outputs, then `between` (what head writes for tail),
    trail func's params as workspace."""
    extra = [p for part in (head, tail) for p in part.params[len(part.params) - workspace_count(part):]
             if workspace_count(part)]
    body = tirx.SeqStmt([head.body, tail.body])
    root = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "root", body))
    out = tirx.PrimFunc([*func.params, *extra, between], root, func.ret_type, func.attrs)
    return out.with_attr(WORKSPACE_ATTR, len(extra) + 1).with_attr("tirx.is_scheduled", True)


def _only_block(nest) -> s_tir.SBlock | None:
    """The one block of a loop nest (loops, then a block realize), or None."""
    while isinstance(nest, tirx.For):
        nest = nest.body
    return nest.block if isinstance(nest, s_tir.SBlockRealize) else None


def _function(params, nests, allocs) -> tirx.PrimFunc:
    body = nests[0] if len(nests) == 1 else tirx.SeqStmt(nests)
    root = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "root", body, alloc_buffers=allocs))
    return tirx.PrimFunc(params, root).with_attr("tirx.noalias", True)


__all__ = ["apart", "joined", "split_at"]
