"""Scheduler.stats() (Engine.stats(), read by /metrics from the HTTP thread) while the engine thread
runs: every reading adds up and none raises. Its values against the state are checked after every
step of the scheduler simulations (test_scheduler.check_stats)."""

from __future__ import annotations

import random
import sys
import threading

import pytest

from test_scheduler import make, seq

pytestmark = pytest.mark.unit


def test_stats_read_from_another_thread_never_raise_and_add_up():
    sched, eng = make(total_pages=12, page_size=2, cache=True, max_num_seqs=4, max_tokens_per_step=12)
    rng = random.Random(0)
    eng.rng, eng.stop_prob, eng.sample = rng, 0.1, (lambda s: rng.randint(0, 3))
    readings, errors, done = [], [], threading.Event()

    def scrape() -> None:
        while not done.is_set():
            try:
                readings.append(sched.stats())
            except Exception as e:  # noqa: BLE001  what the test looks for
                errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)              # switch threads as often as the interpreter allows
    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for step in range(1500):
            if step < 1200 and rng.random() < 0.4:
                sched.add(seq(rng.randint(1, 8), max_tokens=rng.randint(1, 6), first=rng.randint(0, 3)))
            eng.step()
        eng.run_until_idle()
    finally:
        done.set()
        scraper.join()
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
    assert len(readings) > 100
    for r in readings:
        assert min(r.kv_pages_used, r.kv_pages_cached, r.kv_pages_free) >= 0
        assert r.kv_pages_used + r.kv_pages_cached + r.kv_pages_free == r.kv_pages_total == 12
    assert any(r.kv_pages_cached for r in readings) and any(r.running for r in readings)
