"""TVM's runtime for kiln: imported with torch hidden, and the artifact's device opened.

The runtime uses `tvm.runtime` only (never tvm.relax or other compiler pieces), so an
artifact runs on a runtime-only TVM (`TVM_USE_RUNTIME_LIB=1`, or a wheel without
libtvm_compiler), which is what an app ships.

tvm_ffi imports torch whenever it is installed (for its torch-tensor conversions): about
200 MB of resident memory and a second of start-up in every serving process, though the
runtime hands TVM only numpy arrays and TVM tensors. A later ``import torch`` (xgrammar's
token bitmask, transformers in tests) still works; only tvm_ffi's torch conversions stay off.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import tempfile
from pathlib import Path

if "tvm_ffi" not in sys.modules and "torch" not in sys.modules:
    sys.modules["torch"] = None                    # makes tvm_ffi's `import torch` fail softly
    try:
        import tvm
    finally:
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]
else:
    import tvm

import tvm.runtime.vm  # noqa: E402,F401  (tvm.runtime does not import its vm submodule itself)
import tvm_ffi  # noqa: E402,F401  (imported by tvm above, torch hidden: Python functions the VM calls register here)
from tvm.libinfo import package_lib_paths  # noqa: E402

from .contract import ArtifactError  # noqa: E402

# What a device's runtime needs from the system, named when its TVM sidecar fails to load.
_DRIVERS = {"cuda": "the NVIDIA driver", "rocm": "ROCm (HIP)", "vulkan": "a Vulkan driver and loader",
            "opencl": "an OpenCL driver and ICD loader", "metal": "macOS with Metal"}
_sidecars: dict[str, ctypes.CDLL] = {}            # device kind -> its loaded libtvm_runtime_<kind>
_first: dict[str, tuple] = {}                    # library path -> its file's identity when this process first loaded it
_private: dict[tuple, str] = {}                  # (path, a later identity) -> the private link that file loads from
_private_dir: list[tempfile.TemporaryDirectory] = []


def load_library(path: Path) -> tvm.runtime.Module:
    """The artifact library at `path`, loaded. The dynamic loader keeps a library by its path for the process's
    life and hands that one out again for the same path, even after the file was replaced (an artifact recompiled
    with --force into the same folder, in a notebook or a test): a path whose file changed since this process
    first loaded it is loaded from a private link (or copy) of the new file, so its own functions run."""
    key = str(Path(path).resolve())
    st = os.stat(key)
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if _first.setdefault(key, identity) == identity:
        return tvm.runtime.load_module(key)
    if (key, identity) not in _private:
        if not _private_dir:
            _private_dir.append(tempfile.TemporaryDirectory(prefix="kiln-libs-"))
        fresh = str(Path(_private_dir[0].name) / f"{len(_private)}-{Path(key).name}")
        try:
            os.link(key, fresh)
        except OSError:                             # another file system
            shutil.copyfile(key, fresh)
        _private[key, identity] = fresh
    return tvm.runtime.load_module(_private[key, identity])


def open_device(kind: str, index: int = 0) -> tvm.runtime.Device:
    """The device an artifact runs on, its TVM runtime loaded first; ArtifactError if it cannot be had.

    The full TVM loads the device runtimes it finds at import time (silently skipping
    those whose driver is missing); a runtime-only TVM loads none. Either way, a device
    kind whose runtime is not registered gets its sidecar library loaded here.
    """
    if kind != "cpu" and tvm.get_global_func(f"device_api.{kind}", allow_missing=True) is None:
        _load_sidecar(kind)
    try:
        device = tvm.runtime.device(kind, index)
        exists = device.exist
    except Exception as e:  # an unknown kind, or a device API that failed to start
        raise ArtifactError(f"the artifact runs on {kind}, which TVM cannot open here: "
                            f"{str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}") from None
    if not exists:
        raise ArtifactError(f"the artifact runs on {kind}, but this machine has no {kind} device {index}; "
                            f"compile it for this machine (e.g. `kiln compile MODEL --target cpu`)")
    return device


def _load_sidecar(kind: str) -> None:
    name = f"tvm_runtime_{kind}"
    filename = {"darwin": f"lib{name}.dylib", "win32": f"{name}.dll"}.get(sys.platform, f"lib{name}.so")
    found = [d / filename for d in package_lib_paths() if (d / filename).is_file()]
    if not found:
        raise ArtifactError(f"the artifact runs on {kind}, but this TVM has no {kind} runtime ({filename} is "
                            f"not in {Path(tvm.__file__).parent / 'lib'}); install a TVM built with {kind}")
    try:
        _sidecars[kind] = ctypes.CDLL(str(found[0]), ctypes.RTLD_LOCAL)
    except OSError as e:
        need = _DRIVERS.get(kind, f"the {kind} driver")
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ArtifactError(f"the artifact runs on {kind}, but TVM's {kind} runtime ({filename}) cannot load: "
                            f"{reason}. Install {need}, or compile the model for this machine "
                            f"(e.g. `kiln compile MODEL --target cpu`)") from None


__all__ = ["load_library", "open_device", "tvm"]
