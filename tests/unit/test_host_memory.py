"""Trimmer: freed host memory goes back to the OS at most every `every_s` seconds (glibc), else nothing;
the trim runs on a thread of its own, never the engine's."""

from __future__ import annotations

import platform
import threading
import time

import numpy as np
import pytest

from kiln.runtime import host_memory
from kiln.runtime.host_memory import Trimmer


def _rss_kb() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_returns_fragmented_free_memory_and_respects_its_interval():
    trimmer = Trimmer(every_s=3600)
    assert trimmer.available and not trimmer.maybe()          # not yet due
    # 200 MB in 200 KB chunks (below glibc's mmap threshold once raised), every other one freed:
    # the holes stay in the heap until trimmed
    np.empty(64 << 20, np.uint8)                              # an mmapped free raises the threshold
    keep, drop = [], []
    for i in range(1000):
        (keep if i % 2 else drop).append(np.ones(200_000, np.uint8))
    drop.clear()
    before = _rss_kb()
    trimmer.every_s = 0
    real, callers = trimmer._trim, []
    trimmer._trim = lambda pad: callers.append(threading.get_ident()) or real(pad)
    done = host_memory._background.done
    assert trimmer.maybe()
    deadline = time.monotonic() + 30
    while host_memory._background.done == done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert callers and threading.get_ident() not in callers   # trimmed, and not on the caller's thread
    assert before - _rss_kb() > 50_000                        # at least 50 MB of the ~100 MB of holes
    del keep


def test_freeze_hides_startup_objects_and_later_garbage_is_still_collected():
    import subprocess
    import sys
    code = """
import gc, weakref
from kiln.runtime.host_memory import freeze_startup_objects
alive = len(gc.get_objects())
frozen = freeze_startup_objects()
assert frozen >= alive * 0.9, (frozen, alive)
assert len(gc.get_objects()) < alive * 0.1           # the collector no longer walks them
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a                              # a cycle made after the freeze
gone = weakref.ref(a)
del a, b
gc.collect()
assert gone() is None                                # still collected
print(frozen)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 1000
