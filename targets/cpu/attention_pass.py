"""UseKilnCPUAttention: swap TVM's scalar CPU paged-attention kernels for kiln's vectorised ones.

``TIRPagedKVCache`` built for an llvm target adds its CPU kernels to the module as PrimFuncs
named ``batch_prefill_ragged_kv`` (a prefill's new tokens among themselves),
``batch_prefill_paged_kv_cpu`` (new tokens against cached pages: chunked prefill, prefix-cache
hits) and ``batch_decode_paged_kv_cpu`` (one token per sequence against its pages), and hands
them to ``vm.builtin.paged_attention_kv_cache_create``. This pass replaces each of those
PrimFuncs in place with attention.py's kernel of the same signature, reading the
head counts, head dim, page size and dtype off the original's buffers, so the KV cache's
runtime calls the new code without knowing.

It also replaces ``fused_rope`` (the split of fused qkv into q, k, v with RoPE applied,
which the cache runs before attention) with ``split_rotary_cpu``, but only when it is
structurally equal to TVM's default-scaling kernel for the cache's head counts, head dim,
theta and scale: scaled RoPE (llama3, yarn, longrope) keeps TVM's.

It leaves the module alone when the cache applies RoPE inside the attention kernel
(``RopeMode.INLINE``, which kiln's kernels do not implement) or when it finds no single
KV-cache creation to read those parameters from. The sliding-window kernels are replaced too
(attention_paged_cpu's `sliding`: the same pages, the rows outside the window and its sink not
counted; the prefill's window size, a constant of TVM's kernel, read off the creation's sizes);
the tree-attention variants stay as TVM wrote them.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprVisitor, visitor
from tvm.relax.frontend.nn.llm import kv_cache
from tvm.relax.frontend.nn.llm.kv_cache import RopeMode

from .attention import attention_paged_cpu, attention_prefill_ragged_cpu, split_rotary_cpu
from ..attention_softcap import KILN_KERNEL_ATTR, module_softcap
from ..kernel_memo import memoize_kv_cache_kernels

_CREATE = "vm.builtin.paged_attention_kv_cache_create"
_CALL_PURE_PACKED = tvm.ir.Op.get("relax.call_pure_packed")
# Positions among the create call's arguments (TIRPagedKVCache, TVM 0.27).
_ROPE_MODE_ARG = 8
_ROPE_ARGS = (2, 3, 4, 9, 10)     # num_attention_heads, num_key_value_heads, qk_head_dim, rope_scale, rope_theta
_SUPPORTED_ROPE_MODES = (int(RopeMode.NONE), int(RopeMode.NORMAL))
_SIZES_ARG, _WINDOW_SIZE = 0, 5   # the creation's ShapeExpr of sizes; its layer_sliding_window_size
_ROPE_NAME = "fused_rope"         # TVM's llama_rope_with_position_map, added as "tir_split_rotary"


def _shape(func: tirx.PrimFunc, param: int) -> tuple[list, str]:
    buf = func.params[param]                       # TVM 0.27: buffer params carry shape and dtype
    return [int(x) if isinstance(x, tirx.IntImm) else x for x in buf.shape], str(buf.dtype)


def _ragged(func: tirx.PrimFunc, softcap: float | None, _window: int, simd: int) -> tirx.PrimFunc:
    (_, h_q, d), dtype = _shape(func, 0)            # q [qo_len, h_q, d]
    (_, h_kv, _), _ = _shape(func, 2)               # k [kv_len, h_kv, d]
    (_, _, d_v), _ = _shape(func, 3)
    if d_v != d:
        raise ValueError("different key and value head dims")
    return attention_prefill_ragged_cpu(h_kv, h_q, d, dtype, softcap=softcap, simd=simd)


def _paged(decode: bool, sliding: bool = False):
    def make(func: tirx.PrimFunc, softcap: float | None, window: int, simd: int) -> tirx.PrimFunc:
        (_, h_q, d), dtype = _shape(func, 0)        # q [rows, h_q, d]
        pages_param = 1 if decode else 2            # pages [max_pages, 2, h_kv, page_size, d]
        (_, _, h_kv, page_size, _), _ = _shape(func, pages_param)
        return attention_paged_cpu(h_kv, h_q, d, dtype, page_size, decode=decode, softcap=softcap, sliding=sliding,
                                   window=window if sliding and not decode else 0, simd=simd)
    return make


# The module names them after their TVM function names / global symbols.
REPLACEMENTS = {
    "batch_prefill_ragged_kv": _ragged,
    "batch_prefill_paged_kv_cpu": _paged(decode=False),
    "batch_decode_paged_kv_cpu": _paged(decode=True),
    "batch_decode_paged_kv_cpu_sliding_window": _paged(decode=True, sliding=True),
    "batch_prefill_paged_kv_cpu_sliding_window": _paged(decode=False, sliding=True),
}


def _replacement(name: str, func: tirx.PrimFunc, softcap: float | None = None,
                 window: int = 0, simd: int = 16) -> tirx.PrimFunc | None:
    """kiln's kernel for TVM's `name`, or None: not one kiln replaces, or a shape its kernels do not
    take (head_dim not a multiple of the vector width, different k/v head dims, a sliding-window
    prefill whose window size is not a constant), which keeps TVM's."""
    make = REPLACEMENTS.get(name)
    try:
        return make(func, softcap, window, simd) if make else None
    except ValueError:          # raised by the kernel builders' shape checks only
        return None


@visitor
class _CacheCreations(PyExprVisitor):
    """Collects the arguments of every KV-cache create call."""

    def __init__(self) -> None:
        self.calls: list[list[relax.Expr]] = []

    def visit_call_(self, call: relax.Call) -> None:  # noqa: N802 (TVM's visitor naming)
        args = list(call.args)
        if call.op.same_as(_CALL_PURE_PACKED) and args:       # R.call_pure_packed("vm.builtin...", *args)
            callee, args = args[0], args[1:]
        else:
            callee = call.op
        if isinstance(callee, relax.ExternFunc) and callee.global_symbol == _CREATE:
            self.calls.append(args)
        for a in call.args:
            self.visit_expr(a)


def _cache_creations(mod: tvm.ir.IRModule) -> list[list[relax.Expr]]:
    finder = _CacheCreations()
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            finder.visit_expr(func)
    return finder.calls


def _prim(arg: relax.Expr) -> float | None:
    """The number of an IntImm / FloatImm argument (TVM 0.27 passes prim values as such), else None."""
    return arg.value if isinstance(arg, (tirx.IntImm, tirx.FloatImm)) else None


def _layer_window(create_args: list[relax.Expr]) -> int:
    """The cache's layer_sliding_window_size (TVM compiles it into its sliding-window prefill), or 0
    where it is not a constant."""
    sizes = create_args[_SIZES_ARG]
    if not isinstance(sizes, relax.ShapeExpr) or len(sizes.values) <= _WINDOW_SIZE:
        return 0
    return int(_prim(sizes.values[_WINDOW_SIZE]) or 0)


def _rope_replacement(func: tirx.PrimFunc, create_args: list[relax.Expr]) -> tirx.PrimFunc | None:
    """kiln's split_rotary_cpu when ``func`` is exactly TVM's default-scaling RoPE for this cache."""
    h_q, h_kv, d, scale, theta = (_prim(create_args[i]) for i in _ROPE_ARGS)
    if None in (h_q, h_kv, d, scale, theta):
        return None
    dtype = str(func.params[0].dtype)
    memoize_kv_cache_kernels()          # TVM's RoPE from the memo its cache parsed it into at the export
    tvm_default = kv_cache.llama_rope_with_position_map(theta, scale, int(d), int(h_q), int(h_kv), dtype, {}, int(d))
    if not tvm_ffi.structural_equal(func.with_attrs(tvm_default.attrs) if func.attrs else func, tvm_default):
        return None                                     # scaled (llama3, yarn, ...) or partial rotary: keep TVM's
    return split_rotary_cpu(theta, scale, int(d), int(h_q), int(h_kv), dtype)


def rope_before_attention(mod: tvm.ir.IRModule) -> list[relax.Expr] | None:
    """The arguments of the module's one KV-cache creation if that cache applies RoPE before its
    attention kernels (or not at all), else None: no cache, several, or RoPE inside attention
    (``RopeMode.INLINE``, which kiln's kernels do not implement)."""
    creations = _cache_creations(mod)
    if len(creations) != 1 or _prim(creations[0][_ROPE_MODE_ARG]) not in _SUPPORTED_ROPE_MODES:
        return None
    return creations[0]


@tvm.transform.module_pass(opt_level=0, name="UseKilnCPUAttention")
class UseKilnCPUAttention:
    """Replace TVM's CPU paged-attention and RoPE PrimFuncs (by name) with kiln's, keeping their symbols.
    `simd`: float32 lanes of the target's vector registers (attention.py's prefill blocks and its value
    sums' chunks, prefill and decode, follow it)."""

    def __init__(self, simd: int = 16) -> None:
        self.simd = simd

    def transform_module(self, mod: tvm.ir.IRModule, _ctx: tvm.transform.PassContext) -> tvm.ir.IRModule:
        creation = rope_before_attention(mod)
        softcap = module_softcap(mod)
        if creation is None:
            return mod
        window = _layer_window(creation)
        mod = mod.clone()
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, tirx.PrimFunc):
                continue
            if gv.name_hint == _ROPE_NAME:
                new = _rope_replacement(func, creation)
            else:
                new = _replacement(gv.name_hint, func, softcap, window, self.simd)
            if new is None:
                continue
            # kiln's own attrs (plain scheduled TIR, not s_tir), under the original's symbol
            symbol = func.attrs.get("global_symbol", gv.name_hint) if func.attrs else gv.name_hint
            mod[gv] = new.with_attr("global_symbol", symbol).with_attr(KILN_KERNEL_ATTR, True)
        return mod
