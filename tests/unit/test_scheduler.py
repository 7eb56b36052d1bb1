"""Scheduler: continuous batching, chunked prefill, preemption, abort, forks and prefix reuse, with no model.

FakeEngine plays the engine's step against a fake KV cache that stores token ids:
it applies each batch's evict/preempt/add/fork decisions the way TVM would, and
checks every chunk appends exactly where the sequence's KV ends, with the right
tokens already there. So a wrong fork position, a missed removal or a bad
recompute fails loudly.
"""

from __future__ import annotations

import itertools
import random

import pytest

from kiln.runtime.kv_pages import PageAccountant
from kiln.runtime.prefix_cache import PrefixCache
from kiln.runtime.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from kiln.runtime.sequence import SeqStatus, Sequence

pytestmark = pytest.mark.unit


class FakeEngine:
    def __init__(self, sched: Scheduler, sample=None, stop_prob: float = 0.0, rng: random.Random | None = None,
                 lookahead: bool = False):
        self.sched = sched
        self.lookahead = lookahead                # the engine's overlapped step: the next batch decided early
        self.pending: ScheduledBatch | None = None
        self.kv: dict[int, list[int]] = {}        # seq id -> token ids whose "KV" is held
        self.rng = rng or random.Random(0)
        self.sample = sample or (lambda seq: 1000 + len(seq.output_ids))
        self.stop_prob = stop_prob
        self.finished: list[Sequence] = []
        self.steps = 0

    def step(self) -> ScheduledBatch:
        batch, self.pending = self.pending or self.schedule(), None
        assert batch.num_tokens <= self.sched.config.max_tokens_per_step
        assert len({id(c.seq) for c in batch.chunks}) == len(batch.chunks) <= self.sched.config.max_num_seqs
        for c in batch.chunks:
            if c.seq.status is not SeqStatus.RUNNING:
                continue                          # ended since its batch was decided: the row is dropped
            held = self.kv[c.seq.seq_id]
            assert held == c.seq.all_token_ids[:c.start], f"seq {c.seq.seq_id}: KV does not end at {c.start}"
            held.extend(c.seq.token_ids(c.start, c.end))
            assert c.needs_logits == (c.end == c.seq.num_tokens)
        self.sched.update(batch)
        taken = [c.seq for c in batch.chunks if c.needs_logits and c.seq.status is SeqStatus.RUNNING]
        for seq in taken:
            seq.output_ids.append(self.sample(seq))
        if self.lookahead:                        # the length-ended first, then the next batch, then "stop strings"
            for seq in [s for s in taken if len(s.output_ids) >= s.max_tokens]:
                self.finish(seq, "length")
            self.pending = self.schedule() if self.sched.has_work else None
        for seq in taken:
            if not seq.is_finished and (len(seq.output_ids) >= seq.max_tokens or self.rng.random() < self.stop_prob):
                self.finish(seq, "length")
        self.steps += 1
        return batch

    def schedule(self) -> ScheduledBatch:
        """The scheduler's next batch, its KV decisions applied to the fake cache as the engine applies them."""
        batch = self.sched.schedule()
        for sid in [*batch.evict, *(s.seq_id for s in batch.preempted)]:
            del self.kv[sid]
        for parent, child, pos in batch.forks:
            assert child not in self.kv and pos <= len(self.kv[parent])
            if self.sched.config.state_slots is not None:     # a state copies only a sequence's end
                assert pos == len(self.kv[parent])
            self.kv[child] = self.kv[parent][:pos]
        for sid, new_id in batch.renames:
            assert new_id not in self.kv
            self.kv[new_id] = self.kv.pop(sid)
        for sid in batch.new_seqs:
            assert sid not in self.kv
            self.kv[sid] = []
        if self.sched.config.state_slots is not None:
            assert len(self.kv) <= self.sched.config.state_slots
        return batch

    def finish(self, seq: Sequence, reason: str) -> None:
        for sid in self.sched.finish(seq, reason):
            del self.kv[sid]
        self.finished.append(seq)

    def abort(self, seq: Sequence) -> None:
        was_in_kv = seq.status is SeqStatus.RUNNING
        assert self.sched.abort(seq.seq_id) is seq
        if was_in_kv:
            del self.kv[seq.seq_id]

    def run_until_idle(self, max_steps: int = 10_000) -> None:
        while self.sched.has_work or self.pending:
            self.step()
            check_invariants(self)
            assert self.steps < max_steps, "no progress: the scheduler deadlocked"


def check_invariants(eng: FakeEngine) -> None:
    sched, pages = eng.sched, eng.sched.pages
    pages.check()
    assert pages.used_pages + pages.free_pages == pages.total_pages
    assert set(eng.kv) == set(pages.seq_ids()), "KV cache and page accounting hold different sequences"
    cached = set(sched.prefix_cache.seq_ids()) if sched.prefix_cache else set()
    assert set(eng.kv) == {s.seq_id for s in sched.running} | cached
    for seq in sched.running:
        assert seq.status is SeqStatus.RUNNING
        assert len(eng.kv[seq.seq_id]) == seq.num_computed
        assert pages.num_tokens(seq.seq_id) >= seq.num_computed
        assert len(pages.pages_of(seq.seq_id)) * pages.page_size >= seq.num_computed
    for seq in sched.waiting:
        assert seq.status is SeqStatus.WAITING and seq.num_computed == 0 and seq.seq_id not in pages
    assert len(sched.running) <= sched.config.max_num_seqs
    if sched.config.state_slots is not None:
        assert len(sched.running) + len(cached) <= sched.config.state_slots
    check_stats(sched, cached)


def check_stats(sched: Scheduler, cached: set[int]) -> None:
    """Scheduler.stats() (what Engine.stats() and /metrics report) agrees with the state it summarises."""
    stats, pages = sched.stats(), sched.pages
    live_pages = {p for s in sched.running for p in pages.pages_of(s.seq_id)}
    assert (stats.running, stats.waiting, stats.prefix_cache_seqs) == (len(sched.running), len(sched.waiting),
                                                                        len(cached))
    assert (stats.kv_pages_used, stats.kv_pages_cached, stats.kv_pages_free, stats.kv_pages_total) == (
        len(live_pages), pages.used_pages - len(live_pages), pages.free_pages, pages.total_pages)
    hits = sched.prefix_cache.hit_tokens if sched.prefix_cache is not None else 0
    assert stats.prefix_cache_hit_tokens == hits and stats.kv_page_size == pages.page_size


def make(total_pages=64, page_size=16, cache=False, **config) -> tuple[Scheduler, FakeEngine]:
    whole = config.get("state_slots") is not None          # recurrent layers: whole entries, taken over
    sched = Scheduler(SchedulerConfig(enable_prefix_cache=cache, **config), PageAccountant(total_pages, page_size),
                      PrefixCache(whole=whole) if cache else None)
    return sched, FakeEngine(sched)


_ids = itertools.count(1000)


def seq(n_prompt: int, max_tokens: int = 4, first: int = 0, **kw) -> Sequence:
    return Sequence(seq_id=kw.pop("seq_id", next(_ids)), prompt_ids=list(range(first, first + n_prompt)),
                    max_tokens=max_tokens, **kw)


# -- admission, chunking, decode growth ---------------------------------------------------
def test_admission_reserves_pages_for_the_whole_prompt():
    sched, eng = make(total_pages=8, page_size=16, max_tokens_per_step=16)
    s = seq(40)
    sched.add(s)
    batch = eng.step()
    assert batch.new_seqs == [s.seq_id] and not batch.forks
    assert sched.pages.used_pages == 3 and sched.pages.num_tokens(s.seq_id) == 40
    assert [(c.start, c.end) for c in batch.chunks] == [(0, 16)]
    assert s.status is SeqStatus.RUNNING and s.num_computed == 16


def test_chunked_prefill_1000_tokens_with_256_budget():
    sched, eng = make(total_pages=128, page_size=16, max_tokens_per_step=256)
    s = seq(1000, max_tokens=2)
    sched.add(s)
    batches = [eng.step() for _ in range(4)]
    spans = [(b.chunks[0].start, b.chunks[0].end, b.chunks[0].needs_logits) for b in batches]
    assert spans == [(0, 256, False), (256, 512, False), (512, 768, False), (768, 1000, True)]
    assert len(s.output_ids) == 1
    decode = eng.step()
    assert decode.is_decode_only and (decode.chunks[0].start, decode.chunks[0].end) == (1000, 1001)
    assert s.is_finished and sched.pages.used_pages == 0


def test_decode_grows_pages_across_a_boundary():
    sched, eng = make(total_pages=8, page_size=4)
    s = seq(3, max_tokens=10)
    sched.add(s)
    used = []
    for _ in range(4):
        eng.step()
        used.append(sched.pages.used_pages)
    # KV after each step: 3 (prompt), 4, 5, 6 tokens; the step computing token 5 takes page 2
    assert used == [1, 1, 2, 2]


def test_token_budget_mixes_decodes_and_prefill_chunks():
    sched, eng = make(total_pages=64, page_size=16, max_tokens_per_step=16)
    decoders = [seq(4, max_tokens=50) for _ in range(3)]
    for s in decoders:
        sched.add(s)
    eng.step()                                            # 12 prompt tokens of the three
    long = seq(40)
    sched.add(long)
    batch = eng.step()
    kinds = [(c.seq.seq_id, c.end - c.start) for c in batch.chunks]
    assert kinds == [(s.seq_id, 1) for s in decoders] + [(long.seq_id, 13)]
    assert not batch.is_decode_only
    batch = eng.step()                                    # decodes first, then the running prefill
    assert [c.end - c.start for c in batch.chunks] == [1, 1, 1, 13]


def test_max_num_seqs_caps_running():
    sched, eng = make(max_num_seqs=2, max_tokens_per_step=512)
    seqs = [seq(5, max_tokens=3) for _ in range(5)]
    for s in seqs:
        sched.add(s)
    batch = eng.step()
    assert [c.seq for c in batch.chunks] == seqs[:2]
    assert sched.num_running == 2 and sched.num_waiting == 3
    eng.run_until_idle()
    assert all(s.is_finished for s in seqs)


# -- ordering ---------------------------------------------------------------------------
@pytest.mark.parametrize("policy, expected", [("fcfs", [0, 1, 2, 3]), ("priority", [2, 3, 0, 1])])
def test_admission_order(policy, expected):
    sched, eng = make(max_num_seqs=1, policy=policy)
    seqs = [seq(4, max_tokens=1, arrival=float(i), priority=p) for i, p in enumerate([5, 5, 0, 1])]
    for s in seqs:
        sched.add(s)
    eng.run_until_idle()
    assert [seqs.index(s) for s in eng.finished] == expected


# -- preemption ---------------------------------------------------------------------------
def test_preemption_drops_the_latest_and_recomputes_it():
    sched, eng = make(total_pages=4, page_size=4, max_tokens_per_step=64)
    first, second = seq(7, max_tokens=6, arrival=0.0), seq(7, max_tokens=6, arrival=1.0, first=50)
    sched.add(first)
    sched.add(second)
    eng.step()                                            # both prefilled: 2 pages each, 0 free
    assert sched.pages.free_pages == 0
    batch = eng.step()                                    # both decode token 8: still fits
    assert not batch.preempted
    batch = eng.step()                                    # token 9 needs a page: the later one goes
    assert batch.preempted == [second] and [c.seq for c in batch.chunks] == [first]
    assert second.status is SeqStatus.WAITING and second.num_computed == 0 and len(second.output_ids) == 2
    assert sched.waiting[0] is second
    eng.run_until_idle()
    assert second.is_finished and len(second.output_ids) == 6
    assert second.output_ids == [1000 + i for i in range(6)]   # outputs kept across the recompute
    assert sched.pages.used_pages == 0


def test_priority_policy_preempts_the_least_urgent():
    sched, eng = make(total_pages=4, page_size=4, policy="priority")
    urgent, lazy = seq(7, max_tokens=6, priority=0, arrival=1.0), seq(7, max_tokens=6, priority=9, arrival=0.0)
    sched.add(lazy)
    sched.add(urgent)
    preempted = [s for _ in range(4) for s in eng.step().preempted]
    assert preempted == [lazy]
    eng.run_until_idle()
    assert eng.finished[0] is urgent


# -- abort ------------------------------------------------------------------------------
def test_abort_in_every_state_returns_all_pages():
    sched, eng = make(total_pages=10, page_size=4, max_tokens_per_step=8, max_num_seqs=3)
    decoding, prefilling, waiting = seq(3, max_tokens=20), seq(30, max_tokens=5), seq(4)
    for s in (decoding, prefilling, waiting):
        sched.add(s)
    eng.step()
    eng.step()
    assert decoding.num_computed > 3 and 0 < prefilling.num_computed < 30
    assert waiting.status is SeqStatus.WAITING          # pages for 30 + 3 tokens leave no room
    for s in (waiting, prefilling, decoding):
        eng.abort(s)
        assert s.is_finished and s.finish_reason == "abort"
        check_invariants(eng)
    assert sched.abort(decoding.seq_id) is None
    assert sched.pages.used_pages == 0 and not sched.has_work and not eng.kv


def test_abort_a_preempted_sequence():
    sched, eng = make(total_pages=4, page_size=4)
    a, b = seq(7, max_tokens=6, arrival=0.0), seq(7, max_tokens=6, arrival=1.0)
    sched.add(a)
    sched.add(b)
    while not eng.step().preempted:
        pass
    eng.abort(b)                                         # waiting again, holds nothing
    eng.run_until_idle()
    assert a.is_finished and sched.pages.used_pages == 0 and not eng.kv


# -- forks (n > 1 completions) ----------------------------------------------------------
def test_n_completions_fork_the_parent_once_its_prompt_is_computed():
    sched, eng = make(total_pages=32, page_size=16, max_tokens_per_step=64)
    parent = seq(40, max_tokens=3, seq_id=1)
    kids = [seq(40, max_tokens=3, seq_id=i, fork_from=(1, 39)) for i in (2, 3)]
    for s in (parent, *kids):
        sched.add(s)
    batch = eng.step()
    assert batch.new_seqs == [1] and not batch.forks      # children wait for the parent's KV
    batch = eng.step()
    assert batch.forks == [(1, 2, 39), (1, 3, 39)]
    assert [(c.seq.seq_id, c.start, c.end) for c in batch.chunks] == [(1, 40, 41), (2, 39, 40), (3, 39, 40)]
    # parent: 3 pages (41 tokens after this step); each child shares 2 full pages + its own copy
    assert sched.pages.used_pages == 3 + 1 + 1
    eng.run_until_idle()
    assert sched.pages.used_pages == 0 and not eng.kv


def test_fork_child_falls_back_when_the_parent_is_gone():
    sched, eng = make(total_pages=32, page_size=16)
    parent = seq(20, max_tokens=3, seq_id=11)
    kid = seq(20, max_tokens=3, seq_id=12, fork_from=(11, 19))
    sched.add(parent)
    sched.add(kid)
    eng.step()
    eng.abort(parent)
    batch = eng.step()
    assert batch.new_seqs == [12] and not batch.forks and kid.fork_from is None
    eng.run_until_idle()
    assert sched.pages.used_pages == 0


# -- prefix cache -----------------------------------------------------------------------
def test_shared_512_token_prefix_forks_and_computes_only_the_suffix():
    sched, eng = make(total_pages=128, page_size=16, cache=True, max_tokens_per_step=1024)
    prefix = list(range(512))
    a = Sequence(seq_id=1, prompt_ids=prefix + [7000, 7001], max_tokens=3)
    sched.add(a)
    eng.run_until_idle()
    assert 1 in sched.prefix_cache and 1 in eng.kv         # donated: kept in the KV cache
    assert sched.prefix_cache.cached_tokens == 514 + 2     # prompt + outputs whose KV was computed
    b = Sequence(seq_id=2, prompt_ids=prefix + [8000, 8001, 8002], max_tokens=2)
    sched.add(b)
    batch = eng.step()
    assert batch.forks == [(1, 2, 512)] and not batch.new_seqs
    assert [(c.start, c.end) for c in batch.chunks] == [(512, 515)]
    assert sched.prefix_cache.hit_tokens == 512
    eng.run_until_idle()
    assert sched.pages.used_pages > 0                      # both cached
    for sid in sched.clear_prefix_cache():
        del eng.kv[sid]
    assert sched.pages.used_pages == 0 and not eng.kv


def test_a_readmitted_sequence_reports_only_its_own_admissions_cache_hit():
    """Sequence.cached_prompt (usage's cached_tokens): the tokens its admission forked from the cache, 0 again
    after a preemption whose readmission found none."""
    sched, eng = make(total_pages=64, page_size=4, cache=True)
    sched.add(Sequence(seq_id=1, prompt_ids=list(range(12)), max_tokens=2))
    eng.run_until_idle()
    b = Sequence(seq_id=2, prompt_ids=list(range(12)) + [50, 51], max_tokens=3)
    sched.add(b)
    eng.step()
    assert b.cached_prompt == 12
    sched._preempt(b, ScheduledBatch())                    # as the engine drops a preempted sequence's KV
    del eng.kv[2]
    for sid in sched.clear_prefix_cache():
        del eng.kv[sid]
    eng.run_until_idle()
    assert b.is_finished and b.cached_prompt == 0


def test_full_match_still_computes_the_last_token():
    sched, eng = make(cache=True)
    sched.add(Sequence(seq_id=1, prompt_ids=[5, 6, 7, 8], max_tokens=2))
    eng.run_until_idle()                                   # caches [5, 6, 7, 8, out0]
    again = Sequence(seq_id=2, prompt_ids=[5, 6, 7, 8], max_tokens=2)
    sched.add(again)
    batch = eng.step()
    assert batch.forks == [(1, 2, 3)] and (batch.chunks[0].start, batch.chunks[0].end) == (3, 4)


def test_duplicate_donation_is_freed_by_finish():
    sched, eng = make(cache=True)
    sched.add(Sequence(seq_id=1, prompt_ids=[1, 2, 3, 4, 5, 6], max_tokens=1))
    eng.run_until_idle()                                   # caches [1..6] (the sampled token never ran)
    dup = Sequence(seq_id=2, prompt_ids=[1, 2, 3, 4], max_tokens=2)
    sched.add(dup)
    eng.step()
    eng.step()                                             # KV [1, 2, 3, 4, out0]: not covered
    assert sched.finish(dup, "stop") == [] and 2 in sched.prefix_cache
    covered = Sequence(seq_id=3, prompt_ids=[1, 2, 3], max_tokens=1)
    sched.add(covered)
    eng.step()                                             # finishes: [1, 2, 3] is covered by 1 and 2
    assert eng.finished[-1] is covered and 3 not in eng.kv and 3 not in sched.pages


def test_cache_entries_are_evicted_lru_when_pages_are_short():
    sched, eng = make(total_pages=6, page_size=4, cache=True)
    for sid, first in ((1, 100), (2, 200), (3, 300)):
        sched.add(Sequence(seq_id=sid, prompt_ids=list(range(first, first + 5)), max_tokens=2))
        eng.run_until_idle()
    assert sched.prefix_cache.num_cached_seqs == 3 and sched.pages.free_pages == 0
    sched.add(Sequence(seq_id=4, prompt_ids=list(range(900, 909)), max_tokens=1))   # 3 pages
    batch = eng.step()
    assert batch.evict == [1, 2] and batch.new_seqs == [4]
    assert 3 in sched.prefix_cache and 1 not in sched.pages and 2 not in sched.pages


def test_recurrent_entries_are_continued_whole_by_a_rename():
    sched, eng = make(cache=True, max_num_seqs=2, state_slots=2)
    sched.add(Sequence(seq_id=1, prompt_ids=[5, 6, 7, 8], max_tokens=3))
    eng.run_until_idle()                                   # caches [5, 6, 7, 8, out0, out1]
    turn = eng.finished[-1].all_token_ids[:6] + [40, 41]   # the next turn extends the conversation
    sched.add(Sequence(seq_id=2, prompt_ids=[5, 6, 7, 9], max_tokens=1))      # shares 3 tokens: no partial match
    sched.add(Sequence(seq_id=3, prompt_ids=turn, max_tokens=2))
    batch = eng.step()
    assert batch.new_seqs == [2] and batch.renames == [(1, 3)] and not batch.forks and not batch.evict
    assert [(c.start, c.end) for c in batch.chunks] == [(0, 4), (6, 8)]
    assert 1 not in sched.prefix_cache and sched.prefix_cache.hit_tokens == 6
    eng.run_until_idle()
    assert sorted(sched.prefix_cache.seq_ids()) == [2, 3]  # both slots cached
    sched.add(Sequence(seq_id=4, prompt_ids=[70, 71], max_tokens=1))
    batch = eng.step()                                     # a slot: the least recently used entry goes
    assert batch.evict == [2] and batch.new_seqs == [4]
    with pytest.raises(ValueError, match="state_slots .1. must be at least max_num_seqs .2."):
        SchedulerConfig(max_num_seqs=2, state_slots=1)


def test_recurrent_checkpoint_where_prompts_part_serves_the_next():
    sched, eng = make(cache=True, max_num_seqs=2, state_slots=3, min_checkpoint=32, max_tokens_per_step=512)
    system = list(range(100, 180))                         # 80 tokens every conversation begins with
    sched.add(Sequence(seq_id=1, prompt_ids=system + [1, 2, 3], max_tokens=2))
    eng.run_until_idle()
    sched.add(Sequence(seq_id=2, prompt_ids=system + [4, 5], max_tokens=2))
    batch = eng.step()                                     # no whole match; agrees for 80: stops there once
    assert batch.new_seqs == [2] and [(c.start, c.end) for c in batch.chunks] == [(0, 80)]
    batch = eng.step()
    assert batch.forks == [(2, -1, 80)] and [(c.start, c.end) for c in batch.chunks] == [(80, 82)]
    sched.add(Sequence(seq_id=3, prompt_ids=system + [6, 7, 8], max_tokens=2))
    batch = eng.step()                                     # the checkpoint is copied, not taken over
    assert batch.forks == [(-1, 3, 80)] and not batch.renames and (batch.chunks[-1].start, batch.chunks[-1].end) == (
        80, 83)
    eng.run_until_idle()
    assert -1 in sched.prefix_cache and len(sched.prefix_cache) == 3     # 1 went for 3's slot
    assert sched.prefix_cache.hit_tokens == 80


def test_recurrent_n_children_fork_the_parents_checkpoint():
    sched, eng = make(cache=True, max_num_seqs=3, state_slots=3, max_tokens_per_step=512)
    prompt = list(range(200, 240))
    sched.add(Sequence(seq_id=1, prompt_ids=prompt, max_tokens=2))
    for sid in (2, 3):
        sched.add(Sequence(seq_id=sid, prompt_ids=prompt, max_tokens=2, fork_from=(1, 39)))
    batch = eng.step()                                     # the parent alone, stopping before its last token
    assert batch.new_seqs == [1] and [(c.start, c.end) for c in batch.chunks] == [(0, 39)]
    batch = eng.step()                                     # its state copied in; a child forks it, the last
    assert batch.forks == [(1, -1, 39), (-1, 2, 39)] and batch.renames == [(-1, 3)]   # takes it (no slot left)
    assert [(c.seq.seq_id, c.start, c.end) for c in batch.chunks] == [(1, 39, 40), (2, 39, 40), (3, 39, 40)]
    eng.run_until_idle()
    assert sched.prefix_cache.hit_tokens == 2 * 39


def test_finish_without_prefix_cache_frees_the_sequence():
    sched, eng = make(cache=False)
    s = seq(5, max_tokens=1)
    sched.add(s)
    eng.step()
    assert s.is_finished and not eng.kv and sched.pages.used_pages == 0


def test_fits_and_impossible_requests():
    sched, _ = make(total_pages=4, page_size=16)
    assert sched.fits(64) and not sched.fits(65)
    with pytest.raises(ValueError, match="more than the 4 KV pages"):
        sched.add(seq(60, max_tokens=5))
    with pytest.raises(ValueError, match="empty prompt"):
        sched.add(Sequence(seq_id=5, prompt_ids=[], max_tokens=1))
    with pytest.raises(ValueError, match="policy"):
        SchedulerConfig(policy="lifo")


# -- randomized simulation -----------------------------------------------------------------
@pytest.mark.parametrize("recurrent", [False, True], ids=["attention", "recurrent"])
@pytest.mark.parametrize("lookahead", [False, True], ids=["step", "lookahead"])
@pytest.mark.parametrize("seed", range(20))
def test_randomized_simulation_keeps_invariants_and_finishes(seed, lookahead, recurrent):
    rng = random.Random(seed)
    policy = "priority" if seed % 2 else "fcfs"
    cache = seed % 3 != 2
    most = rng.randint(1, 6)
    sched, eng = make(total_pages=rng.randint(6, 14), page_size=rng.choice([2, 4, 8]), cache=cache,
                      max_num_seqs=most, max_tokens_per_step=rng.randint(4, 40), policy=policy,
                      state_slots=most + rng.randint(0, 2) if recurrent else None, min_checkpoint=rng.randint(1, 4))
    eng.rng, eng.stop_prob, eng.lookahead = rng, 0.05, lookahead
    eng.sample = lambda s: rng.randint(0, 3)               # small vocab: outputs repeat, so prefixes match
    bases = [[rng.randint(0, 3) for _ in range(rng.randint(1, 20))] for _ in range(3)]
    capacity = sched.pages.total_pages * sched.pages.page_size
    live: list[Sequence] = []
    next_id = itertools.count()
    for step in range(400):
        if step < 300 and rng.random() < 0.3:
            prompt = rng.choice(bases)[:rng.randint(1, 20)] + [rng.randint(0, 3) for _ in range(rng.randint(0, 8))]
            if recurrent and eng.finished and rng.random() < 0.5:     # a conversation's next turn
                done = eng.finished[-1]
                prompt = done.all_token_ids[:done.num_computed] + [rng.randint(0, 3) for _ in range(rng.randint(1, 6))]
            max_tokens = rng.randint(1, max(1, min(12, capacity - len(prompt))))
            if not sched.fits(len(prompt) + max_tokens):
                continue
            group = [Sequence(next(next_id), prompt, max_tokens, priority=rng.randint(0, 2))]
            for _ in range(rng.choice([0, 0, 1, 2])):
                group.append(Sequence(next(next_id), prompt, max_tokens, priority=group[0].priority,
                                      fork_from=(group[0].seq_id, len(prompt) - 1)))
            for s in group:
                sched.add(s)
            live += group
        if live and rng.random() < 0.05:
            victim = rng.choice(live)
            if not victim.is_finished:
                eng.abort(victim)
        live = [s for s in live if not s.is_finished]
        eng.step()
        check_invariants(eng)
    eng.run_until_idle(max_steps=eng.steps + 5000)
    assert not live or all(s.is_finished for s in live)
    for sid in sched.clear_prefix_cache():
        del eng.kv[sid]
    assert sched.pages.used_pages == 0 and sched.pages.free_pages == sched.pages.total_pages and not eng.kv
    assert all(len(s.output_ids) <= s.max_tokens for s in eng.finished)

