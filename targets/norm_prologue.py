"""A quantized matmul whose activations are a residual add + RMSNorm's (compiler/passes/fuse_norm_matmul.py,
profile `norm_prologue`): recognising it, the MMA GEMV that computes the norm as its prologue, and the
two kernels it runs as elsewhere.

The function's first four blocks are the fused add + RMSNorm's (compiler/passes/fuse_add_rms_norm.py:
T_add writing the sum y, an output; T_multiply_red; rsqrt; T_rms_norm writing the norm n), the rest
a dequantize-matmul of n (targets/dequant_match.py, with or without an epilogue). `match_norm` checks
each block's value against what that pass emits (so the kernel's arithmetic is the function's), and
gives the function split in two (glu_epilogue.split_at): the norm (head) and the matmul (tail).

The MMA GEMV takes it at 1 to NORM_ROWS rows (targets/mma_gemv.py `norm`: each block stages the
normalised rows in shared memory, NORM_ROWS x K float16 at most STAGE_BYTES); above them, or where it
does not apply, head and tail run as the two kernels they were, n a workspace output between them
(targets/gpu.py LowBatchGEMV).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm_ffi import structural_equal

from .add_rms_norm import gpu_row_split
from .dequant_match import EPILOGUES, match_dequant_matmul, param_order, root_blocks
from .glu_epilogue import split_at
from .q4_gemv import gemv_rows, placed_kernel
from .row_dispatch import static_int

NORM_HEAD = ("T_add", "T_multiply_red", "rsqrt", "T_rms_norm")
NORM_ROWS = 4                   # rows the MMA GEMV's prologue stages at most
STAGE_BYTES = 40 * 1024         # the staged rows' shared memory at most (48 KB a block without opting in)


@dataclass(frozen=True)
class AddNorm:
    x: tirx.Buffer              # the add's operands [rows, 1, K]
    r: tirx.Buffer
    w: tirx.Buffer              # the norm's weight [K]
    y: tirx.Buffer              # the sum x + r, an output of the function
    eps: float
    head: tirx.PrimFunc         # the add + norm alone (params x, r, w, y, n)
    tail: tirx.PrimFunc         # the matmul of n (params n, then its own)
    normed: tirx.Buffer         # n


def has_norm(func) -> bool:
    """Whether `func`'s first blocks are named as the fused add + RMSNorm's, with blocks after them
    (what the norm-taking rules look at closer)."""
    if not isinstance(func, tirx.PrimFunc) or not isinstance(func.body, s_tir.SBlockRealize):
        return False
    names = tuple(b.name_hint for b in root_blocks(func)[2])
    return len(names) > len(NORM_HEAD) and names[:len(NORM_HEAD)] == NORM_HEAD


def match_norm(func) -> AddNorm | None:
    """The add + norm ahead of `func`'s other blocks, computed as fuse_add_rms_norm.add_rms_norm_te does
    over [rows, 1, K] float16 rows, and the function split after it; else None."""
    if not has_norm(func):
        return None
    parts = split_at(func, len(NORM_HEAD))
    if parts is None:
        return None
    head, tail, normed, blocks = parts
    add, red, rsqrt, scale = blocks[:len(NORM_HEAD)]
    y = add.writes[0].source
    if len(add.reads) != 2 or not any(y.same_as(p) for p in func.params) or len(y.shape) != 3:
        return None
    x, r = (b.source for b in add.reads)
    k = static_int(y.shape[2])
    a0, a1, a2 = (iv.var for iv in add.iter_vars)
    if k is None or y.dtype != "float16" or not structural_equal(add.body.value, x[a0, a1, a2] + r[a0, a1, a2]):
        return None
    ss = red.writes[0].source
    s0, s1, sk = (iv.var for iv in red.iter_vars)
    square = y[s0, s1, sk].astype("float32") * y[s0, s1, sk].astype("float32")
    if not structural_equal(red.body.value, ss[s0, s1] + square):
        return None
    inv = rsqrt.writes[0].source
    q0, q1 = (iv.var for iv in rsqrt.iter_vars)
    value = rsqrt.body.value
    eps = getattr(getattr(getattr(value, "args", [None])[0], "b", None), "value", None)
    if eps is None or not structural_equal(
            value, tirx.rsqrt(ss[q0, q1] / tirx.const(float(k), "float32") + tirx.const(eps, "float32"))):
        return None
    w = next((b.source for b in scale.reads if len(b.source.shape) == 1), None)
    n0, n1, n2 = (iv.var for iv in scale.iter_vars)
    want = (inv[n0, n1] * y[n0, n1, n2].astype("float32") * w[n2].astype("float32")).astype("float16") \
        if w is not None else None
    if w is None or w.dtype != "float16" or not scale.writes[0].source.same_as(normed) \
            or not structural_equal(scale.body.value, want):
        return None
    return AddNorm(x, r, w, y, float(eps), head, tail, normed)


def apply_norm_matched(func, target, batch: int, build, kind: str = "q4"):
    """What a norm-taking GEMV rule gives (q4_gemv.apply_matched's contract) for a function whose
    norm match_norm finds, its matmul kiln's `kind` dequantize-matmul of the norm (an EPILOGUES
    epilogue allowed), at 1 to NORM_ROWS rows within STAGE_BYTES: build(n, k, out_dtype, count,
    epilogue=, norm=eps, norm_rows=batch, norm_split=the AddRMSNorm rule's split of a row) with the
    kernel's params (W, S, X, Y, R, WN, YR) where func has them; else None."""
    if not isinstance(func, tirx.PrimFunc) or target.kind.name != "cuda" or not 1 <= batch <= NORM_ROWS:
        return None
    found = match_norm(func)
    if found is None:
        return None
    m = match_dequant_matmul(found.tail, "float16", kinds=(kind,), epilogues=tuple(EPILOGUES))
    one = gemv_rows(m, batch) if m is not None and m.x.same_as(found.normed) else None
    if one is None or batch * m.k * 2 > STAGE_BYTES:
        return None
    order = param_order(func, m, x=found.x, more=(found.r, found.w, found.y))
    if order is None:
        return None
    split = gpu_row_split(m.k, 16, int(target.max_num_threads))          # the norm kernel's, copied
    kernel = build(m.n, m.k, str(m.out.dtype), None if one else m.rows, epilogue=m.epilogue, norm=found.eps,
                   norm_rows=batch, norm_split=split)
    return placed_kernel(func, kernel, order, one)


__all__ = ["AddNorm", "NORM_ROWS", "apply_norm_matched", "has_norm", "match_norm"]
