"""Kernels written in TVMScript parsed once: once a process, and once a cache for every later process.

A kernel written in TVMScript is parsed from its Python source every time its builder runs: 0.1-0.3 s
a kernel, 2.5 s of a tiny Llama's 4.4 s pipeline on the CPU (16 GEMVs, 4 attention kernels), and
TVM's KV cache parses 15 more every export (~2.4 s), paid again by every compile (the test suite's
hundreds, a `kiln compile` for several quantizations). A builder is a pure function of its arguments
(sizes, dtypes, flags, targets, module constants) and TVM's IR is immutable, so one PrimFunc serves
every module that asks for the same arguments: ``parsed_once`` keeps it, and ``memoize_kv_cache_kernels``
wraps TVM's KV-cache kernel builders the same way. The key holds the builder's module constants (its
upper-case globals) beside the arguments: tools/gpu_builds.py's variants set knobs such as
decode_attention.MIN_SPLIT for a build and put them back after.

Below the process, the library cache's folder (compiler/lib_cache.py, `parsed/`) keeps each parsed kernel as
TVM's JSON (``tvm.ir.save_json``, loaded in 5-20% of a parse), keyed by a sha256 of kiln's compiler
fingerprint (kiln's sources and TVM's version), the builder's name, its module constants and its
arguments; the kernel's own sha256 is in the file's name and checked on every read. Arguments whose
text is not a faithful key (an object printed by its address) keep the kernel in the process only.

A kernel over a symbolic size (the call's rows: a ``tirx.Var`` of the caller's function, which its
buffers must share) is parsed once over a variable of that dtype kept here, and each caller gets it
over its own variable: ``PrimFunc.specialize`` with the first buffer param sized by it rebinds the
variable everywhere (the other params, the body). The result is structurally the kernel a fresh parse
over the caller's variable gives (tests/compiler/test_kernel_memo.py).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import sys
import threading
from pathlib import Path

import tvm
from tvm import tirx

STAND_IN = "kiln_memo_rows"          # the name of the variable a symbolic size is parsed over


def parsed_once(size: str | None = None):
    """Decorate a kernel builder to build once per distinct arguments. ``size``: the name of the
    builder's argument that may be a symbolic size (a tirx.Var); an int or None there is a key
    like any other. A call with any other TIR expression among its arguments is built as is."""

    def wrap(builder):
        signature = inspect.signature(builder)
        module = sys.modules[builder.__module__]
        name = f"{builder.__module__}.{builder.__qualname__}"
        kernels: dict = {}
        lock = threading.Lock()

        @functools.wraps(builder)
        def build(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            var = bound.arguments.get(size) if size else None
            if any(isinstance(v, tvm.ir.Expr) for k, v in bound.arguments.items()
                   if not (k == size and isinstance(v, tirx.Var))):
                return builder(*args, **kwargs)          # a caller's own expression: nothing to share
            if isinstance(var, tirx.Var):
                bound.arguments[size] = _stand_in(str(var.ty.dtype))
            key = (tuple((k, _keyed(v)) for k, v in bound.arguments.items()), _constants(module))
            with lock:
                kernel = kernels.get(key)
            if kernel is None:
                stored = _Stored.at(name, key)
                kernel = stored.load() if stored else None
                if kernel is None:
                    kernel = builder(*bound.args, **bound.kwargs)
                    if stored:
                        stored.keep(kernel)
                with lock:
                    kernel = kernels.setdefault(key, kernel)
            if isinstance(var, tirx.Var):
                rebound = _rebind(kernel, bound.arguments[size], var)
                if rebound is None:            # the size sizes no buffer param: parse it over `var` itself
                    bound.arguments[size] = var
                    return builder(*bound.args, **bound.kwargs)
                return rebound
            return kernel

        build.kernels = kernels             # for tests
        return build

    return wrap


def _keyed(value):
    """`value` as a key: TVM targets by their JSON, dicts and lists (a RoPE scaling) by theirs, the
    stand-in for a symbolic size by its dtype."""
    if isinstance(value, tirx.Var):
        return ("size", str(value.ty.dtype))
    if isinstance(value, tvm.target.Target):
        return ("Target", json.dumps(value.export(), sort_keys=True, default=str))
    if isinstance(value, (dict, list)):
        return (type(value).__name__, json.dumps(value, sort_keys=True, default=str))
    return value


def _constants(module) -> tuple:
    """The module's upper-case globals that are plain values (the knobs a kernel is parsed with)."""
    return tuple((name, value) for name, value in vars(module).items()
                 if name.isupper() and isinstance(value, (int, float, str, tuple)))


_STAND_INS: dict[str, tirx.Var] = {}


def _stand_in(dtype: str) -> tirx.Var:
    """The variable kernels over a symbolic size of `dtype` are parsed over (one a dtype)."""
    return _STAND_INS.setdefault(dtype, tirx.Var(STAND_IN, dtype))


def _is_stand_in(dim, stand_in: tirx.Var) -> bool:
    """`dim` is the stand-in: this process's own, or one a stored kernel was parsed over."""
    return dim.same_as(stand_in) or (isinstance(dim, tirx.Var) and dim.name == STAND_IN
                                     and str(dim.ty.dtype) == str(stand_in.ty.dtype))


def _rebind(kernel: tirx.PrimFunc, stand_in: tirx.Var, var: tirx.Var) -> tirx.PrimFunc | None:
    """``kernel`` with `var` where it has `stand_in`; None if no buffer param has `stand_in` as a dim."""
    for param in kernel.params:
        shape = getattr(param, "shape", None)
        if shape is not None and any(_is_stand_in(d, stand_in) for d in shape):
            buffer = tirx.decl_buffer([var if _is_stand_in(d, stand_in) else d for d in shape], param.dtype,
                                      param.name, strides=param.strides, elem_offset=param.elem_offset,
                                      scope=param.scope(), data_alignment=param.data_alignment,
                                      offset_factor=param.offset_factor)     # all but its shape as it was
            return kernel.specialize({param: buffer})
    return None


@functools.cache
def _environment() -> str:
    """What a stored kernel depends on besides its builder's arguments: kiln's sources, TVM's version
    (those this process imported: it builds with them, whatever the files say later)."""
    import kiln
    return kiln.compiler_fingerprint()


class _Stored:
    """One kernel kept in <library cache>/parsed/<key>-<sha256 of its JSON, 16 digits>.json: written
    whole or not at all (a rename), its sha256 checked on every read; no lock: two processes that
    parse one kernel write the same bytes."""

    def __init__(self, folder: Path, key: str) -> None:
        self.folder, self.key = folder, key

    @classmethod
    def at(cls, builder: str, key: tuple) -> "_Stored | None":
        from kiln.compiler.lib_cache import PARSED, cache_root
        root, text = cache_root(), repr(key)
        if root is None or " at 0x" in text:        # no cache, or an argument printed by its address
            return None
        digest = hashlib.sha256(f"{_environment()}|{builder}|{text}".encode()).hexdigest()[:32]
        return cls(root / PARSED, digest)

    def load(self) -> tirx.PrimFunc | None:
        from kiln.compiler.lib_cache import load_kept, read_checked
        for path in self.folder.glob(f"{self.key}-*.json"):
            if (data := read_checked(path, self.key)) is not None:
                with contextlib.suppress(ValueError, RuntimeError):
                    return load_kept(data.decode())
        return None

    def keep(self, kernel: tirx.PrimFunc) -> None:
        from kiln.compiler.lib_cache import keep_checked
        keep_checked(self.folder, self.key, tvm.ir.save_json(kernel).encode(), ".json")


# TVM's KV-cache kernel builders, by the names relax.frontend.nn.llm.kv_cache calls them by, each with the
# name of its argument that is the cache's symbolic page size (None: none is)
KV_CACHE_BUILDERS = {
    **dict.fromkeys((
        "_kv_cache_transpose_append", "_kv_cache_transpose_append_mla", "_kv_cache_debug_get_kv", "_compact_kv_copy",
        "_compact_kv_copy_cpu", "_attention_decode", "_attention_decode_cpu", "_merge_state_inplace",
        "_merge_state_inplace_cpu", "_attention_prefill", "_attention_prefill_cpu", "_attention_prefill_ragged",
        "_attention_prefill_ragged_cpu", "tree_attn", "tree_attn_cpu", "tree_attn_with_paged_kv_cache",
        "tree_attn_with_paged_kv_cache_cpu", "llama_rope_with_position_map")),
    "_copy_single_page": "page_size", "_copy_single_page_cpu": "page_size", "_copy_single_page_mla": "page_size",
}
_INSTALL = threading.Lock()


def memoize_kv_cache_kernels() -> None:
    """Let TVM's paged KV cache (TIRPagedKVCache, which parses ~15 kernels every time a model is
    exported) take its kernels through ``parsed_once``: its builders in the kv_cache module's namespace
    are replaced, once a process, by memoized ones that return what they would (the page copies, over
    the cache's symbolic page size, come back over the caller's variable)."""
    from tvm.relax.frontend.nn.llm import kv_cache
    with _INSTALL:
        for name, size in KV_CACHE_BUILDERS.items():
            builder = getattr(kv_cache, name, None)
            if builder is not None and not hasattr(builder, "kernels"):
                setattr(kv_cache, name, parsed_once(size)(builder))
