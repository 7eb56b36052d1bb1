"""Artifact loader: dist/<name>/ read and validated through the contract (runtime/contract.py).

The runtime reads nothing else. A missing field, a missing file or a file whose
sha256 differs from kiln-config.json is refused with a message naming it.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .contract import CONFIG_NAME, ArtifactConfig, ArtifactError, iter_params, read_config, verify_files


def is_artifact(path: str | Path) -> bool:
    return (Path(path) / CONFIG_NAME).is_file()


_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}
# CPU features an artifact's target may add beyond its architecture's baseline (its mattr), and how
# Linux says a CPU has them: (AT_HWCAP bit, what it is). `--decode-activations int8` adds "+dotprod"
# to the AArch64 targets (targets/cpu); without it its kernels stop on an illegal instruction.
_HWCAP_FEATURES = {"+dotprod": (1 << 20, "the ARMv8.2 dot product (asimddp)")}


def _hwcap() -> int | None:
    """The kernel's AT_HWCAP bits for this process (Linux); None where there are none to read."""
    import ctypes
    try:
        getauxval = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError):
        return None
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    return int(getauxval(16)) or None                    # AT_HWCAP


def check_host(artifact: "Artifact") -> None:
    """ArtifactError, in one line, when a CPU artifact was built for another machine: another
    architecture (an android or aarch64 build on x86), or a static library meant for an app build."""
    t = artifact.config.target
    triple = t.tvm_target.get("mtriple") if t.tvm_target.get("kind") == "llvm" else None
    where = f"{t.name} ({triple})" if triple else t.name
    if triple:
        arch = _ARCH_ALIASES.get(triple.split("-")[0].lower(), triple.split("-")[0].lower())
        host = _ARCH_ALIASES.get(platform.machine().lower(), platform.machine().lower())
        if arch != host:
            raise ArtifactError(f"this artifact is for {where}; this machine is {host}. Run it on that device, "
                                "or compile the model for this machine: `kiln compile MODEL --target cpu`")
        needs = [f for f in t.tvm_target.get("mattr", []) if f in _HWCAP_FEATURES]
        hwcap = _hwcap() if needs and arch == "aarch64" else None
        lacking = [_HWCAP_FEATURES[f][1] for f in needs if hwcap is not None and not hwcap & _HWCAP_FEATURES[f][0]]
        if lacking:
            raise ArtifactError(f"this artifact ({where}) needs {', '.join(lacking)}, which this CPU lacks; "
                                "recompile it without --decode-activations int8")
    if not t.lib.endswith((".so", ".dylib", ".dll")):
        raise ArtifactError(f"this artifact's library ({t.lib}) is a static library for an app build ({where}), "
                            "not loadable here; compile with `--target cpu` to run it on this machine")


@dataclass(frozen=True)
class Artifact:
    path: Path
    config: ArtifactConfig

    @classmethod
    def load(cls, path: str | Path, verify: bool = True) -> "Artifact":
        p = Path(path).expanduser()
        if not p.exists():
            raise ArtifactError(f"no such artifact: {p}. Compile one with `kiln compile MODEL -o {p}`")
        art = cls(p, read_config(p))
        if verify:
            art.verify()
        return art

    def verify(self) -> None:
        """Every file listed in kiln-config.json exists and matches its sha256."""
        verify_files(self.path, self.config)

    # -- typed views of the config -------------------------------------------------
    @property
    def name(self) -> str:
        return self.config.model.name

    @property
    def lib_path(self) -> Path:
        return self.path / self.config.target.lib

    @property
    def device(self) -> str:
        return self.config.target.device

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def context_window(self) -> int:
        return self.config.context_window_size

    def load_params(self) -> list[np.ndarray]:
        """Host arrays in the order of config.params (the order the entry functions take them)."""
        return list(self.iter_params())

    def iter_params(self) -> Iterator[np.ndarray]:
        """The same arrays one at a time (see contract.iter_params)."""
        return iter_params(self.path, self.config.params)


__all__ = ["Artifact", "ArtifactError", "is_artifact"]
