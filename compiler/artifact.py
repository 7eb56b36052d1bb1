"""Writing an artifact: the layout is the contract's (kiln.runtime.contract); this module adds the
atomic write.

Everything is written into a staging directory beside the destination and
renamed into place at the end: an interrupted compile leaves no half-written
artifact, and an existing artifact is replaced only once the new one is whole.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


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
