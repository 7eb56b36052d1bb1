"""Sliding windows with no model: which TVM mode an artifact's layer kinds pick, how many tokens one
forward may append, the page cap of a per-sequence window, and a scheduler that bounds chunks and
never shares windowed KV (no forks, no prefix cache)."""

from __future__ import annotations

import pytest

from kiln.runtime.contract import KVCacheLayout
from kiln.runtime.kv_pages import PageAccountant
from kiln.runtime.scheduler import Scheduler, SchedulerConfig
from kiln.runtime.sequence import Sequence
from kiln.runtime.sliding_window import SlidingWindow

pytestmark = pytest.mark.unit


def layout(*kinds: str, window: int | None = 16) -> KVCacheLayout:
    return KVCacheLayout(16, len(kinds), 2, 16, "float32", layer_kinds=kinds, sliding_window=window)


def test_layer_kinds_pick_the_mode():
    assert SlidingWindow.of(layout("full", "full", window=None)) is None
    assert SlidingWindow.of(KVCacheLayout(16, 2, 2, 16, "float32")) is None          # no kinds recorded: full
    assert SlidingWindow.of(layout("sliding", "sliding")) == SlidingWindow(16, per_sequence=True)
    assert SlidingWindow.of(layout("full", "sliding")) == SlidingWindow(16, per_sequence=False)
    with pytest.raises(ValueError, match="too small"):
        SlidingWindow(1, per_sequence=True)


def test_chunk_bounds():
    seq, layer = SlidingWindow(16, per_sequence=True), SlidingWindow(16, per_sequence=False)
    # Per sequence: any chunk that ends within the window, then one token at a time.
    assert [seq.max_chunk(n) for n in (0, 5, 15, 16, 40)] == [16, 11, 1, 1, 1]
    assert seq.kept == 15 and seq.attention_sink == 0
    # Per layer: new tokens see each other unwindowed, and a row seeing no cached key is NaN.
    assert {layer.max_chunk(n) for n in (0, 15, 100)} == {15}


def test_per_sequence_window_caps_pages():
    window = SlidingWindow(16, per_sequence=True)
    assert window.max_pages(16) == 2 and window.max_pages(4) == 5 and SlidingWindow(16, False).max_pages(16) is None
    acc = PageAccountant(total_pages=5, page_size=4, max_pages_per_seq=window.max_pages(4))
    assert [acc.pages_needed(n) for n in (0, 4, 16, 17, 20, 1000)] == [0, 1, 4, 5, 5, 5]
    assert acc.can_allocate(10_000)
    acc.allocate(1, 3)
    with pytest.raises(RuntimeError, match="cannot be forked"):
        acc.can_fork(1, 2, 3)
    with pytest.raises(RuntimeError, match="cannot be forked"):
        acc.fork(1, 2, 2)


def _run(sched: Scheduler, steps: int = 500) -> list[list[tuple[int, int, int]]]:
    """Step the scheduler with a fake forward; returns each step's (seq, start, end) chunks."""
    log = []
    for _ in range(steps):
        if not sched.has_work:
            break
        batch = sched.schedule()
        assert not batch.forks
        sched.update(batch)
        log.append([(c.seq.seq_id, c.start, c.end) for c in batch.chunks])
        for c in batch.chunks:
            seq = c.seq
            if c.needs_logits:
                seq.output_ids.append(7)
                if len(seq.output_ids) == seq.max_tokens:
                    assert sched.finish(seq, "length") == [seq.seq_id]
    return log


@pytest.mark.parametrize("per_sequence", [True, False])
def test_scheduler_bounds_chunks_and_never_forks(per_sequence):
    window = SlidingWindow(16, per_sequence)
    pages = PageAccountant(total_pages=64, page_size=4, max_pages_per_seq=window.max_pages(4))
    sched = Scheduler(SchedulerConfig(max_tokens_per_step=40, enable_prefix_cache=False, sliding_window=window),
                      pages)
    prompt = list(range(50))
    sched.add(Sequence(0, prompt, max_tokens=30))
    sched.add(Sequence(1, prompt, max_tokens=30, fork_from=(0, 49)))     # an n > 1 sibling: prefilled, not forked
    sched.add(Sequence(2, prompt[:9], max_tokens=30))
    log = _run(sched)
    assert not sched.has_work and pages.used_pages == 0
    computed = {0: 0, 1: 0, 2: 0}
    for step in log:
        for sid, start, end in step:
            assert start == computed[sid] and end - start <= window.max_chunk(start)
            computed[sid] = end
    assert computed == {0: 79, 1: 79, 2: 38}                          # every prompt token computed by each


def test_scheduler_refuses_prefix_cache_with_a_window():
    with pytest.raises(ValueError, match="enable_prefix_cache=False"):
        SchedulerConfig(sliding_window=SlidingWindow(16, per_sequence=True))
