"""Linking a cross-built module into a shared library with LLVM's lld, no platform toolchain needed.

TVM's export_library links with the host's C compiler, which cannot link an AArch64 Linux .so or
a macOS .dylib on an x86 Linux machine. lld can, for both: ``ld.lld`` (ELF) and ``ld64.lld``
(Mach-O), from Debian's lld package or any LLVM install. Unresolved symbols (libc, libm, TVM's
runtime) stay undefined and bind when the library is loaded into a process that has TVM.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

# Flavor -> the executable's name, and the flags that make a shared library whose undefined
# symbols bind at load time.
_FLAVORS = {
    "elf": ("ld.lld", ["-shared", "--allow-shlib-undefined"]),
    "macho": ("ld64.lld", ["-dylib", "-undefined", "dynamic_lookup"]),
}
_FIX = "apt-get install lld (or lld-22), or put an LLVM bin/ with {name} on PATH"


def find_lld(flavor: str) -> str | None:
    """The newest lld of this flavor on PATH (ld.lld, ld.lld-22, ...), or None."""
    name = _FLAVORS[flavor][0]
    versioned = [f"{name}-{v}" for v in range(30, 13, -1)]
    return next((path for n in (*versioned, name) if (path := shutil.which(n))), None)


def require_lld(flavor: str, target_name: str) -> None:
    """ToolchainError (one line, naming the fix) when no lld of this flavor is installed."""
    from .profile import ToolchainError
    if find_lld(flavor) is None:
        name = _FLAVORS[flavor][0]
        raise ToolchainError(f"--target {target_name} links its library with {name}, which is not installed: "
                             + _FIX.format(name=name))


def lld_exporter(flavor: str, extra: list[str] | None = None) -> Callable[[Any, Path], None]:
    """An exporter (TargetProfile.exporter) linking the module's objects with lld."""
    def export(executable: Any, path: Path) -> None:
        def fcompile(output: str, objects: list[str], **_kwargs) -> None:
            lld = find_lld(flavor)
            if lld is None:
                raise RuntimeError(f"{_FLAVORS[flavor][0]} disappeared during the build")
            name = ["-install_name", f"@rpath/{path.name}"] if flavor == "macho" else ["-soname", path.name]
            cmd = [lld, *_FLAVORS[flavor][1], *name, *(extra or []), "-o", output, *objects]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"linking {Path(output).name} failed: {done.stderr.strip()}")
        executable.export_library(str(path), fcompile=fcompile)
    return export
