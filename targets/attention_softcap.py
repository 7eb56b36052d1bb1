"""SoftcapTVMAttention: attention logit soft-capping (Gemma 2) in the TVM attention kernels kiln keeps.

Gemma 2 caps every attention score: s -> c * tanh(s / c) before the softmax. TVM's paged-attention
kernels take only a softmax scale. kiln's own kernels (targets/cpu/attention.py on CPUs,
decode_attention.py and prefill_attention.py on GPUs) take the cap as a parameter; in the kernels
kiln keeps from TVM (on CPUs the sliding-window prefill and decode, the tree kernels, a ragged kernel
kiln's do not cover; on GPUs the sliding-window prefill, the tree kernels, and every attention
kernel of the targets kiln's GPU kernels are not swapped into) this pass rewrites the one store of
a finished score, in the log2 domain TVM's kernels work in (``S = dot * sm_scale * log2(e)``), to
``C * tanh(S / C)`` with ``C = c * log2(e)``, the same cap in that domain. That store is:

- GPU kernels, which scale each product inside the sum: the tiled kernels' (prefill, ragged, tree)
  copy of the finished tile of scores, ``S_smem[i, j] = S_local[i, j]`` (block ``S_store``), and
  the decode kernel's store of a score summed across its threads, ``S_local[j] = t0[0]``;
- CPU kernels (none has a store of those forms): a score computed as a whole dot product, then
  stored scaled: the store whose value reads a buffer and multiplies by ``sm_scale``.

A masked score (a constant, times sm_scale on CPUs) is left alone (it would be capped to a score no
longer masked). Only functions that take ``sm_scale`` and are not kiln's (attr ``kiln.attention``)
are rewritten. A kernel with no such store, or more than one, is an error: a TVM upgrade that moves
the scaling must fail the compile, never cap nothing.
"""

from __future__ import annotations

import math
import re

import tvm
import tvm.script
from tvm import tirx

from .profile import SOFTCAP_ATTR             # the IRModule attribute the compiler sets from the model

KILN_KERNEL_ATTR = "kiln.attention"          # set on kiln's own attention kernels (attention_pass.py)


def module_softcap(mod: tvm.IRModule) -> float | None:
    value = mod.attrs.get(SOFTCAP_ATTR) if mod.attrs else None
    return float(value) if value is not None else None


# A store of a scaled score (CPU kernels): `X[...] = <reads a buffer> ... sm_scale ...` on one line.
_SCALED_STORE = re.compile(r"^(?P<indent>\s*)(?P<lhs>\w+\[[^\]]*\]) = (?P<rhs>.*\[.*\].*)$")
# The store of a finished score in TVM's GPU kernels: a tile of them, or one summed across threads.
_GPU_SCORE_STORE = re.compile(r"^(?P<indent>\s*)(?P<lhs>S_smem\[[^\]]*\]|S_local\[\w+\]) = "
                              r"(?P<rhs>S_local\[[^\]]*\]|t0\[0\])$")


def _score_stores(lines: list[str]) -> list[tuple[int, re.Match]]:
    """The (line number, match) of each finished-score store: the GPU form where a kernel has one
    (its per-product lines also multiply by sm_scale), else the CPU form."""
    gpu = [(n, m) for n, m in ((n, _GPU_SCORE_STORE.match(line)) for n, line in enumerate(lines)) if m]
    if gpu:
        return gpu
    cpu = ((n, _SCALED_STORE.match(line)) for n, line in enumerate(lines) if not line.lstrip().startswith("def "))
    return [(n, m) for n, m in cpu if m and "sm_scale" in m["rhs"]]


def cap_scores(func: tirx.PrimFunc, softcap: float) -> tirx.PrimFunc:
    """`func` with its one scaled-score store soft-capped (ValueError when it has none or several).

    TVM 0.27's Python API has no TIR mutator, so the rewrite goes through TVMScript, which
    round-trips a PrimFunc exactly: print, rewrite the one line, parse."""
    if not any(p.name == "sm_scale" for p in func.params):
        return func
    c = f"T.float32({softcap * math.log2(math.e)!r})"
    lines = func.script().splitlines()
    stores = _score_stores(lines)
    if len(stores) != 1:
        name = func.attrs.get("global_symbol", "?") if func.attrs else "?"
        raise ValueError(f"cannot soft-cap attention kernel {name}: found {len(stores)} score stores "
                         "(expected 1); TVM's kernel changed")
    (n, m), = stores
    lines[n] = f"{m['indent']}{m['lhs']} = {c} * T.tanh(({m['rhs']}) / {c})"
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
