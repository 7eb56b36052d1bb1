"""UseKilnCPUAttention: swap TVM's scalar CPU paged-attention kernels for kiln's vectorised ones.

``TIRPagedKVCache`` built for an llvm target adds its CPU kernels to the module as PrimFuncs
named ``batch_prefill_ragged_kv`` (a prefill's new tokens among themselves),
``batch_prefill_paged_kv_cpu`` (new tokens against cached pages: chunked prefill, prefix-cache
hits) and ``batch_decode_paged_kv_cpu`` (one token per sequence against its pages), and hands
them to ``vm.builtin.paged_attention_kv_cache_create``. This pass replaces each of those
PrimFuncs in place with targets/cpu_attention.py's kernel of the same signature, reading the
head counts, head dim, page size and dtype off the original's buffers, so the KV cache's
runtime calls the new code without knowing.

It leaves the module alone when the cache applies RoPE inside the attention kernel
(``RopeMode.INLINE``, which kiln's kernels do not implement), and leaves the sliding-window
and tree-attention variants as TVM wrote them.

Measured on SmolLM2-135M q4f32, 2-core znver5: attention (the whole
``attention_with_fused_qkv`` builtin: rotary, KV append and attention) went from 97 ms to
see the closing note in docs of a 128-token prefill; see targets/cpu_attention.py.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprVisitor, visitor
from tvm.relax.frontend.nn.llm.kv_cache import RopeMode

from kiln.targets.cpu_attention import attention_paged_cpu, attention_prefill_ragged_cpu

_CREATE = "vm.builtin.paged_attention_kv_cache_create"
_ROPE_MODE_ARG = 8          # position of rope_mode among the create call's arguments (TVM 0.27)


def _shape(func: tirx.PrimFunc, param: int) -> tuple[list, str]:
    buf = func.params[param]                       # TVM 0.27: buffer params carry shape and dtype
    return [int(x) if isinstance(x, tirx.IntImm) else x for x in buf.shape], str(buf.dtype)


def _ragged(func: tirx.PrimFunc) -> tirx.PrimFunc:
    (_, h_q, d), dtype = _shape(func, 0)            # q [qo_len, h_q, d]
    (_, h_kv, _), _ = _shape(func, 2)               # k [kv_len, h_kv, d]
    (_, _, d_v), _ = _shape(func, 3)
    if d_v != d:
        raise ValueError("different key and value head dims")
    return attention_prefill_ragged_cpu(h_kv, h_q, d, dtype)


def _paged(decode: bool):
    def make(func: tirx.PrimFunc) -> tirx.PrimFunc:
        (_, h_q, d), dtype = _shape(func, 0)        # q [rows, h_q, d]
        pages_param = 1 if decode else 2            # pages [max_pages, 2, h_kv, page_size, d]
        (_, _, h_kv, page_size, _), _ = _shape(func, pages_param)
        return attention_paged_cpu(h_kv, h_q, d, dtype, page_size, decode=decode)
    return make


# The module names them after their TVM function names / global symbols.
REPLACEMENTS = {
    "batch_prefill_ragged_kv": _ragged,
    "batch_prefill_paged_kv_cpu": _paged(decode=False),
    "batch_decode_paged_kv_cpu": _paged(decode=True),
}


@visitor
class _RopeModes(PyExprVisitor):
    """Collects the rope_mode argument of every KV-cache create call."""

    def __init__(self) -> None:
        self.modes: list[int] = []

    def visit_call_(self, call: relax.Call) -> None:  # noqa: N802 (TVM's visitor naming)
        if isinstance(call.op, relax.ExternFunc) and call.op.global_symbol == _CREATE:
            arg = call.args[_ROPE_MODE_ARG]
            self.modes.append(int(arg.value.value) if isinstance(arg, relax.PrimValue) else -1)
        for a in call.args:
            self.visit_expr(a)


def _uses_inline_rope(mod: tvm.ir.IRModule) -> bool:
    finder = _RopeModes()
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            finder.visit_expr(func)
    return any(m not in (int(RopeMode.NONE), int(RopeMode.NORMAL)) for m in finder.modes)


@tvm.transform.module_pass(opt_level=0, name="UseKilnCPUAttention")
class UseKilnCPUAttention:
    """Replace TVM's CPU paged-attention PrimFuncs (by name) with kiln's, keeping their attrs."""

    def transform_module(self, mod: tvm.ir.IRModule, _ctx: tvm.transform.PassContext) -> tvm.ir.IRModule:
        if _uses_inline_rope(mod):
            return mod
        for gv, func in list(mod.functions.items()):
            make = REPLACEMENTS.get(gv.name_hint)
            if make is None or not isinstance(func, tirx.PrimFunc):
                continue
            new = make(func)
            for key, value in func.attrs.items() if func.attrs else ():
                new = new.with_attr(key, value)
            mod[gv] = new.with_attr("tirx.is_scheduled", True).with_attr("tirx.noalias", True)
        return mod
