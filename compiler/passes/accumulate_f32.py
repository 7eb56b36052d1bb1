"""AccumulateInFloat32: float16 matmuls sum their products in float32, on every target.

A Relax `matmul` of float16 operands legalizes to a reduction whose accumulator has the output's
dtype: a float16 register wherever the hardware has float16 arithmetic. Over K = 576..14336
products the rounding grows with K: SmolLM2 q0f16 differed from transformers fp32 by 1.55 on an
accelerator (transformers' own fp16, which sums in float32 as the vendor BLAS does: 0.18) and by
0.32 on a host whose code generator kept some partial sums wider (TVM_NOTES). Rewritten here,
before FuseTransposeMatmul / FuseDequantizeMatmul build their kernels:

    y = matmul(a, b)                   ->  y = astype(matmul(a, b, out_dtype="float32"), "float16")
    z = astype(matmul(a, b), float32)  ->  z = matmul(a, b, out_dtype="float32")   (the logits)

TVM's FuseTransposeMatmul turns `out_dtype` into `f32(a) * f32(b)` summed in float32, FuseOps
folds the cast back into the same kernel's epilogue (for quantized weights FuseDequantizeMatmul
takes the cast into its dequantize-matmul group for the same end), and every target's schedule rule keeps its
accumulator in the reduction's dtype: the weights and activations stay float16 in memory, so the
bytes a decode step reads do not change. Norms already reduce in float32 (TOPI's rms_norm,
compiler/passes/fuse_add_rms_norm.py) and so does TVM's paged attention softmax.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from . import rewrite_functions

_MATMUL = tvm.ir.Op.get("relax.matmul")
_ASTYPE = tvm.ir.Op.get("relax.astype")
F16, F32 = "float16", "float32"


def _dtype(expr: relax.Expr) -> str | None:
    return getattr(expr.ty, "dtype", None)


@tvm.transform.module_pass(opt_level=0, name="AccumulateInFloat32")
class AccumulateInFloat32:  # pylint: disable=too-few-public-methods
    """Float16 matmuls accumulate in float32 (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = _Rewriter(mod)
        new = rewriter.run()
        return relax.transform.CanonicalizeBindings()(new) if rewriter.changed else mod


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mod = mod
        self.changed = False

    def run(self) -> tvm.IRModule:
        return rewrite_functions(self, self.mod, prune=True)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if call.op == _MATMUL and all(_dtype(a) == F16 for a in call.args) and _dtype(call) == F16:
            self.changed = True
            wide = self.builder_.emit(relax.op.matmul(*call.args, out_dtype=F32), name_hint="matmul_f32")
            return relax.op.astype(wide, F16)
        if call.op == _ASTYPE and str(call.attrs.dtype) == F32 and isinstance(call.args[0], relax.Var):
            narrowed = self.lookup_binding(call.args[0])
            if isinstance(narrowed, relax.Call) and narrowed.op == _ASTYPE and _dtype(narrowed.args[0]) == F32:
                wide = narrowed.args[0]
                if isinstance(wide, relax.Var) and isinstance(self.lookup_binding(wide), relax.Call) \
                        and self.lookup_binding(wide).op == _MATMUL:
                    return wide                    # f32 -> f16 -> f32 of a matmul: keep the f32 sum
        return call


__all__ = ["AccumulateInFloat32"]
