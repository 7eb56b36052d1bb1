"""Trimmer: freed host memory goes back to the OS at most every `every_s` seconds (glibc), else nothing."""

from __future__ import annotations

import platform

import numpy as np
import pytest

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
    assert trimmer.maybe()
    assert before - _rss_kb() > 50_000                        # at least 50 MB of the ~100 MB of holes
    del keep
