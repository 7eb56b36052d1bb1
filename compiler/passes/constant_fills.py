"""ConstantFills: `R.ones`, `R.zeros` and `R.full` of a static shape become the constant they make.

Models write such fills where a weightless RMSNorm takes a weight of ones (nanochat, Llama 4's q/k
norms, Mamba's gated norm), or a clamp takes its bound as a tensor (gpt-oss). Left as ops, TVM's
FoldConstant folds each after legalization by building its TIR kernel and running it:
1.6 s of nanochat's tiny-model compile (2 vCPUs), 0.9 s of Llama 4's. numpy makes the same constant
at once. Fills over a symbolic shape, a fill value that is not a constant, or a dtype numpy cannot
make stay ops.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from . import rewrite_functions

# each fill op and its value (None: relax.full's second argument)
_FILLS = ((tvm.ir.Op.get("relax.ones"), 1), (tvm.ir.Op.get("relax.zeros"), 0), (tvm.ir.Op.get("relax.full"), None))
MAX_VALUES = 1 << 24          # a larger fill stays an op (a constant is stored in the module)


def _static_shape(expr) -> tuple[int, ...] | None:
    if not isinstance(expr, relax.ShapeExpr):
        return None
    dims = [d.value if isinstance(d, tvm.tirx.IntImm) else None for d in expr.values]
    return None if None in dims else tuple(dims)


@mutator
class _Fold(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        fill_op = next(((op, value) for op, value in _FILLS if call.op.same_as(op)), None)
        if fill_op is None:
            return call
        shape, value = _static_shape(call.args[0]), fill_op[1]
        if value is None:
            fill = getattr(call.args[1], "value", None) if isinstance(call.args[1], tvm.ir.expr.Constant) else None
            if not hasattr(fill, "numpy") or fill.numpy().size != 1:
                return call
            value = fill.numpy().reshape(())
        try:
            dtype = np.dtype(str(call.attrs.dtype))
        except TypeError:
            return call
        if shape is None or math.prod(shape) > MAX_VALUES:
            return call
        return relax.const(np.full(shape, value, dtype), str(dtype))


@tvm.transform.module_pass(opt_level=0, name="ConstantFills")
class ConstantFills:
    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_functions(_Fold(mod), mod)
