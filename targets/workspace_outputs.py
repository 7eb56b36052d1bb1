"""Kernels' temporary global buffers as extra outputs of their calls, which Relax allocates.

Why: a schedule that splits a reduction between thread blocks (targets/narrow_tiles.py, split K)
needs a global buffer for the partial sums. Left inside the PrimFunc, TVM allocates it on every
call from the device's workspace pool, whose pages it frees and reallocates when a larger request
comes: a CUDA graph captured over such a call would replay into memory the pool has since given
back. As an output of the call instead, Relax's memory planning places it like any tensor
(statically, at the shapes' upper bounds), the graph replays over the same storage, and the
buffer dies after its call (KillAfterLastUse).

lift_workspace(func): a scheduled PrimFunc whose root block allocates global buffers, those
buffers moved to trailing parameters (the attribute WORKSPACE_ATTR counts them).
WorkspaceOutputs (module pass, after the schedule rules): every `R.call_tir` of such a function
gets those outputs too, shaped at the call's own sizes, and its uses keep reading the original
outputs.
"""

from __future__ import annotations

import tvm
from tvm import relax, s_tir, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

WORKSPACE_ATTR = "kiln.workspace_outputs"
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def workspace_count(func) -> int:
    """How many trailing parameters of `func` are workspace (0 for anything else)."""
    if not isinstance(func, tirx.PrimFunc) or func.attrs is None:
        return 0
    return int(func.attrs.get(WORKSPACE_ATTR, 0))


def lift_workspace(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with its root block's global-scope buffers as trailing parameters (unchanged if it
    allocates none there). Its other parameters must all be buffers."""
    realize = func.body
    root = realize.block
    lifted = [b for b in root.alloc_buffers if b.scope() == "global"]
    if not lifted:
        return func
    if not all(isinstance(p, tirx.Buffer) for p in func.params):
        raise ValueError("lift_workspace: the function takes scalars; a workspace would follow them")
    kept = [b for b in root.alloc_buffers if b.scope() != "global"]
    new_root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, root.body, root.init,
                            kept, root.match_buffers, root.annotations)
    body = s_tir.SBlockRealize(realize.iter_values, realize.predicate, new_root)
    count = workspace_count(func) + len(lifted)
    out = tirx.PrimFunc([*func.params, *lifted], body, func.ret_type, func.attrs)
    return out.with_attr(WORKSPACE_ATTR, count)


def _call_sizes(func: tirx.PrimFunc, shapes: list) -> tvm.sym.Analyzer:
    """An analyzer with each of `func`'s shape variables bound to the size the call gives it
    (`shapes`: the call's argument and output shapes, in `func`'s parameter order)."""
    analyzer = tvm.sym.Analyzer()
    for param, shape in zip(func.params, shapes):
        if not isinstance(param, tirx.Buffer) or shape is None:
            continue
        for dim, size in zip(param.shape, shape):
            if isinstance(dim, tirx.Var):
                analyzer.bind(dim, size)
    return analyzer


@mutator
class _AddOutputs(PyExprMutator):
    """Calls of the functions in `renamed` ({old GlobalVar: the one its new signature is under})
    with their workspace outputs added; `funcs`: the functions by old GlobalVar."""

    def __init__(self, mod: tvm.IRModule, funcs: dict, renamed: dict) -> None:
        super().__init__(mod)
        self.funcs, self.renamed = funcs, renamed

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not call.op.same_as(_CALL_TIR) or call.args[0] not in self.renamed:
            return call
        func = self.funcs[call.args[0]]
        count = workspace_count(func)
        outs = call.ty_args[0]
        outs = list(outs.fields) if isinstance(outs, relax.TupleType) else [outs]
        args = list(call.args[1].ty.fields)
        if len(args) + len(outs) + count != len(func.params):
            raise ValueError(f"{call.args[0].name_hint}: its calls do not match its parameters")
        sizes = _call_sizes(func, [getattr(a, "shape", None) for a in args] + [o.shape for o in outs])
        extra = [relax.TensorType([sizes.simplify(d) for d in b.shape], b.dtype) for b in func.params[-count:]]
        new = relax.call_tir(self.renamed[call.args[0]], call.args[1], [*outs, *extra])
        if len(outs) == 1:
            return relax.TupleGetItem(new, 0)
        return relax.Tuple([relax.TupleGetItem(new, i) for i in range(len(outs))])


@tvm.transform.module_pass(opt_level=0, name="kiln.WorkspaceOutputs")
class WorkspaceOutputs:
    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        lifted = {gv: f for gv, f in mod.functions_items() if workspace_count(f)}
        if not lifted:
            return mod
        # A GlobalVar keeps the signature it was added with: the functions go back under new ones.
        rest = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv not in lifted}, attrs=mod.attrs,
                            global_infos=mod.global_infos)
        add = _AddOutputs(rest, lifted, {})
        for gv, func in lifted.items():
            add.renamed[gv] = add.builder_.add_func(func, gv.name_hint)
        for gv, func in rest.functions_items():
            if isinstance(func, relax.Function):
                add.builder_.update_func(gv, add.visit_expr(func))
        return add.builder_.get()
