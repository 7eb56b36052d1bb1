"""peak_rss_mb (runtime/bench.py): `kiln bench`'s peak RSS is its own process's, not also that of the
script that spawned it (tools/compare_llamacpp.py spawns `kiln bench` after loading transformers' model:
ru_maxrss reported 1,407 MB there for a run that peaks at 480 MB alone)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kiln.runtime.bench import peak_rss_mb

pytestmark = pytest.mark.unit

HOG_MB = 512


def test_a_spawned_process_reports_its_own_peak_not_its_parents():
    hog = bytearray(HOG_MB * 2**20)
    hog[::4096] = b"\1" * len(hog[::4096])                    # touch every page: resident
    parent = peak_rss_mb()
    assert parent >= HOG_MB
    code = "from kiln.runtime.bench import peak_rss_mb; print(peak_rss_mb())"
    child = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout.split()[-1])
    del hog
    assert 0 < child < parent - HOG_MB / 2, (child, parent)
