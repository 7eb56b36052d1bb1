"""FuseNormIntoMatmul: the residual add + RMSNorm and the quantized matmul that reads the norm, one group.

Matches, in batch_decode (NORM_ENTRIES), after FuseAddRMSNorm and FuseDequantizeMatmul::

    t = R.call_tir(fuse_add_rms_norm, (x, r, w))    # (y, n): the residual sum and its norm
    y = t[0]                                        # (none after the final norm)
    n = t[1]
    o = <a FuseDequantizeMatmul group>(..., n, ...)  # the next projection (plain or glu)

where n is read by that group alone and t by nothing but its items: the QKV projection after
the attention's norm, the gate-up projection after the MLP's, the LM head after the final norm
(whose sum nothing reads: no y).

Emits a private Relax function {"Primitive": True, "Composite": NORM_PATTERN_NAME} over (x, r, w,
the group's other inputs) returning (y, o), called where t was; FuseTIR makes it one PrimFunc whose
first blocks are the add + norm's (T_add, T_multiply_red, rsqrt, T_rms_norm) and the rest the
group's (dequantize, NT_matmul, cast, an epilogue).

A target's GEMV may compute the add and the norm as its prologue (targets/norm_prologue.py says
where): a kernel a norm less (the first layer's norm reads the embedding, no add, and stays);
elsewhere the group runs as the two kernels it was.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.utils import copy_with_new_vars

from .fuse_dequantize_matmul import GLU_PATTERN_NAME, PATTERN_NAME, is_call_tir_to

NORM_PATTERN_NAME = "kiln.add_norm_dequantize_matmul"
NORM_ENTRIES = ("batch_decode",)      # where the norm joins the matmul after it
_GROUPS = (PATTERN_NAME, GLU_PATTERN_NAME)


@tvm.transform.module_pass(opt_level=0, name="FuseNormIntoMatmul")
class FuseNormIntoMatmul:  # pylint: disable=too-few-public-methods
    """Group each add + RMSNorm with the quantized matmul reading the norm (module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        for name in NORM_ENTRIES:
            gv = next((g for g in mod.get_global_vars() if g.name_hint == name), None)
            if gv is not None and isinstance(mod[gv], relax.Function):
                mod = _rewrite(mod, gv)
        return mod


def _rewrite(mod: tvm.IRModule, gv: relax.GlobalVar) -> tvm.IRModule:
    func = mod[gv]
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return mod
    blocks, changed, builder, uses = [], False, relax.BlockBuilder(mod), _uses(func)
    for block in body.blocks:
        if isinstance(block, relax.DataflowBlock):
            bindings, grouped = _grouped(builder, block.bindings, uses)
            changed |= grouped
            block = relax.DataflowBlock(bindings)
        blocks.append(block)
    if not changed:
        return mod
    mod = builder.get()
    mod[gv] = relax.Function(func.params, relax.SeqExpr(blocks, body.body), func.ret_ty,
                             func.is_pure, func.attrs)
    return relax.transform.Normalize()(mod)


def _uses(func: relax.Function) -> dict:
    """How many times each Var is read in func."""
    uses: dict = {}

    def count(expr):
        if isinstance(expr, relax.Var):
            uses[expr] = uses.get(expr, 0) + 1
    relax.analysis.post_order_visit(func.body, count)
    return uses


def _grouped(builder: relax.BlockBuilder, bindings, uses) -> tuple[list, bool]:
    """The block's bindings with each matched (t, y, n, o) replaced by a call of a new group (added
    to the builder's module)."""
    mod = builder.get()
    value_of = {b.var: b.value for b in bindings}
    at = {b.var: i for i, b in enumerate(bindings)}
    items: dict = {}                                            # t -> {index: the item's binding}
    for b in bindings:
        if isinstance(b.value, relax.TupleGetItem) and b.value.tuple_value in value_of:
            items.setdefault(b.value.tuple_value, {})[b.value.index] = b
    replace, drop = {}, set()
    for b in bindings:
        match = _match(mod, b, value_of, items, uses, at)
        if match is None:
            continue
        t, y_binding, n_binding, group_gv, args = match
        new_gv = _add_group(builder, value_of[t], group_gv, mod[group_gv], args, n_binding.var)
        norm_args = list(value_of[t].args[1].fields)
        others = [a for a in args if not a.same_as(n_binding.var)]
        pair = relax.DataflowVar(t.name, relax.TupleType([value_of[t].ty.fields[0], b.var.ty]))
        replace[at[t]] = [relax.VarBinding(pair, relax.Call(new_gv, [*norm_args, *others]))]
        if y_binding is not None:                       # (the final norm's sum is read by nothing)
            replace[at[y_binding.var]] = [relax.VarBinding(y_binding.var, relax.TupleGetItem(pair, 0))]
        replace[at[b.var]] = [relax.VarBinding(b.var, relax.TupleGetItem(pair, 1))]
        drop.add(at[n_binding.var])
    out = []
    for i, b in enumerate(bindings):
        if i not in drop:
            out.extend(replace.get(i, [b]))
    return out, bool(replace)


def _match(mod, binding, value_of, items, uses, at):
    """(t, y's binding, n's binding, the group's GlobalVar, the call's args) where `binding` calls a
    FuseDequantizeMatmul group on n = t[1] of an add + RMSNorm t as the module docstring says."""
    call = binding.value
    if not isinstance(call, relax.Call) or not isinstance(call.op, relax.GlobalVar):
        return None
    group = mod[call.op]
    if not isinstance(group, relax.Function) or group.attrs is None or group.attrs.get("Composite") not in _GROUPS:
        return None
    for arg in call.args:
        n_value = value_of.get(arg)
        if not isinstance(n_value, relax.TupleGetItem) or n_value.index != 1:
            continue
        t = n_value.tuple_value
        norm = value_of.get(t)
        got = items.get(t, {})
        if norm is None or not is_call_tir_to(norm, "fuse_add_rms_norm") or 1 not in got or not set(got) <= {0, 1}:
            continue
        if uses.get(arg, 0) != 1 or uses.get(t, 0) != len(got):
            continue                                    # n read elsewhere, or t used whole
        others = [a for a in call.args if not a.same_as(arg)]
        # the group is emitted where t was: its other inputs must be bound before t (weights are)
        if any(a in at and at[a] > at[t] for a in others) or any(
                isinstance(a, relax.Var) and a in at and at[a] > at[t] for a in norm.args[1].fields):
            continue
        return t, got.get(0), got[1], call.op, list(call.args)
    return None


def _add_group(builder: relax.BlockBuilder, norm: relax.Call, group_gv: relax.GlobalVar, group: relax.Function,
               args, n_var) -> relax.GlobalVar:
    """A Primitive function: the add + norm `norm` on new params, then the body of `group` (group_gv's)
    on its item 1 and the group's other inputs; returns (y, the group's output). Added to the builder's
    module (once: add_func finds an equal one), its GlobalVar."""
    params = [relax.Var(f"p{i}", a.ty) for i, a in enumerate(norm.args[1].fields)]
    t = relax.DataflowVar("t", norm.ty)
    y = relax.DataflowVar("y", norm.ty.fields[0])
    n = relax.DataflowVar("n", norm.ty.fields[1])
    bind = {}
    for p, a in zip(group.params, args):
        if a.same_as(n_var):
            bind[p] = n
        else:
            bind[p] = relax.Var(p.name, p.ty)
            params.append(bind[p])
    inner = group.bind_params(bind).body
    if not isinstance(inner, relax.SeqExpr) or len(inner.blocks) != 1:
        raise ValueError(f"FuseNormIntoMatmul: {group_gv.name_hint} is not one dataflow block")
    out = relax.Var("out", relax.TupleType([y.ty, inner.body.ty]))
    bindings = [relax.VarBinding(t, relax.Call(norm.op, [norm.args[0], relax.Tuple(params[:3])], norm.attrs,
                                               norm.ty_args)),
                relax.VarBinding(y, relax.TupleGetItem(t, 0)), relax.VarBinding(n, relax.TupleGetItem(t, 1)),
                *inner.blocks[0].bindings, relax.VarBinding(out, relax.Tuple([y, inner.body]))]
    func = relax.Function(params, relax.SeqExpr([relax.DataflowBlock(bindings)], out), out.ty, True)
    func = copy_with_new_vars(func.with_attrs({"Primitive": True, "Composite": NORM_PATTERN_NAME}))  # its own sizes
    return builder.add_func(func, f"fused_add_norm_{group_gv.name_hint}")


__all__ = ["FuseNormIntoMatmul", "NORM_ENTRIES", "NORM_PATTERN_NAME"]
