"""kiln's Relax passes (compiler/pipeline.py runs them), and what several of them share."""

from __future__ import annotations

import tvm
from tvm import relax


def rewrite_functions(mutator, mod: tvm.IRModule, only: str | None = None, prune: bool = False) -> tvm.IRModule:
    """`mutator` (a PyExprMutator built over `mod`) applied to each Relax function of `mod` (to the one
    named `only`, if given); `prune`: the bindings the rewrite left unused are dropped."""
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and only in (None, gv.name_hint):
            new = mutator.visit_expr(func)
            mutator.builder_.update_func(gv, relax.analysis.remove_all_unused(new) if prune else new)
    return mutator.builder_.finalize()
