"""The runner's two KV caches behind one interface: TVM's paged KV cache (TVMCache, through its VM
builtins) and the cache kiln owns (OwnedCache: models/owned_kv.py is its graph half).

Both keep sequences by id and answer the same calls: add, remove, fork, pop, free_pages, length,
and begin(seq_ids, lengths) before a forward, which returns what the entry function takes as its
cache argument, then end() after it. TVM's cache builds its page tables inside begin; the owned
cache builds them here (numpy) and stages them to the device through the runner's `stage`.

OwnedCache allocates every layer's pages once ([pages, 2, kv heads, page size, head dim] each, a layer's
own sizes; a layer that shares an earlier one's keys and values has none: KVCacheLayout.layer_sources; the
graph writes them in place) and hands pages out per sequence in token order, one pool for every
layer (a page id names the same slot in each layer's tensor). It keeps every token (sliding layers
mask by position), so it has no window bound per forward, and sequences share pages on any model,
sliding ones included: a child forked at `pos` holds the parent's pages that lie wholly inside the
first `pos` tokens (reference counted) and a copy of the one it covers partly (as TVM's cache forks,
runtime/kv_pages.py mirrors it), and a forward that would append into a page another sequence also
holds (a pop left it partly filled) copies it first.

Recurrent layers (KVCacheLayout.layer_states: Qwen3.5's gated DeltaNet) keep no pages: each sequence holds
a slot of their state tensors ([slots, ...] float32, one slot per sequence the engine runs at once) from
add to remove, and the kernels read and write it in place (targets/recurrent.py; a sequence whose first
new token is position 0 starts from zeros). A state holds all the tokens before it, so such a cache
forks only at a sequence's end (the slot copied) and gives no tokens back: the engine shares no prefixes
and speculates on none of it (KVCacheLayout.rewind_problem).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ._tvm import tvm
from tvm.runtime import ShapeTuple

from .contract import OWNED_KV_TABLES, OWNED_STATE_TABLES, KVCacheLayout
from .device_tensors import _VIEW, _holding_gil

_KV = {name: _holding_gil(tvm.get_global_func(f"vm.builtin.{name}")) for name in (
    "kv_state_add_sequence", "kv_state_remove_sequence", "kv_state_fork_sequence", "kv_state_popn",
    "kv_state_begin_forward", "kv_state_end_forward", "attention_kv_cache_get_num_available_pages",
    "attention_kv_cache_get_sequence_length", "attention_kv_cache_enable_sliding_window_for_seq",
    "attention_kv_cache_get_query_positions")}


class TVMCache:
    """TVM's PagedKVCache, created by the artifact's create_paged_kv_cache."""

    owner = "tvm"

    def __init__(self, handle, window=None):
        self.handle = handle
        self.window = window            # runtime/sliding_window.py SlidingWindow, or None

    def add(self, seq_id: int) -> None:
        _KV["kv_state_add_sequence"](self.handle, seq_id)
        if self.window and self.window.per_sequence:
            _KV["attention_kv_cache_enable_sliding_window_for_seq"](self.handle, seq_id, self.window.kept,
                                                                    self.window.attention_sink)

    def remove(self, seq_id: int) -> None:
        _KV["kv_state_remove_sequence"](self.handle, seq_id)

    def fork(self, parent: int, child: int, fork_pos: int = -1) -> None:
        _KV["kv_state_fork_sequence"](self.handle, parent, child, fork_pos)

    def pop(self, seq_id: int, n: int) -> None:
        _KV["kv_state_popn"](self.handle, seq_id, n)

    def free_pages(self) -> int:
        return int(_KV["attention_kv_cache_get_num_available_pages"](self.handle))

    def length(self, seq_id: int) -> int:
        return int(_KV["attention_kv_cache_get_sequence_length"](self.handle, seq_id))

    def begin(self, seq_ids: Sequence[int], lengths: Sequence[int]):
        _KV["kv_state_begin_forward"](self.handle, ShapeTuple(list(seq_ids)), ShapeTuple(list(lengths)))
        return self.handle

    def copy_tables(self) -> None:
        """The forward's page tables copied to the device now (before a CUDA graph replays)."""
        _KV["attention_kv_cache_get_query_positions"](self.handle)

    def end(self) -> None:
        _KV["kv_state_end_forward"](self.handle)


class OwnedCache:
    """The pages and page tables of the KV cache kiln owns (KVCacheLayout.owner "kiln")."""

    owner = "kiln"

    def __init__(self, layout: KVCacheLayout, device, total_tokens: int, stage: Callable[[str, np.ndarray], object],
                 max_seqs: int = 1):
        self.page_size = layout.page_size
        self.num_pages = max(-(-total_tokens // layout.page_size), 1)
        shapes = [(self.num_pages, 2, h_kv, layout.page_size, d) for h_kv, d in map(layout.kv_of, layout.owners)]
        self.pages = [tvm.runtime.empty(shape, layout.dtype, device) for shape in shapes]   # the layers holding pages
        self.states = [tvm.runtime.empty((max_seqs, *shape), "float32", device) for shape in layout.states]
        self._pages_arg = tvm.runtime.convert(self.pages + self.states)
        self._free_slots = list(range(max_seqs - 1, -1, -1)) if self.states else []
        self._slot: dict[int, int] = {}                              # seq id -> its state slot (recurrent layers)
        self._stage = stage
        unknown = [name for name in layout.tables if name not in OWNED_KV_TABLES + OWNED_STATE_TABLES]
        if unknown:
            raise ValueError(f"this artifact's KV cache takes page tables {unknown}, which this kiln does not build; "
                             "recompile it with `kiln compile`")
        self._tables = layout.tables
        self._free = list(range(self.num_pages - 1, -1, -1))      # a stack: page 0 first
        self._refs = [0] * self.num_pages                          # sequences holding each page
        self._held: dict[int, list[int]] = {}                     # seq id -> page ids, in token order
        self._length: dict[int, int] = {}

    def add(self, seq_id: int) -> None:
        if seq_id in self._held:
            raise KeyError(f"sequence {seq_id} is already in the KV cache")
        if self.states:
            if not self._free_slots:
                raise RuntimeError(f"every recurrent state slot ({len(self._slot)}) is "
                                   "held; remove a sequence first")
            self._slot[seq_id] = self._free_slots.pop()
        self._held[seq_id], self._length[seq_id] = [], 0

    def remove(self, seq_id: int) -> None:
        self._release(self._held.pop(seq_id))
        del self._length[seq_id]
        if seq_id in self._slot:
            self._free_slots.append(self._slot.pop(seq_id))

    def rename(self, seq_id: int, new_id: int) -> None:
        """`new_id` takes over the sequence: its pages, length and state slot (nothing is copied)."""
        if new_id in self._held:
            raise KeyError(f"sequence {new_id} is already in the KV cache")
        self._held[new_id], self._length[new_id] = self._held.pop(seq_id), self._length.pop(seq_id)
        if seq_id in self._slot:
            self._slot[new_id] = self._slot.pop(seq_id)

    def fork(self, parent: int, child: int, fork_pos: int = -1) -> None:
        """`child` (new) holds the parent's first fork_pos tokens (all of them for -1)."""
        length = self._length[parent]
        pos = length if fork_pos == -1 else fork_pos
        if child in self._held or not 0 <= pos <= length:
            raise ValueError(f"cannot fork sequence {parent} ({length} tokens) at {fork_pos} into {child}")
        if self.states and pos != length:
            raise ValueError(f"cannot fork sequence {parent} at {pos} of its {length} tokens: its recurrent layers' "
                             "state holds them all (fork at its end, or compute the child's prompt)")
        whole, part = divmod(pos, self.page_size)
        if part and not self._free:
            raise RuntimeError("the KV cache is full: a fork needs 1 more page, 0 are free")
        if self.states:                 # its slot first: with none free, nothing else has changed
            self.add(child)
            for state in self.states:
                copy_row(state, self._slot[parent], self._slot[child])
        shared = self._held[parent][:whole]
        for page in shared:
            self._refs[page] += 1
        self._held[child], self._length[child] = list(shared), pos
        if part:
            self._held[child].append(self._copy(self._held[parent][whole]))

    def pop(self, seq_id: int, n: int) -> None:
        """Drop the sequence's last n tokens (and the pages they leave empty)."""
        length = self._length[seq_id]
        if not 0 <= n <= length:
            raise ValueError(f"cannot pop {n} tokens from sequence {seq_id}, which holds {length}")
        if n and self.states:
            raise ValueError(f"cannot pop tokens from sequence {seq_id}: its recurrent layers' state holds them")
        self._length[seq_id] = length - n
        keep = -(-(length - n) // self.page_size)
        held = self._held[seq_id]
        self._release(held[keep:])
        del held[keep:]

    def free_pages(self) -> int:
        return len(self._free)

    def length(self, seq_id: int) -> int:
        return self._length[seq_id]

    def begin(self, seq_ids: Sequence[int], lengths: Sequence[int]):
        """Grow each sequence by its count of new tokens; the cache argument of the forward: the pages
        and the tables (models/owned_kv.py TABLES) staged on the device."""
        need = 0
        for seq_id, n in zip(seq_ids, lengths):
            need += -(-(self._length[seq_id] + n) // self.page_size) - len(self._held[seq_id])
            need += self._shared_tail(seq_id)
        if need > len(self._free):
            raise RuntimeError(f"the KV cache is full: this forward needs {need} more pages, {len(self._free)} "
                               "are free")
        positions, slots, seq_of = [], [], []
        for b, (seq_id, n) in enumerate(zip(seq_ids, lengths)):
            start, held = self._length[seq_id], self._held[seq_id]
            if self._shared_tail(seq_id):          # its partly filled last page is another's too: copied first
                old = held[-1]
                held[-1] = self._copy(old)
                self._release([old])
            grow = -(-(start + n) // self.page_size) - len(held)
            for _ in range(grow):
                held.append(self._take())
            at = np.arange(start, start + n, dtype=np.int32)
            positions.append(at)
            slots.append(np.asarray(held, np.int32)[at // self.page_size] * self.page_size + at % self.page_size)
            seq_of.append(np.full(n, b, np.int32))
            self._length[seq_id] = start + n
        held = [self._held[s] for s in seq_ids]
        tables = {                      # contract.OWNED_KV_TABLES; passed in the artifact's order
            "page_indptr": np.concatenate([[0], np.cumsum([len(h) for h in held])]).astype(np.int32),
            "page_values": np.fromiter((p for h in held for p in h), np.int32),
            "seq_of": np.concatenate(seq_of),
            "positions": np.concatenate(positions),
            "slots": np.concatenate(slots).astype(np.int32),
            "q_indptr": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
            "last_len": np.array([(self._length[s] - 1) % self.page_size + 1 for s in seq_ids], np.int32),
            "rope_offset": np.zeros(len(seq_ids), np.int32),
            "state_slots": np.array([self._slot.get(s, 0) for s in seq_ids], np.int32),
        }
        return [self._pages_arg, *(self._stage(f"kv_{name}", tables[name]) for name in self._tables)]

    def copy_tables(self) -> None:
        pass

    def end(self) -> None:
        pass

    # -- pages --------------------------------------------------------------------------
    def _take(self) -> int:
        page = self._free.pop()
        self._refs[page] = 1
        return page

    def _release(self, pages: Sequence[int]) -> None:
        for page in reversed(pages):
            self._refs[page] -= 1
            if not self._refs[page]:
                self._free.append(page)

    def _shared_tail(self, seq_id: int) -> int:
        """1 when the sequence's last page is partly filled and another sequence holds it too."""
        held = self._held[seq_id]
        return int(bool(held) and self._length[seq_id] % self.page_size != 0 and self._refs[held[-1]] > 1)

    def _copy(self, page: int) -> int:
        """A new page holding `page`'s keys and values in every layer (device to device)."""
        new = self._take()
        for pages in self.pages:
            copy_row(pages, page, new)
        return new


def copy_row(tensor, src: int, dst: int) -> None:
    """Row `src` of a tensor (a page of pages, a slot of a state) copied into row `dst`, device to device."""
    elems = int(np.prod(tensor.shape[1:]))
    shape, nbytes = ShapeTuple([elems]), elems * np.dtype(tensor.dtype).itemsize
    _VIEW(tensor, shape, tensor.dtype, dst * nbytes).copyfrom(_VIEW(tensor, shape, tensor.dtype, src * nbytes))
