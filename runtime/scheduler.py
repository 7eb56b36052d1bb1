"""Scheduler: decides, each step, which tokens of which sequences the next forward computes.

Iteration-level continuous batching with chunked prefill (nano-vllm's shape):

  1. decode  every running sequence with one new token gets it, best first; when its
             page cannot grow, evict prefix-cache entries, then preempt the worst
             running sequence (recompute: its KV is dropped and it waits again);
  2. prefill running sequences with more uncomputed tokens take chunks of the budget;
  3. admit   waiting sequences, in policy order, while max_num_seqs, the token budget
             and the pages for their whole current length allow. On admission a
             sequence forks its fork_from parent or the longest prefix-cache match
             instead of recomputing the shared tokens.

With a sliding-window artifact (runtime/sliding_window.py) a sequence appends at most
window.max_chunk tokens per forward, and nothing is forked or prefix-cached (TVM cannot share a
windowed sequence's KV): each sequence computes its own prompt.

With recurrent layers (SchedulerConfig.state_slots) a state holds a sequence's every token: the
prefix cache matches whole entries only (PrefixCache(whole=True)), and a sequence that continues a
finished one's entry takes it over (renames: the entry leaves the cache; its pages and state become
the sequence's) instead of forking it. Where a prompt agrees with the cache for min_checkpoint tokens
or more past its match (a system prompt other conversations began with), its prefill stops there
once and the state is copied into the cache (a checkpoint, forked: never taken over while a slot is
free), so the next prompt that agrees that far starts there; a fork_from parent (n > 1) stops so where its
children share it, and they fork that checkpoint. Running and cached sequences share the
state slots: admission evicts cached entries for one.

schedule() makes no device calls; it returns a ScheduledBatch that says what the
engine must do to TVM's KV cache before the forward (evict / preempted: remove;
renames: rename; new_seqs: add; forks: fork) and which token ranges to compute. Page bookkeeping
is the PageAccountant's; prefix matching is the PrefixCache's.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from .kv_pages import PageAccountant
from .prefix_cache import PrefixCache
from .protocol import EngineStats
from .sequence import SeqStatus, Sequence
from .sliding_window import SlidingWindow


@dataclass
class Chunk:
    """Compute tokens [start, end) of seq; logits come back iff end == seq.num_tokens."""

    seq: Sequence
    start: int
    end: int
    needs_logits: bool

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    @property
    def is_decode(self) -> bool:
        return self.end - self.start == 1 and self.start >= len(self.seq.prompt_ids)

    @property
    def all_logits(self) -> bool:
        """Logits at every position (the prompt's are scored: prompt logprobs, echo)."""
        return self.seq.prompt_logits and self.start < len(self.seq.prompt_ids)


@dataclass
class ScheduledBatch:
    """One step's decisions. Apply to the KV cache in this order: evict and preempted, forks, renames,
    new_seqs; then run the chunks."""

    chunks: list[Chunk] = field(default_factory=list)
    renames: list[tuple[int, int]] = field(default_factory=list)   # (cached, sequence): rename_sequence
    new_seqs: list[int] = field(default_factory=list)           # add_sequence
    forks: list[tuple[int, int, int]] = field(default_factory=list)   # (parent, child, pos): fork_sequence
    preempted: list[Sequence] = field(default_factory=list)     # remove_sequence (recomputed later)
    evict: list[int] = field(default_factory=list)              # remove_sequence (prefix-cache entries)

    @property
    def is_decode_only(self) -> bool:
        return bool(self.chunks) and all(c.is_decode for c in self.chunks)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 32             # running sequences at once (the forward's batch size)
    max_tokens_per_step: int = 512     # token budget per forward; a decode counts 1
    policy: str = "fcfs"               # or "priority": (priority, arrival) order
    enable_prefix_cache: bool = True
    sliding_window: SlidingWindow | None = None   # the artifact's; bounds chunks, rules out sharing KV
    state_slots: int | None = None     # recurrent layers: the state slots running and cached sequences share
    min_checkpoint: int = 64           # recurrent layers: tokens past a prompt's match that earn a checkpoint
                                       # (kiln serve --min-checkpoint)

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.enable_prefix_cache:
            raise ValueError("prefix caching cannot share the KV of a sliding-window model; "
                             "set enable_prefix_cache=False")
        if self.state_slots is not None and self.state_slots < self.max_num_seqs:
            raise ValueError(f"state_slots ({self.state_slots}) must be at least max_num_seqs ({self.max_num_seqs})")
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be 'fcfs' or 'priority', got {self.policy!r}")
        if self.min_checkpoint < 1:
            raise ValueError(f"min_checkpoint must be >= 1, got {self.min_checkpoint}")
        if self.max_num_seqs < 1 or self.max_tokens_per_step < 1:
            raise ValueError(f"max_num_seqs ({self.max_num_seqs}) and max_tokens_per_step "
                             f"({self.max_tokens_per_step}) must be >= 1")


class Scheduler:
    def __init__(self, config: SchedulerConfig, pages: PageAccountant, prefix_cache: PrefixCache | None = None):
        self.config = config
        self.pages = pages
        self.prefix_cache = prefix_cache if config.enable_prefix_cache else None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._live: dict[int, Sequence] = {}     # seq id -> waiting or running sequence
        self._pinned: set[int] = set()           # cache entries forked from (or made) in the current step
        self._entry_ids = itertools.count(-1, -1)   # recurrent: checkpoints' ids, negative (_is_checkpoint)
        self._fork_points: dict[int, int] = {}   # recurrent: seq id -> where its fork_from children share it

    # -- state ------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def caches_states(self) -> bool:
        """Recurrent layers with the prefix cache on: states cached whole, checkpoints, n > 1 by forks."""
        return self.config.state_slots is not None and self.prefix_cache is not None

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def stats(self) -> EngineStats:
        """Queue lengths, KV pages and prefix-cache counters now (Engine.stats, for metrics).

        May be called from another thread while the engine steps: each count is one read
        (len(), or a copy made in C), so a concurrent step skews one reading, never raises.
        """
        cache = self.prefix_cache
        cached = frozenset(cache.seq_ids()) if cache is not None else frozenset()
        used, cached_pages, free = self.pages.split_usage(cached)
        return EngineStats(running=len(self.running), waiting=len(self.waiting), kv_pages_used=used,
                           kv_pages_cached=cached_pages, kv_pages_free=free, kv_pages_total=self.pages.total_pages,
                           kv_page_size=self.pages.page_size, prefix_cache_seqs=len(cached),
                           prefix_cache_hit_tokens=cache.hit_tokens if cache is not None else 0,
                           prefix_cache_queried_tokens=cache.queried_tokens if cache is not None else 0)

    def fits(self, num_tokens: int) -> bool:
        """Could a sequence of num_tokens ever be held, with the whole KV cache to itself?"""
        return self.pages.pages_needed(num_tokens) <= self.pages.total_pages

    # -- requests in and out ----------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a sequence. Raises ValueError for one that could never run (check fits() first)."""
        if seq.seq_id in self._live or seq.seq_id in self.pages:
            raise ValueError(f"sequence id {seq.seq_id} is already in use")
        if not seq.prompt_ids:
            raise ValueError(f"sequence {seq.seq_id} has an empty prompt")
        if seq.fork_from is not None and self.caches_states:
            parent, pos = seq.fork_from          # recurrent: the parent stops there once, a checkpoint forked
            self._fork_points[parent] = max(pos, self._fork_points.get(parent, 0))
        if not self.fits(len(seq.prompt_ids) + seq.max_tokens):
            raise ValueError(f"sequence {seq.seq_id} ({len(seq.prompt_ids)} prompt + {seq.max_tokens} new tokens) "
                             f"needs more than the {self.pages.total_pages} KV pages there are")
        seq.status, seq.num_computed = SeqStatus.WAITING, 0
        self._live[seq.seq_id] = seq
        self.waiting.append(seq)

    def abort(self, seq_id: int) -> Sequence | None:
        """Drop a sequence in any state and free its pages; None if it is not live.

        The sequence held KV (the engine must remove it) iff it was RUNNING before the call.
        """
        seq = self._live.get(seq_id)
        if seq is not None:
            self._release(seq, "abort")
        return seq

    def finish(self, seq: Sequence, reason: str) -> list[int]:
        """End a sequence; returns the seq ids the engine must remove from the KV cache now.

        With the prefix cache on, a fully computed sequence donates its KV: it stays in
        the KV cache (not returned) unless the cache already covers its tokens. Cached
        entries the donation makes redundant are returned too.
        """
        if self._live.get(seq.seq_id) is not seq:
            return []
        held = seq.seq_id in self.pages
        donate = (self.prefix_cache is not None and held and seq.num_computed > 0
                  and self.pages.num_tokens(seq.seq_id) == seq.num_computed)
        self._release(seq, reason, free=not donate)
        if not donate:
            return [seq.seq_id] if held else []
        released = self.prefix_cache.insert(seq.token_ids(0, seq.num_computed), seq.seq_id, seq.cache_salt)
        for seq_id in released:
            self.pages.free(seq_id)
        return released

    def clear_prefix_cache(self) -> list[int]:
        """Drop every cached entry; returns the seq ids the engine must remove from the KV cache."""
        if self.prefix_cache is None:
            return []
        released = self.prefix_cache.clear()
        for seq_id in released:
            self.pages.free(seq_id)
        return released

    # -- the step ---------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        """Decide the next forward: decodes, then prefill chunks, then admissions."""
        batch = ScheduledBatch()
        self._pinned.clear()
        if self.caches_states:
            self._take_checkpoints(batch)
        budget = self._schedule_decodes(batch, self.config.max_tokens_per_step)
        budget = self._schedule_prefills(batch, budget)
        if not batch.preempted:          # short of pages: let the preempted go first next step
            self._admit(batch, budget)
        return batch

    def update(self, batch: ScheduledBatch) -> None:
        """After the forward: the chunks' tokens are now in the KV cache."""
        for chunk in batch.chunks:
            seq = chunk.seq
            if seq.status is not SeqStatus.RUNNING:
                continue                 # aborted since schedule()
            if chunk.start != seq.num_computed:
                raise RuntimeError(f"sequence {seq.seq_id}: chunk starts at {chunk.start} but "
                                   f"{seq.num_computed} tokens are computed")
            seq.num_computed = chunk.end

    def _schedule_decodes(self, batch: ScheduledBatch, budget: int) -> int:
        running = SeqStatus.RUNNING
        for seq in sorted(self.running, key=self._key):
            if budget == 0:
                break
            n = len(seq.prompt_ids) + len(seq.output_ids)
            # a decode: running, the prompt in the cache, exactly the newest token to compute
            if seq.status is not running or seq.num_computed != n - 1 or seq.num_computed < len(seq.prompt_ids):
                continue
            if not self._grow_or_preempt(seq, batch):
                continue                 # it was the worst: preempted itself
            batch.chunks.append(Chunk(seq, seq.num_computed, seq.num_tokens, True))
            budget -= 1
        return budget

    def _schedule_prefills(self, batch: ScheduledBatch, budget: int) -> int:
        scheduled = {id(c.seq) for c in batch.chunks}
        for seq in sorted(self.running, key=self._key):
            if budget == 0:
                break
            if id(seq) in scheduled or seq.num_uncomputed == 0:
                continue
            end = self._chunk_end(seq, budget)
            if self.pages.num_tokens(seq.seq_id) < end:   # admission reserved the whole length
                raise RuntimeError(f"sequence {seq.seq_id} holds pages for fewer tokens than it computes")
            batch.chunks.append(Chunk(seq, seq.num_computed, end, end == seq.num_tokens))
            budget -= end - seq.num_computed
        return budget

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        for seq in self._waiting_order():
            if budget == 0 or len(self.running) >= self.config.max_num_seqs:
                return
            if self._parent_pending(seq):
                continue                 # its fork parent's prompt is not in the KV cache yet
            fits, source = self._make_room(seq, batch)
            if not fits:
                return                   # head of line waits for pages
            budget -= self._start(seq, source, budget, batch)

    def _chunk_end(self, seq: Sequence, budget: int) -> int:
        """Where seq's next chunk ends: its uncomputed tokens, within the budget, the window's bound and
        before its checkpoint."""
        take = min(seq.num_uncomputed, budget)
        if seq.checkpoint is not None and seq.num_computed < seq.checkpoint:
            take = min(take, seq.checkpoint - seq.num_computed)
        if self.config.sliding_window is not None:
            take = min(take, self.config.sliding_window.max_chunk(seq.num_computed))
        return seq.num_computed + take

    # -- admission helpers --------------------------------------------------------------
    def _waiting_order(self) -> list[Sequence]:
        if self.config.policy == "priority":
            return sorted(self.waiting, key=self._key)
        return list(self.waiting)

    def _parent_pending(self, seq: Sequence) -> bool:
        """True while a fork_from parent is alive but has not computed the shared tokens."""
        if seq.fork_from is not None and self.config.sliding_window is not None:
            seq.fork_from = None         # windowed KV cannot be shared: prefill the prompt
        if seq.fork_from is None:
            return False
        parent = self._live.get(seq.fork_from[0])
        if parent is None:               # finished or aborted: fall back to the prefix cache / prefill
            seq.fork_from = None
            return False
        return parent.status is not SeqStatus.RUNNING or parent.num_computed < seq.fork_from[1]

    def _fork_source(self, seq: Sequence) -> tuple[int, int] | None:
        """(parent id, pos) to fork instead of computing tokens [0, pos); None to prefill all."""
        if seq.prompt_logits:
            return None                  # every prompt position's logits are wanted: compute them all
        if seq.fork_from is not None and self.config.state_slots is None:
            parent_id, pos = seq.fork_from
        elif self.prefix_cache is not None:     # (recurrent: fork_from children fork the parent's checkpoint)
            # Query all but the last token: at least one token is computed, so logits come back.
            parent_id, pos = self.prefix_cache.peek(seq.token_ids(0, seq.num_tokens - 1), seq.cache_salt)
        else:
            return None
        pos = min(pos, seq.num_tokens - 1)
        return (parent_id, pos) if parent_id is not None and pos > 0 else None

    def _make_room(self, seq: Sequence, batch: ScheduledBatch) -> tuple[bool, tuple[int, int] | None]:
        """Evict cache entries until seq fits: (fits, fork source).

        Other entries go first (LRU); the matched entry itself only when nothing else is
        left, after which the sequence is planned again without it.
        """
        source = self._fork_source(seq)
        if source is not None and _is_checkpoint(source[0]) and not self._slot_free():
            self._evict(batch, self._pinned | {source[0]})   # a slot to copy the checkpoint into, if one can go
        while not self._fits_now(seq, source):
            keep = self._pinned | ({source[0]} if source else set())
            if self._evict(batch, keep):
                continue
            cached = source is not None and self.prefix_cache is not None and source[0] in self.prefix_cache
            if not cached or source[0] in self._pinned:
                return False, None
            self._evict(batch, self._pinned, only=source[0])
            source = self._fork_source(seq)
        return True, source

    def _fits_now(self, seq: Sequence, source: tuple[int, int] | None) -> bool:
        recurrent = self.config.state_slots is not None
        if source is None:
            return (not recurrent or self._slot_free()) and self.pages.can_allocate(seq.num_tokens)
        if recurrent and self._takes_over(source[0]):     # the entry's slot and pages, and more pages
            return self.pages.can_append(source[0], seq.num_tokens - source[1])
        return self.pages.can_fork(source[0], source[1], seq.num_tokens)

    # -- recurrent layers: state slots, take-overs, checkpoints ----------------------------------
    def _slot_free(self) -> bool:
        cached = len(self.prefix_cache) if self.prefix_cache is not None else 0
        return len(self.running) + cached < self.config.state_slots

    def _takes_over(self, entry: int) -> bool:
        """Whether a sequence that continues cache entry `entry` takes it over (rename) rather than forking
        it: a finished sequence's entry always, a checkpoint only when no slot is free for the copy."""
        return not _is_checkpoint(entry) or not self._slot_free()

    def _checkpoint_at(self, seq: Sequence, start: int) -> int | None:
        """Where seq's prefill should stop once to cache its state: as far as its prompt agrees with the
        cache, when that is min_checkpoint tokens or more past `start` (its match)."""
        if self.prefix_cache is None or seq.prompt_logits:
            return None
        agree = self.prefix_cache.common(seq.token_ids(0, seq.num_tokens - 1), seq.cache_salt)
        return agree if agree - start >= self.config.min_checkpoint else None

    def _take_checkpoints(self, batch: ScheduledBatch) -> None:
        """Copy the state of each sequence whose prefill stopped at its checkpoint into the cache (a slot,
        evicting the least recently used entry if none is free, and the pages' references)."""
        for seq in self.running:
            at = seq.checkpoint
            if at is None or seq.num_computed < at:
                continue
            seq.checkpoint = None
            tokens = seq.token_ids(0, at)
            if seq.num_computed != at or self.prefix_cache.peek(tokens, seq.cache_salt)[1] == at:
                continue                 # (an entry ends there already)
            if not self._slot_free() and not self._evict(batch, self._pinned):
                continue
            if not self.pages.can_fork(seq.seq_id, at, at):
                continue
            entry = next(self._entry_ids)
            self.prefix_cache.insert(tokens, entry, seq.cache_salt)
            self.pages.fork(seq.seq_id, entry, at)
            batch.forks.append((seq.seq_id, entry, at))
            self._pinned.add(entry)

    def _start(self, seq: Sequence, source: tuple[int, int] | None, budget: int, batch: ScheduledBatch) -> int:
        """Admit seq (pages for its whole length, KV by add or fork) and give it a first chunk."""
        sid = seq.seq_id
        if self.config.state_slots is not None:
            seq.checkpoint = self._fork_points.get(sid) or self._checkpoint_at(seq, source[1] if source else 0)
        if source is None:
            self.pages.allocate(sid, seq.num_tokens)
            batch.new_seqs.append(sid)
        else:
            parent_id, pos = source
            if self.prefix_cache is not None and parent_id in self.prefix_cache:
                if self.prefix_cache.match(seq.token_ids(0, seq.num_tokens - 1), seq.cache_salt) != source:
                    raise RuntimeError("prefix cache changed between peek and match")
                self._pinned.add(parent_id)
                seq.cached_prompt = min(pos, len(seq.prompt_ids))
            if self.config.state_slots is not None and self._takes_over(parent_id):
                self.prefix_cache.remove(parent_id)     # recurrent: the entry becomes this sequence
                self.pages.rename(parent_id, sid)
                batch.renames.append((parent_id, sid))
            else:
                self.pages.fork(parent_id, sid, pos)
                batch.forks.append((parent_id, sid, pos))
            self.pages.append(sid, seq.num_tokens - pos)
            seq.num_computed = pos
        seq.status = SeqStatus.RUNNING
        self.waiting.remove(seq)
        self.running.append(seq)
        end = self._chunk_end(seq, budget)
        batch.chunks.append(Chunk(seq, seq.num_computed, end, end == seq.num_tokens))
        return end - seq.num_computed

    # -- pages: growth, eviction, preemption ---------------------------------------------
    def _grow_or_preempt(self, seq: Sequence, batch: ScheduledBatch) -> bool:
        """Reserve seq's next token; evict cache entries, then preempt the worst running sequence."""
        need = seq.num_tokens - self.pages.num_tokens(seq.seq_id)
        if self.pages.try_append(seq.seq_id, need):
            return True                  # the common case: this runs per decode, per step
        scheduled = None                 # built only when a victim is needed
        while not self.pages.can_append(seq.seq_id, need):
            if self._evict(batch, self._pinned):
                continue
            if scheduled is None:
                scheduled = {id(c.seq) for c in batch.chunks}
            victim = max((s for s in self.running if id(s) not in scheduled), key=self._key)
            self._preempt(victim, batch)
            if victim is seq:
                return False
        self.pages.append(seq.seq_id, need)
        return True

    def _evict(self, batch: ScheduledBatch, keep: set[int], only: int | None = None) -> bool:
        """Drop one prefix-cache entry (LRU, or `only`) and free its pages; False if none may go."""
        if self.prefix_cache is None:
            return False
        if only is None:
            only = self.prefix_cache.evict_lru(exclude=keep)
            if only is None:
                return False
        else:
            self.prefix_cache.remove(only)
        self.pages.free(only)
        batch.evict.append(only)
        return True

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        """Recompute-style preemption: drop the KV; the sequence waits at the front of the queue (a checkpoint it
        made this step undone: its fork would follow the removal)."""
        for fork in [f for f in batch.forks if f[0] == seq.seq_id and _is_checkpoint(f[1])]:
            batch.forks.remove(fork)
            self.prefix_cache.remove(fork[1])
            self.pages.free(fork[1])
            self._pinned.discard(fork[1])
        self.pages.free(seq.seq_id)
        self.running.remove(seq)
        seq.num_computed, seq.checkpoint, seq.cached_prompt = 0, None, 0   # (its next admission says its own hit)
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)

    def _release(self, seq: Sequence, reason: str, free: bool = True) -> None:
        """Take seq out of the queues; FINISHED. Frees its pages unless told not to."""
        del self._live[seq.seq_id]
        self._fork_points.pop(seq.seq_id, None)
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            if free:
                self.pages.free(seq.seq_id)
        elif seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason

    def _key(self, seq: Sequence) -> tuple:
        """Sort key, best first: (priority, arrival) under "priority", arrival under "fcfs"."""
        if self.config.policy == "priority":
            return (seq.priority, seq.arrival, seq.seq_id)
        return (seq.arrival, seq.seq_id)


def _is_checkpoint(seq_id: int) -> bool:
    """Whether a prefix-cache entry is a checkpoint (a state copied mid-prompt, _take_checkpoints: negative ids),
    not a finished sequence."""
    return seq_id < 0
