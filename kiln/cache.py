"""The compile-on-first-use cache: what it holds, and cleaning it (`kiln cache list|clean`).

Entries live in <cache_dir>/artifacts/<key>-<quant>-<target>/, keyed by the model's content,
the compiler and the tuning database (kiln.ensure_artifact). A new key for the same model,
quantization and target (after `kiln tune`, an edited checkout or an upgrade) supersedes the
old entry, which `supersede` removes as soon as the new one is whole, so entries do not pile up.
Each reuse touches the entry, so `clean --older-than` goes by last use.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from kiln.runtime.contract import CONFIG_NAME


@dataclass(frozen=True)
class Entry:
    path: Path
    model: str                  # the source's file or folder name
    source_hash: str
    quant: str
    target: str
    bytes: int
    last_used: float            # seconds since the epoch

    @property
    def identity(self) -> tuple[str, str, str]:
        """What two entries must share for one to supersede the other."""
        return self.source_hash, self.quant, self.target


def artifacts_dir() -> Path:
    from kiln import cache_dir
    return cache_dir() / "artifacts"


def entries() -> list[Entry]:
    """Every whole entry in the cache, least recently used first (partial writes are skipped)."""
    found = []
    root = artifacts_dir()
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        try:
            c = json.loads((d / CONFIG_NAME).read_text())
            found.append(Entry(d, c["model"]["source"].get("path") or c["model"]["name"],
                               c["model"]["source"]["content_hash"], c["quantization"]["name"], c["target"]["name"],
                               sum(f.stat().st_size for f in d.rglob("*") if f.is_file()), d.stat().st_mtime))
        except (OSError, ValueError, KeyError):
            continue
    return sorted(found, key=lambda e: e.last_used)


def touch(path: Path) -> None:
    """Mark an entry used now (what `clean --older-than` goes by)."""
    try:
        path.touch()
    except OSError:
        pass                    # a read-only cache still serves


def supersede(new: Path) -> list[Path]:
    """Remove the entries `new` replaces (same model content, quantization and target); returns them."""
    current = next((e for e in entries() if e.path == new), None)
    if current is None:
        return []
    old = [e.path for e in entries() if e.identity == current.identity and e.path != new]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return old


def clean(older_than_s: float | None = None) -> list[Entry]:
    """Remove every entry (or those unused for `older_than_s` seconds); returns what was removed."""
    cutoff = time.time() - older_than_s if older_than_s is not None else float("inf")
    removed = [e for e in entries() if e.last_used < cutoff]
    for e in removed:
        shutil.rmtree(e.path, ignore_errors=True)
    return removed


def parse_age(text: str) -> float:
    """'90s', '30m', '12h', '7d' or '2w' -> seconds; ValueError naming the format otherwise."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    number, unit = text[:-1], text[-1:].lower()
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or value < 0:
        raise ValueError(f"--older-than {text!r} is not an age; write a number and a unit: 90s, 30m, 12h, 7d or 2w")
    return value * units[unit]
