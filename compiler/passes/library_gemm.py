"""LibraryGEMM: the token matmuls of `batch_prefill_gemm` and `batch_decode_gemm` through the device's BLAS.

Matches, in the LIBRARY_GEMM_COPIES functions only (graph phase, after FuseTransposeMatmul, before
FuseDequantizeMatmul)::

    y = R.call_tir(NT_matmul, (x, w))       # x [1, seq_len, K] or [batch_size, 1, K], w [N, K]: y = x @ w.T
    z = R.astype(y, x.dtype)                 # if y sums in float32 (AccumulateInFloat32)

where w is a weight (a parameter, or a dequantize call's output) and x, w and z share one dtype, and
replaces it with

    z = R.call_dps_packed("kiln.gemm_nt", (x, w), out_ty=z's)

which the runtime registers (runtime/library_gemm.py: torch's matmul, the vendor BLAS of the device,
summing in float32 and rounding once). Only matmuls over the call's rows (ROWS: a prefill's tokens, a
decode step's sequences): the logits of the few positions a prefill gathers stay TVM's, and so do a
decode step's logits where they sum float16 weights into float32 (their dtype is not x's).

The dequantized weights are then lifted out of the entries: each dequantize call of parameters
only, that feeds such a matmul, moves into a function of its own, LIBRARY_GEMM_WEIGHTS(params) ->
(w0, w1, ...), one call per weight for both entries, and each entry takes that tuple as a last
parameter (after the params, so RewriteCUDAGraph counts it static), reading w_i where it
dequantized. The runtime calls the weights function once at load and keeps its tensors
(runtime/model_runner.py: where they fit beside the KV cache), so no forward dequantizes. A scheme
that stores float weights lifts nothing: the tuple is empty.

batch_decode_gemm's kernels are launched one by one: a target that captures graphs (its profile's
finalize passes) captures batch_decode's regions per batch size, not this copy's, whose regions
would hold the BLAS call, which torch launches on a stream of its own, not the capture's.

Why: on an H100 (2026-11-27) a 16 x 128-token prefill of the 8B model spent 138 of its 168 ms of
device time in matmuls on dlight's wmma tiles (~210 TFLOP/s), where transformers' prefill of the
same model (the vendor BLAS) took ~72 ms in all; TVM 0.27's Hopper matmuls (its new tile-primitive
backend) are not in reach of kiln's pipeline, and the PyPI build links no BLAS. At 16 and 64
sequences a decode step spent 10.7 of its 11.9 ms in matmuls on the 32 x 32 tiles (the down
projection 134 us where its bytes take 11), where the float16 weights' bytes take ~5.3 ms. Dequantized
in the forward, the weights cost ~11 ms a forward (~1 GB of float16 written and read a layer's worth
at a time); kept from the load they take 2 bytes a value (16 GB for an 8B model) beside the 4-bit
ones, and a BLAS matmul reads 4x the bytes of a 4-bit one, so the runtime takes the entries only
from runtime/library_gemm.py's MIN_TOKENS a forward and MIN_DECODE_ROWS a step.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from kiln.runtime.contract import GEMM_PACKED_FUNC, LIBRARY_GEMM_DECODE, LIBRARY_GEMM_ENTRY, LIBRARY_GEMM_WEIGHTS

from . import rewrite_functions
from .fuse_dequantize_matmul import is_call_tir_to

_ASTYPE = tvm.ir.Op.get("relax.astype")
# Each entry's rows: the spec's name (compiler/spec.py) for a forward's tokens, a decode step's sequences.
ROWS = {LIBRARY_GEMM_ENTRY: "seq_len", LIBRARY_GEMM_DECODE: "batch_size"}


@tvm.transform.module_pass(opt_level=0, name="LibraryGEMM")
class LibraryGEMM:  # pylint: disable=too-few-public-methods
    """Route the LIBRARY_GEMM_COPIES' row matmuls to GEMM_PACKED_FUNC (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        names = [gv.name_hint for gv in mod.get_global_vars()]
        entries = [name for name in ROWS if name in names]
        for name in entries:
            mod = rewrite_functions(_Rewriter(mod, ROWS[name]), mod, only=name, prune=True)
        return lift_weights(mod, entries) if entries else mod


def _dims(expr: relax.Expr):
    shape = getattr(expr.ty, "shape", None)
    return list(shape.values) if isinstance(shape, relax.ShapeExpr) else None


def _over_rows(x: relax.Expr, rows: str) -> bool:
    """x is [.., K] with a static K, one axis the symbolic `rows` and any other of size 1."""
    dims = _dims(x)
    if dims is None or len(dims) not in (2, 3) or not isinstance(dims[-1], tirx.IntImm):
        return False
    named = [d for d in dims[:-1] if isinstance(d, tirx.Var) and d.name == rows]
    ones = [d for d in dims[:-1] if isinstance(d, tirx.IntImm) and int(d) == 1]
    return len(named) == 1 and len(named) + len(ones) == len(dims) - 1


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, rows: str) -> None:
        super().__init__(mod)
        self.rows = rows

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        operands = self._match(call)
        if operands is None:
            return call
        return relax.op.call_dps_packed(GEMM_PACKED_FUNC, relax.Tuple(list(operands)),
                                        relax.TensorType(call.ty.shape, call.ty.dtype))

    def _match(self, call: relax.Call):
        """(x, w) of an NT matmul over the rows whose result (cast back, if it sums in float32)
        has x's and w's dtype; else None."""
        matmul = call
        if call.op == _ASTYPE and isinstance(call.args[0], relax.Var):
            matmul = self.lookup_binding(call.args[0])
        if not is_call_tir_to(matmul, "NT_matmul") or not isinstance(matmul.args[1], relax.Tuple):
            return None
        operands = list(matmul.args[1].fields)
        if len(operands) != 2 or not _over_rows(operands[0], self.rows) or len(_dims(operands[1]) or ()) != 2:
            return None
        dtypes = {operands[0].ty.dtype, operands[1].ty.dtype, call.ty.dtype}
        return operands if len(dtypes) == 1 else None


_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_CALL_DPS_PACKED = tvm.ir.Op.get("relax.call_dps_packed")


def lift_weights(mod: tvm.IRModule, entries: list[str]) -> tvm.IRModule:
    """The `entries`' dequantized BLAS weights computed by LIBRARY_GEMM_WEIGHTS instead, once each,
    and passed to every entry as its last parameter (see the module docstring)."""
    found = {}                    # entry -> (function, {lifted var: weight key})
    weights = {}                  # weight key (dequantize function, param indices) -> its call, type
    for name in entries:
        func = mod[name]
        params = func.params[-1]                            # the packed weights tuple, after the inputs
        bindings = {b.var: b.value for block in func.body.blocks for b in block.bindings}
        items = {var: int(v.index) for var, v in bindings.items()
                 if isinstance(v, relax.TupleGetItem) and v.tuple_value.same_as(params)}
        lifted = {}
        for value in bindings.values():
            if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_DPS_PACKED)
                    and value.args[0].global_symbol == GEMM_PACKED_FUNC):
                continue
            w = value.args[1].fields[1]
            source = bindings.get(w)
            if isinstance(source, relax.Call) and source.op.same_as(_CALL_TIR) and len(source.args) == 2 \
                    and all(a in items for a in source.args[1].fields):
                key = (source.args[0].name_hint, tuple(items[a] for a in source.args[1].fields))
                lifted[w] = key
                weights.setdefault(key, (source.args[0], w.ty))
        found[name] = (func, lifted)

    slot = {key: j for j, key in enumerate(weights)}
    tuple_ty = relax.TupleType([ty for _, ty in weights.values()])
    bb = relax.BlockBuilder(mod)
    for name, (func, lifted) in found.items():
        arg = relax.Var("gemm_weights", tuple_ty)
        blocks = [type(block)([relax.VarBinding(b.var, relax.TupleGetItem(arg, slot[lifted[b.var]]))
                               if b.var in lifted else b for b in block.bindings])
                  for block in func.body.blocks]
        entry = relax.Function([*func.params, arg], relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                               func.is_pure, func.attrs, func.span)
        bb.update_func(mod.get_global_var(name), relax.analysis.remove_all_unused(entry))

    packed = relax.Var("packed_params", found[entries[0]][0].params[-1].ty)
    with bb.function(LIBRARY_GEMM_WEIGHTS, [packed]):
        with bb.dataflow():
            outs = []
            for (_, indices), (dequantize, ty) in weights.items():
                args = [bb.emit(relax.TupleGetItem(packed, i)) for i in indices]
                outs.append(bb.emit(relax.op.call_tir(dequantize, relax.Tuple(args), ty)))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.finalize()


__all__ = ["LibraryGEMM", "lift_weights"]
