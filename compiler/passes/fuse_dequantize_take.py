"""FuseDequantizeTake: the quantized embedding gather dequantizes only the rows it gathers.

Matches (in Relax dataflow blocks, before legalization):

    table = R.call_tir(dequantize_<kind>, (qweight, scale[, min]))   # [vocab, hidden]
    rows  = R.take(table, ids, axis=0)                                # [n, hidden]

Emits a private Relax function with the attributes {"Primitive": True, "Composite":
"kiln.dequantize_take"} holding both, called in their place; after LegalizeOps and
FuseTIR it is one PrimFunc, and an elementwise schedule rule inlines the dequantize block
into the gather, so out[i, d] = dequantize(planes[ids[i], d]).

Why it pays: unfused, every `embed` call dequantizes the whole table (SmolLM2: 49152 x 576,
113 MB of float32 written for a handful of tokens, ~10 ms) before picking its rows;
fused, it decodes n x hidden values.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl.pattern import GlobalVarPattern, is_op, wildcard

from .fuse_dequantize_matmul import is_call_tir_to

PATTERN_NAME = "kiln.dequantize_take"


def _pattern():
    ids, planes = wildcard(), wildcard()
    deq = is_op("relax.call_tir")(GlobalVarPattern(), planes, add_constraint=False)
    take = is_op("relax.take")(deq, ids)

    def check(ctx: relax.transform.PatternCheckContext) -> bool:
        call = ctx.annotated_expr["take"]
        axis = call.attrs.axis
        return is_call_tir_to(ctx.annotated_expr["deq"], "dequantize_") and axis is not None and int(axis) == 0

    return take, {"ids": ids, "deq": deq, "take": take}, check


@tvm.transform.module_pass(opt_level=0, name="FuseDequantizeTake")
class FuseDequantizeTake:  # pylint: disable=too-few-public-methods
    """Group dequantize -> take(axis=0) into one Primitive function (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return relax.transform.FuseOpsByPattern([(PATTERN_NAME, *_pattern())], bind_constants=False)(mod)


__all__ = ["FuseDequantizeTake", "PATTERN_NAME"]
