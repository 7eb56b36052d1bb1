"""FuseDequantizeMatmul: one kernel per quantized Linear instead of dequantize + matmul.

Matches (in Relax dataflow blocks, before legalization):

    w = R.call_tir(dequantize_<kind>, (qweight, scale[, min]))   # W [N, K] from its planes
    y = R.call_tir(NT_matmul, (x, w))                             # y = x @ W.T
    z = R.astype(y, "float16")                                    # if there (AccumulateInFloat32)

and also `R.matmul(x, R.permute_dims(w))` on such a `w` (it runs FuseTransposeMatmul
first, which rewrites that form into the NT_matmul call above).

Emits a private Relax function with the attributes {"Primitive": True, "Composite":
"kiln.dequantize_matmul"} holding both calls, called in their place; FuseTIR then merges
it into one PrimFunc whose dequantize block feeds the matmul block.

Why it pays: FuseOps does not fuse an injective producer into a matmul (TVM_NOTES), so
without this pass every call dequantizes the whole weight to a float [N, K] buffer in
memory (4 bytes per weight written and read back, 8x the 4-bit planes) before the matmul
reads it. Fused, the target's quantized-matmul schedule rule decodes the weights in
registers (one-row GEMV) or one small L1-resident tile at a time (matmul), so decode
streams only the 4-bit planes.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl.pattern import GlobalVarPattern, TuplePattern, is_op, wildcard

PATTERN_NAME = "kiln.dequantize_matmul"


def is_call_tir_to(expr: relax.Expr, prefix: str) -> bool:
    """Whether expr is R.call_tir of a PrimFunc whose name starts with prefix (kiln's quantized
    modules name their ops `dequantize_<kind>`; FuseTransposeMatmul names its `NT_matmul`)."""
    if not isinstance(expr, relax.Call) or not expr.args:
        return False
    callee = expr.args[0]
    return isinstance(callee, relax.GlobalVar) and callee.name_hint.startswith(prefix)


def _pattern(cast: bool):
    """dequantize -> NT matmul, and with `cast` the float32 -> float16 cast after it that
    AccumulateInFloat32 adds (in the group it is the kernel's epilogue, not a kernel of its own
    reading the float32 sums back from memory)."""
    x, planes = wildcard(), wildcard()
    deq = is_op("relax.call_tir")(GlobalVarPattern(), planes, add_constraint=False)
    matmul = is_op("relax.call_tir")(GlobalVarPattern(), TuplePattern([x, deq]), add_constraint=False)
    root = is_op("relax.astype")(matmul) if cast else matmul

    def check(ctx: relax.transform.PatternCheckContext) -> bool:
        return (is_call_tir_to(ctx.annotated_expr["deq"], "dequantize_")
                and is_call_tir_to(ctx.annotated_expr["matmul"], "NT_matmul"))

    return root, {"x": x, "deq": deq, "matmul": matmul, "root": root}, check


@tvm.transform.module_pass(opt_level=0, name="FuseDequantizeMatmul")
class FuseDequantizeMatmul:  # pylint: disable=too-few-public-methods
    """Group dequantize -> NT matmul into one Primitive function (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mod = _without_leftovers(relax.transform.FuseTransposeMatmul()(mod))
        patterns = [(PATTERN_NAME, *_pattern(cast=True)), (PATTERN_NAME, *_pattern(cast=False))]
        return relax.transform.FuseOpsByPattern(patterns, bind_constants=False)(mod)


def _without_leftovers(mod: tvm.IRModule) -> tvm.IRModule:
    """Drop the grouped functions FuseTransposeMatmul matched and then replaced (never called)."""
    dead = [gv for gv, f in mod.functions_items()
            if isinstance(f, relax.Function) and f.attrs is not None
            and f.attrs.get("Composite") == "transpose_matmul_fuse"]
    for gv in dead:
        del mod[gv]
    return mod


__all__ = ["FuseDequantizeMatmul", "PATTERN_NAME", "is_call_tir_to"]
