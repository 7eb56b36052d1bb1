"""FuseAddRMSNorm: a residual add and the RMSNorm over its sum become one kernel with two outputs.

Matches, in every Relax function (graph phase, before legalization)::

    y = R.add(x, r)                                   # the residual stream
    n = R.nn.rms_norm(y, w, axes=[-1], epsilon=eps)   # the next sub-layer's input

when x, r and y share one shape whose last axis (the normalised one) is static and w is that
axis: the pre-norm decoder layer's ``x = x + attn(norm(x)); x = x + mlp(norm(x))``, and the
final norm over the last layer's sum. That sum is used by the norm alone; it is matched too
(the kernel writes it, unread): FuseOps leaves an add feeding a reduction in a kernel of its own,
so the final norm was two kernels in every entry function (seen in a build, 2026-11-27).

Emits one ``R.call_tir`` to a TE-built PrimFunc ``fuse_add_rms_norm`` returning ``(y, n)``,
per row: ``y = x + r``; ``ss = sum(f32(y)^2)``; ``inv = rsqrt(ss / h + eps)``;
``n = inv * f32(y) * f32(w)`` -- the stages and arithmetic of TVM's legalized rms_norm, so the
results are bit-identical.  A target's AddRMSNorm rule schedules it: one
parallel loop over the rows, the vectorised add, sum of squares (rfactor) and scale all computed
at the row, ``inv`` once per row.

Why it pays: the row of y is written once and read back from L1 by the reduction and the scale,
instead of one kernel writing y and the next reading it from memory; on targets where the add
is not already fused into the matmul epilogue it also saves a kernel launch.  TVM 0.27 ships no
such pass (none in relax.transform; dlight's RMSNorm rule schedules a plain rms_norm only, for
thread-parallel devices); MLC-LLM's is a hand-written thread-block kernel for fp16/bf16 only, so this
one is written in TE and left to the target's schedule rules.

Measured on SmolLM2-135M q0f32, 2-core znver5 shared with other jobs (artifacts compiled back to
back, decode steps after a 128-token prompt, interleaved rounds, per-round time ratio with/without,
median [IQR]): decode batch 1 0.96 [0.95-1.00], batch 4 0.95 [0.94-0.96], prefill 128 1.00 --
neutral to a few percent.  On that pipeline FuseOps would otherwise fold the add into the
o_proj/down_proj matmul as an epilogue, so the fused kernel replaces rms_norm one for one (same
launch count), and all rms_norm kernels together take ~1% of a decode step and 0.3% of a prefill.
Where the add is a kernel of its own (a matmul fused by pattern, without epilogue) it saves a
launch and a pass over the hidden state per norm.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, te, tirx
from tvm.relax.expr_functor import PyExprMutator, PyExprVisitor, mutator, visitor

_ADD = tvm.ir.Op.get("relax.add")
_RMS_NORM = tvm.ir.Op.get("relax.nn.rms_norm")


@tvm.transform.module_pass(opt_level=0, name="FuseAddRMSNorm")
class FuseAddRMSNorm:
    """Rewrite ``rms_norm(add(x, r), w)`` into one two-output TIR call."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return _Rewriter(mod).run()


def add_rms_norm_te(x: te.Tensor, r: te.Tensor, w: te.Tensor, eps: float) -> list[te.Tensor]:
    """y = x + r and rms_norm(y, w) over the last axis, staged like topi.nn.rms_norm."""
    *rows, h = x.shape                                                          # x, r: [..rows, h]
    h_f32, eps_f32 = tirx.const(float(int(h)), "float32"), tirx.const(eps, "float32")
    y = te.compute(x.shape, lambda *i: x(*i) + r(*i), name="T_add")
    k = te.reduce_axis((0, h), name="k")
    ss = te.compute(rows, lambda *i: te.sum(y(*i, k).astype("float32") * y(*i, k).astype("float32"), axis=k),
                    name="T_multiply_red")                                    # [..rows]
    inv = te.compute(rows, lambda *i: tirx.rsqrt(ss(*i) / h_f32 + eps_f32), name="rsqrt")
    out = te.compute(x.shape, lambda *i: (inv(*i[:-1]) * y(*i).astype("float32")
                                          * w(i[-1]).astype("float32")).astype(x.dtype), name="T_rms_norm")
    return [y, out]


@visitor
class _UseCounter(PyExprVisitor):
    def __init__(self) -> None:
        self.uses: dict = {}

    def visit_var_(self, var: relax.Var) -> None:
        self.uses[var] = self.uses.get(var, 0) + 1

    def visit_dataflow_var_(self, var: relax.DataflowVar) -> None:
        self.uses[var] = self.uses.get(var, 0) + 1


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mod = mod
        self.uses: dict = {}

    def run(self) -> tvm.IRModule:
        for gv, func in self.mod.functions_items():
            if isinstance(func, relax.Function):
                counter = _UseCounter()
                counter.visit_expr(func)
                self.uses = counter.uses
                new_func = relax.analysis.remove_all_unused(self.visit_expr(func))
                self.builder_.update_func(gv, new_func)
        return self.builder_.finalize()

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        match = self._match(call)
        if match is None:
            return call
        y_var, x, r, w = match
        out = self.builder_.emit_te(add_rms_norm_te, x, r, w, float(call.attrs.epsilon),
                                    primfunc_name_hint="fuse_add_rms_norm")
        y_new = relax.TupleGetItem(out, 0)
        # y lives on past the norm; outside a dataflow block (or as its output) it must stay a Var.
        keep_var = not isinstance(y_var, relax.DataflowVar) and self.builder_.current_block_is_dataflow()
        emit = self.builder_.emit_output if keep_var else self.builder_.emit
        y_new = emit(y_new, name_hint=y_var.name)
        self.set_var_remap(y_var, y_new)
        return relax.TupleGetItem(out, 1)

    def _match(self, call: relax.Call):
        """(y, x, r, w) when ``call`` is rms_norm over the last axis of a reused add, else None."""
        if call.op != _RMS_NORM or not isinstance(call.args[0], relax.Var):
            return None
        y_var, w = call.args
        add = self.lookup_binding(y_var)
        if not isinstance(add, relax.Call) or add.op != _ADD:
            return None
        x, r = add.args
        shapes = [getattr(e.ty, "shape", None) for e in (x, r, y_var)]
        if any(not isinstance(s, relax.ShapeExpr) for s in shapes) or len({e.ty.dtype for e in (x, r)}) != 1:
            return None
        if not all(tvm_ffi.structural_equal(shapes[0], s) for s in shapes[1:]):
            return None  # broadcasting add
        ndim, h = len(shapes[0].values), shapes[0].values[-1]
        axes = [int(a) % ndim for a in call.attrs.axes]
        w_shape = getattr(w.ty, "shape", None)
        if axes != [ndim - 1] or not isinstance(h, tirx.IntImm) or not isinstance(w_shape, relax.ShapeExpr) \
                or len(w_shape.values) != 1 or not tvm_ffi.structural_equal(w_shape.values[0], h):
            return None
        return y_var, x, r, w
