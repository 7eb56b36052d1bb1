"""A reduction across 16 vector lanes, shared by the CPU's hand-written kernels (quant_gemv.py,
argmax.py, attention.py): by halves, two vector operations and three scalar ones, where a serial
loop adds one lane at a time (15 dependent operations)."""

from __future__ import annotations

from tvm.script import tirx as T

LANES = 16


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
