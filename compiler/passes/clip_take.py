"""ClipTake: every `R.take(x, i, axis, mode="fast")` becomes `mode="clip"`.

nn.Embedding and the logit-position gather emit take in TVM's default "fast" mode, which
reads whatever an out-of-range index points at; TOPI also prints "Warning: Fast mode
segfaults when there are out-of-bounds indices" once per take at legalization, twice per
compile, breaking the progress display. "clip" clamps each index into range: one min/max per
gathered row (the rows themselves dominate the cost), and a corrupted token id can no longer
read outside the table. The runtime still refuses out-of-vocabulary ids before any call.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from . import rewrite_functions

_TAKE = tvm.ir.Op.get("relax.take")


@mutator
class _Clip(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if call.op.same_as(_TAKE) and call.attrs.mode == "fast":
            return relax.op.take(call.args[0], call.args[1], call.attrs.axis, mode="clip")
        return call


@tvm.transform.module_pass(opt_level=0, name="ClipTake")
class ClipTake:
    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_functions(_Clip(mod), mod)
