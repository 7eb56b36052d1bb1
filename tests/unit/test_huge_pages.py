"""runtime/huge_pages.py: a CPU runner's weights in mappings advised for transparent huge pages, the
KV cache's new mappings advised after TVM allocates them. The tensors hold the arrays' values,
aligned as TVM's allocator aligns them, and a compiled kernel reads them; where THP is available the
memory is advised (smaps' `hg` flag) and, faulted in after the advice, on huge pages."""

from __future__ import annotations

import mmap
import re

import numpy as np
import pytest
import tvm

from kiln.runtime import huge_pages

pytestmark = pytest.mark.unit


def _mapping_of(address: int) -> dict:
    """smaps' fields of the mapping holding `address` (VmFlags as a set)."""
    lines = open("/proc/self/smaps").read().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if m and int(m[1], 16) <= address < int(m[2], 16):
            fields = {}
            for entry in lines[i + 1:]:
                if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", entry):
                    break
                key, _, value = entry.partition(":")
                fields[key] = set(value.split()) if key == "VmFlags" else value.strip()
            return fields
    raise AssertionError(f"no mapping holds {address:#x}")


needs_thp = pytest.mark.skipif(not huge_pages.enabled(), reason="transparent huge pages are off here (or not Linux)")


def test_arena_tensors_hold_the_arrays_and_run_in_a_kernel():
    arena = huge_pages.HostArena()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(n).astype(dt) for n, dt in [(7, np.float32), (3 << 20, np.float32),
                                                               (1000, np.float16), (5, np.int8), (1 << 16, np.uint32)]]
    tensors = [arena.tensor(a) for a in arrays]
    for a, t in zip(arrays, tensors):
        np.testing.assert_array_equal(t.numpy(), a)
        assert t.data_ptr() % 64 == 0 and t.device == tvm.cpu(0)
    ends = sorted((t.data_ptr(), t.data_ptr() + a.nbytes) for a, t in zip(arrays, tensors))
    assert all(end <= start for (_, end), (start, _) in zip(ends, ends[1:]))         # no overlaps
    big = arrays[1]
    x = tvm.runtime.tensor(np.zeros_like(big))
    tvm.compile(_double(big.size), target="llvm")["main"](tensors[1], x)          # what a weight is handed to
    np.testing.assert_array_equal(x.numpy(), big * 2)


def _double(n: int) -> tvm.IRModule:
    from tvm import te
    a = te.placeholder((n,), "float32", name="a")
    return tvm.IRModule({"main": te.create_prim_func([a, te.compute((n,), lambda i: a[i] * 2, name="b")])})


@needs_thp
def test_arena_memory_is_advised_and_on_huge_pages():
    arena = huge_pages.HostArena()
    t = arena.tensor(np.ones(16 << 20, np.uint8))
    smaps = _mapping_of(t.data_ptr())
    assert "hg" in smaps["VmFlags"]
    assert int(smaps["AnonHugePages"].split()[0]) >= 8 << 10          # KB: the 16 MB written, whole huge pages


@needs_thp
def test_mappings_made_inside_the_block_are_advised_and_older_ones_not():
    older = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with huge_pages.advised_new_mappings(cpu=True):
        newer = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        small = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    assert "hg" in _mapping_of(huge_pages._address(newer) + (4 << 20))["VmFlags"]
    assert "hg" not in _mapping_of(huge_pages._address(older))["VmFlags"]
    assert "hg" not in _mapping_of(huge_pages._address(small))["VmFlags"]
    with huge_pages.advised_new_mappings(cpu=False):                 # a GPU's memory: nothing advised
        gpu_side = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    assert "hg" not in _mapping_of(huge_pages._address(gpu_side) + (4 << 20))["VmFlags"]


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("KILN_HUGE_PAGES", "0")
    assert not huge_pages.enabled()
