"""compiler/build.py's background build: a compile that fails on its main thread stops its library's build at the
build's next step (its next pipeline phase's report) instead of leaving it to run on beside later work."""

from __future__ import annotations

import threading
import time

import pytest

from kiln.compiler.build import _Abandoned, _Background, _unless_stopped

pytestmark = pytest.mark.unit


def test_a_stopped_build_gives_up_at_its_next_report():
    reports, started = [], threading.Event()

    def build(stopped):
        report = _unless_stopped(stopped, lambda *args: reports.append(args))
        for phase in range(1000):
            report(f"compile:{phase}", phase, 1000)
            started.set()
            time.sleep(0.01)
        return "built"

    building = _Background(build)
    assert started.wait(10)
    building.stop()
    with pytest.raises(_Abandoned, match="the compile this build belonged to failed"):
        building.result()
    assert 0 < len(reports) < 1000


def test_a_build_left_alone_finishes():
    building = _Background(lambda stopped: "built" if not stopped.is_set() else "stopped")
    assert building.result() == "built"
