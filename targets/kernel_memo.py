"""Hand-written kernels parsed once a process.

A kernel written in TVMScript is parsed from its Python source every time its builder runs: 0.1-0.3 s
a kernel, 2.5 s of a tiny Llama's 4.4 s pipeline on the CPU (16 GEMVs, 4 attention kernels), paid
again by every compile in the process (the test suite's hundred, a `kiln compile` for several
quantizations). A builder is a pure function of its arguments (sizes, dtypes, flags, module
constants) and TVM's IR is immutable, so one PrimFunc serves every module that asks for the same
arguments: ``parsed_once`` keeps it. The key holds the builder's module constants (its upper-case
globals) beside the arguments: tools/gpu_builds.py's variants set knobs such as
decode_attention.MIN_SPLIT for a build and put them back after.

A kernel over a symbolic size (the call's rows: a ``tirx.Var`` of the caller's function, which its
buffers must share) is parsed once over a variable of that dtype kept here, and each caller gets it
over its own variable: ``PrimFunc.specialize`` with the first buffer param sized by it rebinds the
variable everywhere (the other params, the body). The result is structurally the kernel a fresh parse
over the caller's variable gives (tests/compiler/test_kernel_memo.py).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading

from tvm import tirx


def parsed_once(size: str | None = None):
    """Decorate a kernel builder to build once per distinct arguments. ``size``: the name of the
    builder's argument that may be a symbolic size (a tirx.Var); an int or None there is a key
    like any other."""

    def wrap(builder):
        signature = inspect.signature(builder)
        module = sys.modules[builder.__module__]
        kernels: dict = {}
        lock = threading.Lock()

        @functools.wraps(builder)
        def build(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            var = bound.arguments.get(size) if size else None
            if isinstance(var, tirx.Var):
                bound.arguments[size] = _stand_in(str(var.ty.dtype))
            key = (tuple(bound.arguments.items()), _constants(module))
            with lock:
                kernel = kernels.get(key)
            if kernel is None:
                kernel = builder(*bound.args, **bound.kwargs)
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


def _constants(module) -> tuple:
    """The module's upper-case globals that are plain values (the knobs a kernel is parsed with)."""
    return tuple((name, value) for name, value in vars(module).items()
                 if name.isupper() and isinstance(value, (int, float, str, tuple)))


_STAND_INS: dict[str, tirx.Var] = {}


def _stand_in(dtype: str) -> tirx.Var:
    """The variable kernels over a symbolic size of `dtype` are parsed over (one a dtype)."""
    return _STAND_INS.setdefault(dtype, tirx.Var("rows", dtype))


def _rebind(kernel: tirx.PrimFunc, stand_in: tirx.Var, var: tirx.Var) -> tirx.PrimFunc | None:
    """``kernel`` with `var` where it has `stand_in`; None if no buffer param has `stand_in` as a dim."""
    for param in kernel.params:
        shape = getattr(param, "shape", None)
        if shape is not None and any(d.same_as(stand_in) for d in shape):
            buffer = tirx.decl_buffer([var if d.same_as(stand_in) else d for d in shape], param.dtype, param.name)
            return kernel.specialize({param: buffer})
    return None
