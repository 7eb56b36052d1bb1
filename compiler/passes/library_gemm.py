"""LibraryGEMM: the prompt's matmuls of `batch_prefill_gemm` through the device's BLAS.

Matches, in the function named LIBRARY_GEMM_ENTRY only (graph phase, after FuseTransposeMatmul,
before FuseDequantizeMatmul)::

    y = R.call_tir(NT_matmul, (x, w))       # x [1, seq_len, K], w [N, K]: y = x @ w.T
    z = R.astype(y, x.dtype)                 # if y sums in float32 (AccumulateInFloat32)

where w is a weight (a parameter, or a dequantize call's output: that call stays, now a kernel of
its own writing the float weight) and x, w and z share one dtype, and replaces it with

    z = R.call_dps_packed("kiln.gemm_nt", (x, w), out_ty=z's)

which the runtime registers (runtime/library_gemm.py: torch's matmul, the vendor BLAS of the device,
summing in float32 and rounding once). Only matmuls over the call's tokens (rows `seq_len`): the logits of
the few gathered positions stay TVM's (dequantizing a large vocabulary's weight would cost more).

A dequantized weight is then lifted out of the entry: each dequantize call of parameters only, that
feeds such a matmul, moves into a function of its own, LIBRARY_GEMM_WEIGHTS(params) -> (w0, w1, ...),
and the entry takes that tuple as a last parameter (after the params, so RewriteCUDAGraph counts it
static), reading w_i where it dequantized. The runtime calls the weights function once at load and
keeps its tensors (runtime/model_runner.py: where they fit beside the KV cache), so a forward pays
no dequantization. A scheme that stores float weights lifts nothing: the tuple is empty.

Why: on an H100 (2026-11-27) a 16 x 128-token prefill of the 8B model spent 138 of its 168 ms of
device time in matmuls on dlight's wmma tiles (~210 TFLOP/s), where transformers' prefill of the
same model (the vendor BLAS) took ~72 ms in all; TVM 0.27's Hopper matmuls (its new tile-primitive
backend) are not in reach of kiln's pipeline, and the PyPI build links no BLAS. The weight is
dequantized once a call (for the 8B, ~1 GB of float16 written and read a layer's worth at a time:
~11 ms a forward at 3 TB/s) when it was dequantized in the forward; kept from the load, the
BLAS's float16 weights take 2 bytes a value (16 GB for an 8B model) beside the 4-bit ones, and the
forward reads 4x the bytes of a 4-bit matmul, so the runtime takes the entry only from
runtime/library_gemm.py's MIN_TOKENS a forward, and batch_prefill below.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from kiln.runtime.contract import GEMM_PACKED_FUNC, LIBRARY_GEMM_ENTRY, LIBRARY_GEMM_WEIGHTS

from . import rewrite_functions
from .fuse_dequantize_matmul import is_call_tir_to

_ASTYPE = tvm.ir.Op.get("relax.astype")
ROWS_VAR = "seq_len"            # the spec's name for a forward's tokens (compiler/spec.py)


@tvm.transform.module_pass(opt_level=0, name="LibraryGEMM")
class LibraryGEMM:  # pylint: disable=too-few-public-methods
    """Route LIBRARY_GEMM_ENTRY's token matmuls to GEMM_PACKED_FUNC (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if LIBRARY_GEMM_ENTRY not in [gv.name_hint for gv in mod.get_global_vars()]:
            return mod
        return lift_weights(rewrite_functions(_Rewriter(mod), mod, only=LIBRARY_GEMM_ENTRY, prune=True))


_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_CALL_DPS_PACKED = tvm.ir.Op.get("relax.call_dps_packed")


def lift_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """LIBRARY_GEMM_ENTRY's dequantized BLAS weights computed by LIBRARY_GEMM_WEIGHTS instead, and
    passed to the entry as its last parameter (see the module docstring)."""
    gv = mod.get_global_var(LIBRARY_GEMM_ENTRY)
    func = mod[gv]
    params = func.params[-1]                                # the packed weights tuple, after the inputs
    bindings = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    items = {var: int(v.index) for var, v in bindings.items()
             if isinstance(v, relax.TupleGetItem) and v.tuple_value.same_as(params)}
    lifted: list[relax.Var] = []
    for value in bindings.values():
        if isinstance(value, relax.Call) and value.op.same_as(_CALL_DPS_PACKED) \
                and value.args[0].global_symbol == GEMM_PACKED_FUNC:
            w = value.args[1].fields[1]
            source = bindings.get(w)
            if w not in lifted and isinstance(source, relax.Call) and source.op.same_as(_CALL_TIR) \
                    and len(source.args) == 2 and all(a in items for a in source.args[1].fields):
                lifted.append(w)

    weights = relax.Var("gemm_weights", relax.TupleType([w.ty for w in lifted]))
    slot = {w: j for j, w in enumerate(lifted)}
    blocks = [type(block)([relax.VarBinding(b.var, relax.TupleGetItem(weights, slot[b.var])) if b.var in slot else b
                           for b in block.bindings]) for block in func.body.blocks]
    entry = relax.Function([*func.params, weights], relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                           func.is_pure, func.attrs, func.span)

    bb = relax.BlockBuilder(mod)
    bb.update_func(gv, relax.analysis.remove_all_unused(entry))
    packed = relax.Var("packed_params", params.ty)
    with bb.function(LIBRARY_GEMM_WEIGHTS, [packed]):
        with bb.dataflow():
            outs = []
            for w in lifted:
                call = bindings[w]
                args = [bb.emit(relax.TupleGetItem(packed, items[a])) for a in call.args[1].fields]
                outs.append(bb.emit(relax.op.call_tir(call.args[0], relax.Tuple(args), w.ty)))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.finalize()


def _dims(expr: relax.Expr):
    shape = getattr(expr.ty, "shape", None)
    return list(shape.values) if isinstance(shape, relax.ShapeExpr) else None


def _token_rows(x: relax.Expr) -> bool:
    """x is [1, seq_len, K] (or [seq_len, K]) with a static K."""
    dims = _dims(x)
    if dims is None or len(dims) not in (2, 3) or not isinstance(dims[-1], tirx.IntImm):
        return False
    rows = dims[-2]
    return isinstance(rows, tirx.Var) and rows.name == ROWS_VAR and (len(dims) == 2 or int(dims[0]) == 1)


@mutator
class _Rewriter(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        operands = self._match(call)
        if operands is None:
            return call
        return relax.op.call_dps_packed(GEMM_PACKED_FUNC, relax.Tuple(list(operands)),
                                        relax.TensorType(call.ty.shape, call.ty.dtype))

    def _match(self, call: relax.Call):
        """(x, w) of an NT matmul over the tokens whose result (cast back, if it sums in float32)
        has x's and w's dtype; else None."""
        matmul = call
        if call.op == _ASTYPE and isinstance(call.args[0], relax.Var):
            matmul = self.lookup_binding(call.args[0])
        if not is_call_tir_to(matmul, "NT_matmul") or not isinstance(matmul.args[1], relax.Tuple):
            return None
        operands = list(matmul.args[1].fields)
        if len(operands) != 2 or not _token_rows(operands[0]) or len(_dims(operands[1]) or ()) != 2:
            return None
        dtypes = {operands[0].ty.dtype, operands[1].ty.dtype, call.ty.dtype}
        return operands if len(dtypes) == 1 else None


__all__ = ["LibraryGEMM", "lift_weights"]
