"""Transparent huge pages for a CPU runner's weights and KV cache (Linux).

Why: a decode step streams every weight and, at long contexts, the KV cache; with 4 KB pages each
4 KB is its own TLB entry and a new page walk. SmolLM2 Q4_1 on a znver4 (2 cores, `kiln bench`,
prompt 128, three alternating rounds): batch-1 decode 206-208 tok/s against 193-197 without, peak
RSS 378 MB against 368; every allocation advised (glibc's `glibc.malloc.hugetlb=1` tunable, which
kiln cannot set from inside the process) 211-212 at 443 MB. At 2,000 tokens of context 92 against
86-91. Linux's THP mode `madvise` (Debian's default) gives huge
pages only to ranges advised so, at the faults that first touch them; here the weights are copied
into advised mappings of their own (HostArena) and the KV cache's new mappings are advised right
after TVM allocates them (its pages are written as sequences fill them). KILN_HUGE_PAGES=0 turns it off.
Where THP is `never`, off, or not Linux, nothing is advised and tensors load as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

HUGE_PAGE = 2 << 20                 # x86-64's and AArch64's (4 KB base pages) transparent huge page
MADV_HUGEPAGE = 14
_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def enabled() -> bool:
    """Whether advising can give huge pages here: Linux with THP not `never`, and not turned off."""
    if not sys.platform.startswith("linux") or os.environ.get("KILN_HUGE_PAGES", "1") == "0":
        return False
    try:
        return "[never]" not in _THP.read_text()
    except OSError:
        return False


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def advise(address: int, nbytes: int) -> bool:
    """madvise(MADV_HUGEPAGE) over the whole huge pages inside [address, address + nbytes)."""
    start = _round_up(address, HUGE_PAGE)
    end = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
    if end <= start:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE) == 0


class HostArena:
    """CPU tensors placed in anonymous mappings advised for huge pages (chunks of at least CHUNK
    bytes, each tensor 64-byte aligned as TVM's allocator aligns them), handed to TVM without a
    copy (DLPack). Every tensor of a model shares the chunks, so the many small weights of a layer
    sit on huge pages too (a tensor of its own would be one only from 4 MB up)."""

    CHUNK = 64 << 20

    def __init__(self) -> None:
        self._chunks: list[mmap.mmap] = []
        self._offset = 0                # where the last chunk's free bytes start

    def tensor(self, array: np.ndarray):
        """A TVM CPU tensor holding a copy of `array`, in the arena."""
        import tvm
        nbytes = max(array.nbytes, 1)
        offset = _round_up(self._offset, 64)
        if not self._chunks or offset + nbytes > len(self._chunks[-1]):
            offset = self._new_chunk(nbytes)
        view = np.frombuffer(self._chunks[-1], dtype=array.dtype, count=array.size, offset=offset).reshape(array.shape)
        view[...] = array
        self._offset = offset + nbytes
        return tvm.runtime.from_dlpack(view)

    def _new_chunk(self, nbytes: int) -> int:
        """A chunk for at least `nbytes`; the offset of its first whole huge page."""
        size = max(self.CHUNK, _round_up(nbytes, HUGE_PAGE)) + HUGE_PAGE
        chunk = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)     # untouched until written
        start = _round_up(_address(chunk), HUGE_PAGE) - _address(chunk)
        with contextlib.suppress(OSError):
            chunk.madvise(mmap.MADV_HUGEPAGE, start, (size - start) // HUGE_PAGE * HUGE_PAGE)
        self._chunks.append(chunk)
        return start


def _address(chunk: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(chunk))


def anonymous_mappings() -> set[tuple[int, int]]:
    """(start, end) of this process's writable anonymous mappings and its heap (/proc/self/maps):
    malloc serves allocations below its mmap threshold (which grows to 32 MB) from the heap."""
    out = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if fields[1].startswith("rw") and (len(fields) == 5 or fields[5:] == ["[heap]"]):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                out.add((start, end))
    return out


@contextlib.contextmanager
def advised_new_mappings(cpu: bool, min_bytes: int = 2 * HUGE_PAGE) -> Iterator[None]:
    """Advise the anonymous mappings of at least `min_bytes` the block creates (a CPU device's memory,
    where THP can serve it): what TVM allocates inside, before it is touched."""
    if not cpu or not enabled():
        yield
        return
    before = anonymous_mappings()
    yield
    for start, end in anonymous_mappings() - before:
        for piece_start, piece_end in _outside(start, end, before):       # a grown or merged mapping's new part
            if piece_end - piece_start >= min_bytes:
                advise(piece_start, piece_end - piece_start)


def _outside(start: int, end: int, ranges: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [start, end) outside every range in `ranges`."""
    pieces = [(start, end)]
    for r_start, r_end in ranges:
        pieces = [part for s, e in pieces for part in ((s, min(e, r_start)), (max(s, r_end), e)) if part[0] < part[1]]
    return pieces
