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
    if not isinstance(func, tirx.PrimFunc) or not isinstance(func.body, s_tir.SBlockRealize):
        return None
    root = func.body.block
    nests = list(root.body) if isinstance(root.body, tirx.SeqStmt) else []
    blocks = [_only_block(nest) for nest in nests]
    if len(nests) < 4 or any(b is None for b in blocks) or tuple(b.name_hint for b in blocks[:2]) != HEAD:
        return None
    if len(blocks[2].writes) != 1 or not func.params:
        return None
    sums = blocks[2].writes[0].source
    out = func.params[-1]
    written = [w.source for b in blocks[3:] for w in b.writes]
    if not any(b.same_as(out) for b in written) or any(w.source.same_as(out) for b in blocks[:3] for w in b.writes):
        return None
    head_allocs = [b for b in root.alloc_buffers if any(w.source.same_as(b) for blk in blocks[:3] for w in blk.writes)
                   and not b.same_as(sums)]
    tail_allocs = [b for b in root.alloc_buffers if not any(b.same_as(a) for a in head_allocs) and not b.same_as(sums)]
    if not any(b.same_as(sums) for b in root.alloc_buffers):
        return None
    head = _function([*func.params[:-1], sums], nests[:3], head_allocs)
    tail = _function([sums, out], nests[3:], tail_allocs)
    return head, tail, sums


def joined(func: tirx.PrimFunc, head: tirx.PrimFunc, tail: tirx.PrimFunc, sums: tirx.Buffer) -> tirx.PrimFunc:
    """One function over func's params running the scheduled `head`, then the scheduled `tail`, as
    two kernels: head's workspace outputs, then the cast `sums`, trail func's params as workspace."""
    extra = list(head.params[len(head.params) - workspace_count(head):]) if workspace_count(head) else []
    body = tirx.SeqStmt([head.body, tail.body])
    root = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "root", body))
    out = tirx.PrimFunc([*func.params, *extra, sums], root, func.ret_type, func.attrs)
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


__all__ = ["apart", "joined"]
