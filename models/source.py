"""Where a model's config and weights come from: an HF directory, a GGUF file or an ONNX export.

A `ModelSource` is what `kiln.models.load(path)` returns. The compiler reads
weights by their Hugging Face names, in Hugging Face layout, whatever the file
format on disk: loaders translate names and layouts (GGUF's permuted Q/K rows,
for one) so that model definitions see one convention.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Protocol

import numpy as np


_HASH_BLOCK = 1 << 26         # 64 MiB


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def content_hash(files: list[Path]) -> str:
    """sha256 over each file's name and the sha256 of each 64 MiB block of its bytes, in order: what
    a compiled model is keyed by. The blocks are hashed on every core (hashlib releases the GIL):
    one sha256 over the bytes took ~11 s for an 8B checkpoint's 16 GB."""
    from concurrent.futures import ThreadPoolExecutor

    def block(item: tuple[Path, int]) -> bytes:
        path, start = item
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            fh.seek(start)
            left = _HASH_BLOCK
            while left and (chunk := fh.read(min(left, 1 << 20))):
                h.update(chunk)
                left -= len(chunk)
        return h.digest()

    h = hashlib.sha256()
    with ThreadPoolExecutor(usable_cores(), thread_name_prefix="kiln-hash") as pool:
        for f in files:
            h.update(f.name.encode())
            for digest in pool.map(block, [(f, start) for start in range(0, max(f.stat().st_size, 1), _HASH_BLOCK)]):
                h.update(digest)
    return h.hexdigest()


class ModelLoadError(ValueError):
    """A model path that cannot be read: says what is wrong and how to fix it."""


class WeightSource(Protocol):
    """Tensors by Hugging Face name, in Hugging Face layout (Linear weights [out, in])."""

    def names(self) -> list[str]:
        """Every tensor name the source holds."""
        ...

    def get(self, name: str) -> np.ndarray:
        """One tensor as float32 or float16 numpy (bf16 and quantized types are widened to float32)."""
        ...


@dataclass
class ModelSource:
    """A loaded (not yet compiled) model: its HF-style config, weights and tokenizer."""

    path: Path
    format: str                       # "hf" | "gguf" | "onnx"
    hf_config: dict                   # config.json-style dict (model_type, hidden_size, ...)
    weights: WeightSource
    write_tokenizer: Callable[[Path], list[str]] | None = None  # writes tokenizer files into a dir, returns names
    content_hash: str = ""            # sha256 over config and weight files
    notes: list[str] = field(default_factory=list)
    stored_quant: str | None = None   # "GGUF", "GPTQ", "AWQ", "compressed-tensors", "MXFP4", "bitsandbytes": weights
                                      # stored quantized
                                      # (what --quant as-stored keeps)
    adapter: str | None = None        # the LoRA adapter merged into the weights (models/lora.py), its folder

    def iter_weights(self) -> Iterator[tuple[str, np.ndarray]]:
        for name in self.weights.names():
            yield name, self.weights.get(name)
