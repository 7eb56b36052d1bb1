"""Writing an artifact: the layout is the contract's (kiln.runtime.contract); this module decides
whether a destination may be written and writes it atomically.

`check_output` runs before any model is read: a destination is a new path, an empty directory,
or a previous kiln artifact (recognised by its kiln-config.json) that the caller asked to
replace (`force`); a file, a directory holding anything else, or the current directory (or one
of its parents) is refused, so a compile never deletes what it did not write.

`staged_artifact` writes into a staging directory beside the destination and swaps it into place
at the end with one atomic exchange (Linux renameat2 RENAME_EXCHANGE; elsewhere two renames): an
interrupted compile (Ctrl-C, kill -9) leaves the old artifact whole, and a later compile removes
staging directories whose writer has died.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from kiln.runtime.contract import CONFIG_NAME

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class OutputError(ValueError):
    """A destination a compile must not write: says which path and what to do instead."""


def check_output(dest: Path, force: bool = False) -> None:
    """Raise OutputError unless writing an artifact at `dest` loses nothing the user did not ask to replace."""
    path = dest.expanduser().absolute()
    cwd = Path.cwd().absolute()
    if path == cwd or path in cwd.parents:
        raise OutputError(f"-o {dest} is the current directory (or holds it); a compile replaces its output "
                          "directory whole. Pass a new path, e.g. -o dist/my-model")
    if not os.path.lexists(path):
        return
    if not path.is_dir():
        raise OutputError(f"{dest} exists and is not a directory; pass a new path for the artifact directory")
    if not any(path.iterdir()):
        return
    if not (path / CONFIG_NAME).is_file():
        raise OutputError(f"{dest} is a directory that is not a kiln artifact (no {CONFIG_NAME}); kiln replaces "
                          "only its own artifacts. Pass a new or empty path")
    if not force:
        raise OutputError(f"{dest} already holds a kiln artifact; pass --force to replace it, or -o another path")


@contextmanager
def staged_artifact(dest: Path) -> Iterator[Path]:
    """Yield a staging dir; on success it replaces `dest` atomically, on failure it is removed."""
    dest = dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_stages(dest)
    stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-{os.getpid()}-", dir=dest.parent))
    stage.chmod(0o755)
    try:
        yield stage
        if dest.exists() and _exchange(stage, dest):
            shutil.rmtree(stage, ignore_errors=True)        # now holds the previous artifact
            return
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


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (Linux renameat2); False where the call is unavailable."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0


def _remove_dead_stages(dest: Path) -> None:
    """Staging directories of `dest` left by a compile that was killed (its pid no longer runs)."""
    for stale in dest.parent.glob(f".{dest.name}.partial-*-*"):
        pid = stale.name[len(f".{dest.name}.partial-"):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
