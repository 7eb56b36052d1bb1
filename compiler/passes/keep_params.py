"""KeepParamsAlive: no kill_object for a function's parameters and the items taken out of them.

KillAfterLastUse ends every object's life after its last use (``R.memory.kill_tensor``,
``R.vm.kill_object``; both become ``R.vm.kill_object``), one VM
builtin call (``vm.builtin.null_value``) each. For the weights that is pure overhead: the caller's
packed_params tuple holds them for the whole call and after it, so dropping the function's own
reference early frees nothing. A SmolLM2 decode step (423 weight tensors) made 423 such calls, a
sixth of its 2,490 VM calls; batch-1 decode went 183.5 -> 186.5 tok/s without them (medians of 5
alternating runs, 2 Xeon cores): a kill costs ~0.2 us, not the ~1 us the profile's instrument shows
for a builtin. This pass removes the kills of a Relax function's parameters and of
the variables bound to an item of a parameter tuple (``packed_params[i]``); every other kill
(intermediate tensors, storage) stays.
"""

from __future__ import annotations

import tvm
from tvm import relax

# KillAfterLastUse's kills of a tensor and of any other object (LowerRuntimeBuiltin makes both kill_object)
_KILLS = (tvm.ir.Op.get("relax.memory.kill_tensor"), tvm.ir.Op.get("relax.vm.kill_object"))


def _without_param_kills(func: relax.Function) -> relax.Function:
    held = set(func.params)                    # the caller holds these (and what they contain)
    blocks = []
    for block in func.body.blocks:
        kept = []
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.TupleGetItem) and value.tuple_value in held:
                held.add(binding.var)
            if isinstance(value, relax.Call) and any(value.op.same_as(k) for k in _KILLS) and value.args[0] in held:
                continue
            kept.append(binding)
        blocks.append(relax.DataflowBlock(kept) if isinstance(block, relax.DataflowBlock) else relax.BindingBlock(kept))
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                          func.is_pure, func.attrs, func.span)


@tvm.transform.module_pass(opt_level=0, name="KeepParamsAlive")
class KeepParamsAlive:
    """Drop the kills of parameters and of items of parameter tuples (after KillAfterLastUse)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mod = mod.clone()
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
                mod[gv] = _without_param_kills(func)
        return mod
