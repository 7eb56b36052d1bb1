"""The artifact writer: dist/<name>/ as DESIGN.md's contract describes it.

    kiln-config.json   metadata + sha256 of every other file
    lib.<so|tar|...>   the compiled module
    params/            tensor-cache.json + shard-NNN.bin (raw little-endian tensors)
    tokenizer files

Everything is written into a staging directory beside the destination and
renamed into place at the end: an interrupted compile leaves no half-written
artifact, and an existing artifact is replaced only once the new one is whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

CONFIG_NAME = "kiln-config.json"
FORMAT_VERSION = 1
SHARD_BYTES = 64 << 20


class ParamWriter:
    """Appends tensors to ~64 MB shards; only the tensor being written is held in memory."""

    def __init__(self, params_dir: Path):
        self.dir = params_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.tensors: list[dict] = []
        self.shards: list[str] = []
        self._fh = None
        self._size = 0

    def add(self, name: str, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array)
        if self._fh is None or (self._size and self._size + data.nbytes > SHARD_BYTES):
            self._open_shard()
        self.tensors.append({"name": name, "dtype": str(data.dtype), "shape": list(data.shape),
                             "shard": len(self.shards) - 1, "offset": self._size, "nbytes": data.nbytes})
        self._fh.write(data.tobytes())
        self._size += data.nbytes

    def _open_shard(self) -> None:
        if self._fh:
            self._fh.close()
        self.shards.append(f"shard-{len(self.shards):03d}.bin")
        self._fh = open(self.dir / self.shards[-1], "wb")
        self._size = 0

    def close(self) -> None:
        if self._fh:
            self._fh.close()
        index = {"format": "kiln-tensors-1", "shards": self.shards, "tensors": self.tensors}
        (self.dir / "tensor-cache.json").write_text(json.dumps(index, indent=1))


def sha256_file(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under root except kiln-config.json, by relative path."""
    return {str(p.relative_to(root)): sha256_file(p)
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != CONFIG_NAME}


def write_config(root: Path, config: dict) -> None:
    config = dict(config, format_version=FORMAT_VERSION, files=file_hashes(root))
    (root / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=False))


@contextmanager
def staged_artifact(dest: Path) -> Iterator[Path]:
    """Yield a staging dir; on success it replaces `dest` atomically, on failure it is removed."""
    dest = dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    stage.chmod(0o755)
    try:
        yield stage
        old = None
        if dest.exists():
            old = dest.parent / f".{dest.name}.old-{os.getpid()}"
            os.replace(dest, old)
        os.replace(stage, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
