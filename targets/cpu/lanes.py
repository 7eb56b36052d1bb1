"""What the CPU's hand-written kernels (quant_gemv.py, argmax.py, attention.py) share: a reduction
across 16 vector lanes (by halves, two vector operations and three scalar ones, where a serial loop
adds one lane at a time: 15 dependent operations), and a cache line's prefetch."""

from __future__ import annotations

from tvm.script import tirx as T

LANES = 16
LINE_BYTES = 64             # a cache line: the kernels that prefetch ask for one at a time


def add(a, b):
    return a + b


@T.macro
def fold16(buf, base, combine):
    """buf[base] = combine over buf[base : base + 16] (combine: add, T.max, T.min): vector operations
    on 8 then 4 lanes, then (0 with 2) with (1 with 3). A max or min exactly a serial loop's; a sum
    in another order."""
    for i in T.vectorized(8):
        buf[base + i] = combine(buf[base + i], buf[base + i + 8])
    for i in T.vectorized(4):
        buf[base + i] = combine(buf[base + i], buf[base + i + 4])
    buf[base] = combine(combine(buf[base], buf[base + 2]), combine(buf[base + 1], buf[base + 3]))


@T.macro
def prefetch(element):
    """The cache line holding `element` (a buffer load, buf[i, ...]) asked for: a read, kept in every
    cache level (llvm.prefetch)."""
    T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(element), T.int32(0), T.int32(3),
                                  T.int32(1)))
