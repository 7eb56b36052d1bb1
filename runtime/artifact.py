"""Artifact loader: reads and validates dist/<name>/ (the compiler/runtime contract).

The runtime reads nothing else. A missing field, a missing file or a file whose
sha256 differs from kiln-config.json is refused with a message naming it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CONFIG_NAME = "kiln-config.json"
SUPPORTED_FORMAT = 1
REQUIRED = ("model", "quantization", "target", "entry_functions", "params", "vocab_size",
            "context_window_size", "prefill_chunk_size", "max_batch_size", "kv_cache", "files")


class ArtifactError(ValueError):
    """An artifact that cannot be used as it is; the message says how to fix it."""


def is_artifact(path: str | Path) -> bool:
    return (Path(path) / CONFIG_NAME).is_file()


@dataclass(frozen=True)
class Artifact:
    path: Path
    config: dict

    @classmethod
    def load(cls, path: str | Path, verify: bool = True) -> "Artifact":
        p = Path(path).expanduser()
        if not p.exists():
            raise ArtifactError(f"no such artifact: {p}. Compile one with `kiln compile MODEL -o {p}`")
        if not (p / CONFIG_NAME).is_file():
            raise ArtifactError(f"{p} is not a kiln artifact (no {CONFIG_NAME}); compile the model "
                                f"with `kiln compile {p}`")
        try:
            config = json.loads((p / CONFIG_NAME).read_text())
        except json.JSONDecodeError as e:
            raise ArtifactError(f"{p / CONFIG_NAME} is not valid JSON ({e}); recompile the artifact") from None
        missing = [k for k in REQUIRED if k not in config]
        if missing:
            raise ArtifactError(f"{p / CONFIG_NAME} lacks fields {missing}; recompile the artifact")
        if config.get("format_version") != SUPPORTED_FORMAT:
            raise ArtifactError(f"{p} has artifact format {config.get('format_version')}, this kiln reads "
                                f"{SUPPORTED_FORMAT}; recompile it with this kiln")
        art = cls(p, config)
        if verify:
            art.verify()
        return art

    def verify(self) -> None:
        """Every file listed in kiln-config.json exists and matches its sha256."""
        for rel, digest in self.config["files"].items():
            f = self.path / rel
            if not f.is_file():
                raise ArtifactError(f"artifact {self.path} is missing {rel}; recompile it")
            if _sha256(f) != digest:
                raise ArtifactError(f"artifact {self.path}: {rel} does not match its hash in {CONFIG_NAME} "
                                    "(edited or corrupted); recompile it with `kiln compile`")

    # -- typed views of the config -------------------------------------------------
    @property
    def name(self) -> str:
        return self.config["model"]["name"]

    @property
    def lib_path(self) -> Path:
        return self.path / self.config["target"]["lib"]

    @property
    def device(self) -> str:
        return self.config["target"]["device"]

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def context_window(self) -> int:
        return int(self.config["context_window_size"])

    def load_params(self) -> list[np.ndarray]:
        """Host arrays in the order of config["params"] (the order the entry functions take them)."""
        return list(self.iter_params())

    def iter_params(self) -> Iterator[np.ndarray]:
        """The same arrays one at a time, each read into its own buffer: a consumer that copies
        each to the device and drops it holds one tensor on the host, not the model (a memory map
        would keep every touched page resident beside the device copies until unmapped)."""
        index = json.loads((self.path / "params" / "tensor-cache.json").read_text())
        by_name = {t["name"]: t for t in index["tensors"]}
        missing = [name for name in self.config["params"] if name not in by_name]
        if missing:
            raise ArtifactError(f"artifact {self.path}: params/tensor-cache.json lacks {missing[0]}; recompile it")
        files = [open(self.path / "params" / s, "rb") for s in index["shards"]]
        try:
            for name in self.config["params"]:
                t = by_name[name]
                buf = np.empty(t["shape"], np.dtype(t["dtype"]))
                files[t["shard"]].seek(t["offset"])
                if files[t["shard"]].readinto(memoryview(buf).cast("B")) != t["nbytes"]:
                    raise ArtifactError(f"artifact {self.path}: shard {index['shards'][t['shard']]} is truncated; "
                                        "recompile it")
                yield buf
        finally:
            for f in files:
                f.close()


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
