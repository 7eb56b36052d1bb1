"""SoftcapTVMAttention: attention logit soft-capping (Gemma 2) in the TVM CPU attention kernels kiln keeps.

Gemma 2 caps every attention score: s -> c * tanh(s / c) before the softmax. TVM's paged-attention
kernels take only a softmax scale. kiln's own CPU kernels (attention.py) take the cap as a
parameter; the kernels kiln keeps from TVM (the sliding-window prefill and decode, the tree
kernels, a ragged kernel kiln's do not cover) compute each score as a whole dot product and then
store it scaled, ``S = dot * sm_scale * log2(e)`` (the log2 domain). This pass rewrites exactly
that store to ``C * tanh(S / C)`` with ``C = c * log2(e)``, the same cap in that domain.

It matches, per PrimFunc that takes ``sm_scale`` and is not kiln's (attr ``kiln.attention``), the
stores whose value reads a buffer and multiplies by ``sm_scale``; a masked score (a constant
times sm_scale) is left alone (it would be capped to a score no longer masked). A kernel with no such store, or more than one, is an error: a
TVM upgrade that moves the scaling must fail the compile, never cap nothing. GPU kernels scale
inside the dot product, so targets other than the CPU refuse soft-capped models (TargetProfile
attn_softcap).
"""

from __future__ import annotations

import math
import re

import tvm
import tvm.script
from tvm import tirx

from ..profile import SOFTCAP_ATTR             # the IRModule attribute the compiler sets from the model

KILN_KERNEL_ATTR = "kiln.attention"          # set on kiln's own attention kernels (attention_pass.py)


def module_softcap(mod: tvm.IRModule) -> float | None:
    value = mod.attrs.get(SOFTCAP_ATTR) if mod.attrs else None
    return float(value) if value is not None else None


# A store of a scaled score: `X[...] = <reads a buffer> ... sm_scale ...` on one TVMScript line.
_SCALED_STORE = re.compile(r"^(?P<indent>\s*)(?P<lhs>\w+\[[^\]]*\]) = (?P<rhs>.*\[.*\].*)$")


def cap_scores(func: tirx.PrimFunc, softcap: float) -> tirx.PrimFunc:
    """`func` with its one scaled-score store soft-capped (ValueError when it has none or several).

    TVM 0.27's Python API has no TIR mutator, so the rewrite goes through TVMScript, which
    round-trips a PrimFunc exactly: print, rewrite the one line, parse."""
    if not any(p.name == "sm_scale" for p in func.params):
        return func
    c = f"T.float32({softcap * math.log2(math.e)!r})"
    lines, hits = func.script().splitlines(), 0
    for n, line in enumerate(lines):
        m = _SCALED_STORE.match(line)
        if m and "sm_scale" in m["rhs"] and not line.lstrip().startswith("def "):
            lines[n] = f"{m['indent']}{m['lhs']} = {c} * T.tanh(({m['rhs']}) / {c})"
            hits += 1
    if hits != 1:
        name = func.attrs.get("global_symbol", "?") if func.attrs else "?"
        raise ValueError(f"cannot soft-cap attention kernel {name}: found {hits} scaled-score stores "
                         "(expected 1); TVM's kernel changed")
    return tvm.script.from_source("\n".join(lines))


@tvm.transform.module_pass(opt_level=0, name="SoftcapTVMAttention")
class SoftcapTVMAttention:
    """Soft-cap the scores of every TVM attention kernel left in a module that asks for it."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        softcap = module_softcap(mod)
        if softcap is None:
            return mod
        mod = mod.clone()
        for gv, func in list(mod.functions.items()):
            if isinstance(func, tirx.PrimFunc) and not (func.attrs and func.attrs.get(KILN_KERNEL_ATTR)):
                mod[gv] = cap_scores(func, softcap)
        return mod
