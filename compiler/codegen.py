"""Code generation on every core: relax.build's steps with the kernels compiled as parts on threads.

relax.build generates the VM's bytecode, then compiles every kernel (PrimFunc) as one TIR module:
one module of machine code, optimized and later emitted as one object file, on one thread. Where the
kernels are host code those two steps are most of a compile (SmolLM2 q0f32: ~6 s each here). TVM's
code generation releases the GIL, so a profile whose library is host code alone
(TargetProfile.codegen_parts) has its kernels cut into that many modules, each built on a thread of
its own: the first part's module imports the others, the VM links to it (calls reach every kernel
through the imports), and exporting writes each part's object on its own thread before one link.

The number of parts is the profile's, so the library is the same on any number of cores; as many
of them as the process has cores build at once. Smaller modules also optimize faster: SmolLM2 q0f32 on 2 cores, 8 parts:
build 6.1 -> 2.9 s, export 5.6 -> 2.5 s.

Given the library cache's kernel objects (lib_cache.KernelObjects), every kernel is a part of its
own, and a kernel whose object an earlier build kept is not compiled at all: the export links that
object (SmolLM2 q0f32 cold: 6.3 s against 5.9 s with 8 parts; another quantization of it compiles
only the kernels it does not share).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tvm
from tvm import relax, tirx
from tvm.relax import vm_build

from kiln.models.source import usable_cores

from .lib_cache import KernelObjects


def build(lowered: tvm.IRModule, target: tvm.target.Target, system_lib: bool, parts: int = 1,
          objects: KernelObjects | None = None):
    """relax.build(lowered, target=target, relax_pipeline=None, system_lib=system_lib): the same
    executable, its kernels compiled as `parts` modules on threads. 1, a system library or a module
    carrying external modules (relax.build links those its own way): relax.build itself.

    `objects` (a parted build only): each kernel is a module of its own, those whose object the cache
    holds are not compiled (the executable's export links the kept objects, and keeps the new ones),
    so only an export reaches them: the executable's `reused` says how many."""
    attrs = lowered.attrs or {}
    if parts <= 1 or system_lib or attrs.get("external_mods") or attrs.get("system_lib_prefix"):
        return relax.build(lowered, target=target, relax_pipeline=None, system_lib=system_lib)
    params = dict(attrs.get("const_name_to_constant", {}))
    builder = relax.ExecBuilder()
    rest = vm_build._vmcodegen(builder, lowered, "bytecode")
    kernels = [(gv, f) for gv, f in rest.functions_items() if isinstance(f, tirx.PrimFunc)]
    if not kernels:
        return relax.build(lowered, target=target, relax_pipeline=None, system_lib=system_lib)
    kept: dict[str, tuple[tvm.IRModule, bytes]] = {}
    if objects is None:
        modules = [tvm.IRModule(dict(kernels[i::parts]), attrs=rest.attrs) for i in range(min(parts, len(kernels)))]
        keys = [None] * len(modules)
    else:
        alone = [tvm.IRModule({gv: f}, attrs=rest.attrs) for gv, f in kernels]
        all_keys = [objects.key(module) for module in alone]
        found = objects.lookup(all_keys)
        modules, keys = [], []
        for module, key in zip(alone, all_keys):
            if key in found:
                kept[key] = (module, found[key])
            else:
                modules.append(module)
                keys.append(key)
        if not modules:                            # every kernel kept: the VM still links to a module
            modules, keys = [tvm.IRModule({}, attrs=rest.attrs)], [None]
    libs = _on_threads(lambda module: tirx.build(module, target=target), modules)
    for other in libs[1:]:
        libs[0].import_module(other)
    return _Executable(relax._ffi_api.VMLink(builder, target, libs[0], [], params),
                       target, objects, list(zip(libs, keys)), kept)


def _on_threads(fn, items: list) -> list:
    """[fn(item) for item in items] on a thread per usable core (at most one per item), under the
    caller's PassContext (TVM keeps the current one per thread); the first error is raised here and
    the items not yet started are dropped."""
    ctx = tvm.transform.PassContext.current()

    def run(item):
        with ctx:
            return fn(item)

    pool = ThreadPoolExecutor(min(usable_cores(), len(items)), thread_name_prefix="kiln-codegen")
    try:
        return list(pool.map(run, items))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class _Executable(relax.VMExecutable):
    """A VM executable whose library is several modules: export_library writes their objects on
    threads (TVM's writes one after another), then packs the VM's part and links as TVM's does, with
    the kernel objects build() found kept (and keeps the ones it wrote)."""

    def __init__(self, mod, target: tvm.target.Target, objects: KernelObjects | None,
                 parts: list[tuple[tvm.runtime.Module, str | None]], kept: dict[str, tuple[tvm.IRModule, bytes]]):
        super().__init__(mod)
        self.target, self.objects = target, objects
        self.parts = parts                  # the compiled modules, each with its kernel's key (None: several, none)
        self.kept = kept                    # kernels not compiled: their module and kept object, by key

    @property
    def reused(self) -> int:
        return len(self.kept)

    def export_library(self, file_name, *, fcompile=None, addons=None, workspace_dir=None, **kwargs):
        from tvm.support import cc, tar, utils

        file_name, fmt = str(file_name), getattr(fcompile, "object_format", "o")
        known = fcompile is not None or file_name.endswith((".so", ".dylib", ".tar"))
        tvms_own = not known or any(m.kind == "c" for m in self.mod._collect_dso_modules())   # e.g. C source
        if tvms_own or fmt != "o":
            self._compile_kept()                   # the kept objects cannot be linked there
        if tvms_own:
            return super().export_library(file_name, fcompile=fcompile, addons=addons,
                                          workspace_dir=workspace_dir, **kwargs)
        if workspace_dir is None:
            workspace = utils.tempdir()
            workspace_dir = workspace.temp_dir
        written = [os.path.join(workspace_dir, f"lib{i}.{fmt}") for i in range(len(self.parts))]
        _on_threads(lambda pair: pair[0].write_to_file(pair[1]),
                    [(module, path) for (module, _), path in zip(self.parts, written)])
        copied = [os.path.join(workspace_dir, f"kept{i}.{fmt}") for i in range(len(self.kept))]
        for path, (_, data) in zip(copied, self.kept.values()):
            Path(path).write_bytes(data)
        packed = os.path.join(workspace_dir, f"devc.{fmt}")
        triple = self.parts[0][0].get_function("_get_target_string")()
        tvm.runtime._ffi_api.ModulePackImportsToLLVM(self.mod, False, triple, "").write_to_file(packed)
        fcompile = fcompile or (tar.tar if file_name.endswith(".tar") else cc.create_shared)
        linked = fcompile(file_name, [*(addons or []), *written, *copied, packed], **kwargs)
        if self.objects is not None and fmt == "o":
            for (_, key), path in zip(self.parts, written):
                if key is not None:
                    self.objects.keep(key, Path(path).read_bytes())
        return linked

    def _compile_kept(self) -> None:
        """Compile the kept kernels after all, for an export that cannot link their objects."""
        if self.kept:
            libs = _on_threads(lambda module: tirx.build(module, target=self.target),
                               [module for module, _ in self.kept.values()])
            for lib in libs:
                self.parts[0][0].import_module(lib)
            self.parts, self.kept = [*self.parts, *((lib, None) for lib in libs)], {}
