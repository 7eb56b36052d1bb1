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

With `glu_epilogue` (a target profile's), in batch_decode (GLU_ENTRIES) the gated activation
computed from such a matmul's cast output joins its group too, the gate-up projection's::

    y = <the matmul above, cast>;  g, u = R.split(y, 2, axis=-1);  a = R.multiply(R.nn.silu(g), u)

so the fused PrimFunc writes silu(g) * u, not gate and up: one kernel a layer fewer where the GEMV
computes it as its epilogue (targets/mma_gemv.py `epilogue`: a tile's 8 gate rows beside the same
outputs' 8 up rows); above the GEMV's rows it runs as two kernels (targets/glu_epilogue.py).

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
from tvm.relax.dpl.pattern import GlobalVarPattern, TuplePattern, is_op, is_tuple_get_item, wildcard

PATTERN_NAME = "kiln.dequantize_matmul"
GLU_PATTERN_NAME = "kiln.dequantize_matmul_glu"
GLU_ENTRIES = ("batch_decode",)      # where the gated activation joins the gate-up projection's group


def is_call_tir_to(expr: relax.Expr, prefix: str) -> bool:
    """Whether expr is R.call_tir of a PrimFunc whose name starts with prefix (kiln's quantized
    modules name their ops `dequantize_<kind>`; FuseTransposeMatmul names its `NT_matmul`)."""
    if not isinstance(expr, relax.Call) or not expr.args:
        return False
    callee = expr.args[0]
    return isinstance(callee, relax.GlobalVar) and callee.name_hint.startswith(prefix)


def _pattern(cast: bool, glu: bool = False):
    """dequantize -> NT matmul, and with `cast` the float32 -> float16 cast after it that
    AccumulateInFloat32 adds (in the group it is the kernel's epilogue, not a kernel of its own
    reading the float32 sums back from memory); with `glu` then silu(g) * u of its output's halves."""
    x, planes = wildcard(), wildcard()
    deq = is_op("relax.call_tir")(GlobalVarPattern(), planes, add_constraint=False)
    matmul = is_op("relax.call_tir")(GlobalVarPattern(), TuplePattern([x, deq]), add_constraint=False)
    sums = is_op("relax.astype")(matmul) if cast else matmul
    annotations = {"x": x, "deq": deq, "matmul": matmul}
    if glu:
        parts = is_op("relax.split")(sums)
        root = is_op("relax.multiply")(is_op("relax.nn.silu")(is_tuple_get_item(parts, 0)), is_tuple_get_item(parts, 1))
        annotations["parts"] = parts
    else:
        root = sums
    annotations["root"] = root

    def check(ctx: relax.transform.PatternCheckContext) -> bool:
        return (is_call_tir_to(ctx.annotated_expr["deq"], "dequantize_")
                and is_call_tir_to(ctx.annotated_expr["matmul"], "NT_matmul")
                and (not glu or (_halves(ctx.annotated_expr["parts"]) and _used_within(ctx))))

    return root, annotations, check


def _halves(split: relax.Call) -> bool:
    """Whether `split` cuts its last axis in two halves."""
    sections, axis = split.attrs.indices_or_sections, int(split.attrs.axis)
    return isinstance(sections, tvm.tirx.IntImm) and int(sections) == 2 and axis in (-1, split.args[0].ty.ndim - 1)


def _used_within(ctx: relax.transform.PatternCheckContext) -> bool:
    """Whether every matched value but the root is used by matched bindings alone (nothing outside
    the group reads the sums or a half)."""
    root = ctx.value_to_bound_var.get(ctx.annotated_expr["root"])
    inside = list(ctx.matched_bindings.keys())
    return all(var.same_as(root) or all(any(user.same_as(v) for v in inside) for user in ctx.var_usages.get(var, []))
               for var in inside)


@tvm.transform.module_pass(opt_level=0, name="FuseDequantizeMatmul")
class FuseDequantizeMatmul:  # pylint: disable=too-few-public-methods
    """Group dequantize -> NT matmul into one Primitive function (see the module docstring)."""

    def __init__(self, glu_epilogue: bool = False) -> None:
        self.glu_epilogue = glu_epilogue

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mod = _without_leftovers(relax.transform.FuseTransposeMatmul()(mod))
        if self.glu_epilogue:
            glu = [(GLU_PATTERN_NAME, *_pattern(cast=True, glu=True))]
            mod = _in_functions(mod, GLU_ENTRIES, relax.transform.FuseOpsByPattern(glu, bind_constants=False))
        patterns = [(PATTERN_NAME, *_pattern(cast=True)), (PATTERN_NAME, *_pattern(cast=False))]
        return relax.transform.FuseOpsByPattern(patterns, bind_constants=False)(mod)


def _in_functions(mod: tvm.IRModule, names, transform) -> tvm.IRModule:
    """mod with `transform` applied to its Relax functions named in `names` alone (the others as they
    were; the functions it adds, added)."""
    part = tvm.IRModule({gv: f for gv, f in mod.functions_items()
                         if not isinstance(f, relax.Function) or gv.name_hint in names},
                        attrs=mod.attrs, global_infos=mod.global_infos)
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)
    for gv, func in transform(part).functions_items():
        out[gv] = func
    return out


def _without_leftovers(mod: tvm.IRModule) -> tvm.IRModule:
    """Drop the grouped functions FuseTransposeMatmul matched and then replaced (never called)."""
    dead = [gv for gv, f in mod.functions_items()
            if isinstance(f, relax.Function) and f.attrs is not None
            and f.attrs.get("Composite") == "transpose_matmul_fuse"]
    for gv in dead:
        del mod[gv]
    return mod


__all__ = ["FuseDequantizeMatmul", "GLU_ENTRIES", "GLU_PATTERN_NAME", "PATTERN_NAME", "is_call_tir_to"]
