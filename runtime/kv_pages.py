"""PageAccountant: host-side bookkeeping of the paged KV cache's pages.

TVM's paged KV cache owns the pages on the device; this object mirrors how
many it uses so the scheduler can decide, before any device call, whether a
sequence can be admitted, grow by a token, or be forked. It never sees a
batch: the scheduler asks can_allocate / can_append / can_fork and then calls
allocate / append / fork / free.

Pages are reference counted, mirroring TVM's fork semantics: a child forked
at `pos` shares the parent's pages that lie fully inside the first `pos`
tokens, and gets a fresh page holding a copy of a partially covered one. A
page returns to the free list when the last sequence holding it is freed.

Each sequence holds exactly pages_needed(num_tokens) pages, in token order. With a per-sequence
sliding window (runtime/sliding_window.py) TVM frees the pages a sequence's oldest tokens leave,
so a sequence never holds more than `max_pages_per_seq`: pages_needed caps there (TVM holds one
page fewer at times; never more, so admitting by the cap never overfills the cache). Such
sequences cannot be forked.
Misuse (unknown or duplicate ids, allocating past capacity) is a programming
error in the caller and raises KeyError / RuntimeError.

Only the engine thread changes an accountant; the read-only queries free_pages,
used_pages and split_usage may also be asked from another thread (metrics).
"""

from __future__ import annotations

from collections.abc import Collection


class PageAccountant:
    def __init__(self, total_pages: int, page_size: int, max_pages_per_seq: int | None = None):
        if total_pages < 1 or page_size < 1 or (max_pages_per_seq is not None and max_pages_per_seq < 1):
            raise ValueError(f"need at least one page of at least one token, got total_pages={total_pages}, "
                             f"page_size={page_size}, max_pages_per_seq={max_pages_per_seq}")
        self.total_pages = total_pages
        self.page_size = page_size
        self.max_pages_per_seq = max_pages_per_seq
        self._free_ids: list[int] = list(range(total_pages - 1, -1, -1))   # a stack; pops page 0 first
        self._refs: list[int] = [0] * total_pages                          # holders per page
        self._pages: dict[int, list[int]] = {}                             # seq id -> page ids, in order
        self._tokens: dict[int, int] = {}                                  # seq id -> tokens held

    # -- queries ----------------------------------------------------------------------
    @property
    def free_pages(self) -> int:
        return len(self._free_ids)

    @property
    def used_pages(self) -> int:
        return self.total_pages - len(self._free_ids)

    def pages_needed(self, num_tokens: int) -> int:
        """Pages that hold `num_tokens` tokens of one unshared sequence (at most max_pages_per_seq)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        pages = -(-num_tokens // self.page_size)
        return pages if self.max_pages_per_seq is None else min(pages, self.max_pages_per_seq)

    def num_tokens(self, seq_id: int) -> int:
        return self._tokens[self._known(seq_id)]

    def pages_of(self, seq_id: int) -> tuple[int, ...]:
        """The page ids a sequence holds, in token order (shared ones included)."""
        return tuple(self._pages[self._known(seq_id)])

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._pages

    def __len__(self) -> int:
        return len(self._pages)

    def seq_ids(self) -> list[int]:
        return list(self._pages)

    def split_usage(self, cached: Collection[int]) -> tuple[int, int, int]:
        """(pages held by sequences outside `cached`, pages held only by `cached` ones, free pages).

        Shared pages count once, as the first kind when any outside sequence holds them; the
        three add up to total_pages. Safe from another thread while the engine thread changes
        the accountant: it reads one copy of the table (list() of a dict with int keys runs in C
        without releasing the GIL), so a concurrent change skews one reading, never raises.
        """
        live: set[int] = set()
        for seq_id, pages in list(self._pages.items()):
            if seq_id not in cached:
                live.update(pages)
        free = len(self._free_ids)
        held = self.total_pages - free
        used = min(len(live), held)
        return used, held - used, free

    # -- decisions --------------------------------------------------------------------
    def can_allocate(self, num_tokens: int) -> bool:
        return self.pages_needed(num_tokens) <= self.free_pages

    def can_append(self, seq_id: int, num_new_tokens: int) -> bool:
        return self._extra_pages(seq_id, num_new_tokens) <= self.free_pages

    def can_fork(self, parent_id: int, pos: int, num_tokens: int) -> bool:
        """Can a child forked from `parent_id` at `pos` then grow to `num_tokens` tokens?"""
        self._check_fork_pos(parent_id, pos)
        self._check_forkable()
        shared = pos // self.page_size
        return self.pages_needed(max(num_tokens, pos)) - shared <= self.free_pages

    # -- changes ----------------------------------------------------------------------
    def allocate(self, seq_id: int, num_tokens: int) -> None:
        """Register a new sequence holding `num_tokens` tokens."""
        if seq_id in self._pages:
            raise RuntimeError(f"sequence {seq_id} already holds pages")
        self._pages[seq_id] = self._take(self.pages_needed(num_tokens), f"allocate sequence {seq_id}")
        self._tokens[seq_id] = num_tokens

    def append(self, seq_id: int, num_new_tokens: int) -> None:
        """Grow a sequence by `num_new_tokens` tokens, taking pages when it crosses a page boundary."""
        if not self.try_append(seq_id, num_new_tokens):
            extra = self._extra_pages(seq_id, num_new_tokens)
            self._take(extra, f"append {num_new_tokens} tokens to sequence {seq_id}")          # raises

    def try_append(self, seq_id: int, num_new_tokens: int) -> bool:
        """append() if the free pages allow it (True), else change nothing (False): can_append and
        append in one look-up, what the scheduler does for every decoding sequence every step."""
        if num_new_tokens < 0:
            raise ValueError(f"cannot append {num_new_tokens} tokens")
        extra = self._extra_pages(seq_id, num_new_tokens)
        if extra > len(self._free_ids):
            return False
        if extra:
            self._pages[seq_id] += self._take(extra, "")
        self._tokens[seq_id] += num_new_tokens
        return True

    def pop(self, seq_id: int, n: int) -> None:
        """Drop a sequence's last `n` tokens (TVM PopN semantics: pages they alone filled become free;
        speculative decoding gives back its rejected draft tokens). Only tokens in pages the sequence
        holds alone may go."""
        tokens = self.num_tokens(seq_id)
        if not 0 <= n <= tokens:
            raise RuntimeError(f"cannot pop {n} tokens from sequence {seq_id} of {tokens}")
        pages = self._pages[seq_id]
        keep = self.pages_needed(tokens - n)
        if any(self._refs[page] > 1 for page in pages[keep:]):
            raise RuntimeError(f"cannot pop {n} tokens from sequence {seq_id}: a page they leave is shared")
        for page in pages[keep:]:
            self._refs[page] = 0
            self._free_ids.append(page)
        del pages[keep:]
        self._tokens[seq_id] = tokens - n

    def fork(self, parent_id: int, child_id: int, pos: int) -> None:
        """Make `child_id` hold the parent's first `pos` tokens (TVM ForkSequence semantics).

        Full pages inside [0, pos) are shared (one more reference each); a partially
        covered page is copied into a fresh page of the child.
        """
        self._check_fork_pos(parent_id, pos)
        self._check_forkable()
        if child_id in self._pages:
            raise RuntimeError(f"cannot fork into sequence {child_id}: it already holds pages")
        full, partial = divmod(pos, self.page_size)
        shared = self._pages[parent_id][:full]
        fresh = self._take(1 if partial else 0, f"fork sequence {parent_id} into {child_id} at {pos}")
        for page in shared:
            self._refs[page] += 1
        self._pages[child_id] = shared + fresh
        self._tokens[child_id] = pos

    def rename(self, seq_id: int, new_id: int) -> None:
        """`new_id` takes over everything `seq_id` holds (a recurrent prefix-cache entry continued)."""
        if new_id in self._pages:
            raise RuntimeError(f"cannot rename sequence {seq_id} to {new_id}: it already holds pages")
        self._pages[new_id] = self._pages.pop(self._known(seq_id))
        self._tokens[new_id] = self._tokens.pop(seq_id)

    def free(self, seq_id: int) -> None:
        """Drop a sequence; pages nobody else holds become free."""
        for page in self._pages.pop(self._known(seq_id)):
            self._refs[page] -= 1
            if self._refs[page] == 0:
                self._free_ids.append(page)
        del self._tokens[seq_id]

    def check(self) -> None:
        """Verify the bookkeeping is self-consistent (for tests and debugging); raises RuntimeError."""
        refs = [0] * self.total_pages
        for seq_id, pages in list(self._pages.items()):
            if len(pages) != self.pages_needed(self._tokens[seq_id]):
                raise RuntimeError(f"sequence {seq_id} holds {len(pages)} pages for {self._tokens[seq_id]} tokens")
            for page in pages:
                refs[page] += 1
        if refs != self._refs:
            raise RuntimeError("page reference counts disagree with the pages sequences hold")
        held = {p for p, r in enumerate(refs) if r > 0}
        if held & set(self._free_ids) or len(held) + len(self._free_ids) != self.total_pages:
            raise RuntimeError(f"{len(held)} held + {len(self._free_ids)} free pages != {self.total_pages} total")

    # -- internals --------------------------------------------------------------------
    def _known(self, seq_id: int) -> int:
        if seq_id not in self._pages:
            raise KeyError(f"sequence {seq_id} holds no pages")
        return seq_id

    def _extra_pages(self, seq_id: int, num_new_tokens: int) -> int:
        pages = self._pages.get(seq_id)
        if pages is None:
            raise KeyError(f"sequence {seq_id} holds no pages")
        return self.pages_needed(self._tokens[seq_id] + num_new_tokens) - len(pages)

    def _check_fork_pos(self, parent_id: int, pos: int) -> None:
        length = self.num_tokens(parent_id)
        if not 0 <= pos <= length:
            raise RuntimeError(f"fork position {pos} is outside parent sequence {parent_id} of {length} tokens")

    def _check_forkable(self) -> None:
        if self.max_pages_per_seq is not None:
            raise RuntimeError("sequences under a per-sequence sliding window cannot be forked (TVM forks them "
                               "only inside attention sinks); schedule them without forks")

    def _take(self, n: int, what: str) -> list[int]:
        if n > len(self._free_ids):
            raise RuntimeError(f"cannot {what}: needs {n} pages, {len(self._free_ids)} free "
                               f"of {self.total_pages} (check can_allocate/can_append/can_fork first)")
        pages = [self._free_ids.pop() for _ in range(n)]
        for page in pages:
            self._refs[page] = 1
        return pages
