"""Weight conversion on every core: results in order, bounded work ahead, errors raised."""

from __future__ import annotations

import threading
import time

import pytest

from kiln.compiler.build import _in_order


def test_parallel_conversion_keeps_order_bounds_work_ahead_and_raises():
    started, lock = [], threading.Lock()

    def fn(x):
        with lock:
            started.append(x)
        time.sleep(0.001 * (x % 3))
        if x == 7:
            raise ValueError("bad weight 7")
        return x * x

    gen = _in_order(fn, list(range(10)), workers=3)
    assert [next(gen) for _ in range(2)] == [0, 1]
    time.sleep(0.05)
    assert len(started) <= 2 + 3                              # consumed + at most `workers` ahead
    with pytest.raises(ValueError, match="bad weight 7"):
        list(gen)
