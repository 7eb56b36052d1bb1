"""SerialSmallLoops (targets/cpu/serial_small.py): parallel loops over little work get a serial twin.

The work count, the rewrite's three outcomes (serial, twin behind the work's compare, left alone),
the loops it must leave alone, and both branches of a twin built and run against numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.script import tirx as T

from kiln.targets import get_profile
from kiln.targets.cpu.serial_small import SERIAL_WORK, body_work, serial_when_small, serial_small_loops

pytestmark = pytest.mark.compiler


@T.prim_func(s_tir=True)
def add_rows(a_h: T.handle, b_h: T.handle, c_h: T.handle):
    n = T.int64()
    a = T.match_buffer(a_h, (n, T.int64(576)))
    b = T.match_buffer(b_h, (n, T.int64(576)))
    c = T.match_buffer(c_h, (n, T.int64(576)))
    for i in T.parallel(n):
        for j0 in range(T.int64(36)):
            for j1 in T.vectorized(T.int64(16)):
                with T.sblock("add"):
                    vi = T.axis.spatial(n, i)
                    vj = T.axis.spatial(T.int64(576), j0 * T.int64(16) + j1)
                    c[vi, vj] = a[vi, vj] + b[vi, vj]


def _static_add(rows: int):
    @T.prim_func(s_tir=True)
    def add(a: T.Buffer((rows, 64), "float32"), c: T.Buffer((rows, 64), "float32")):
        for i in T.parallel(rows):
            for j in range(64):
                with T.sblock("add"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    c[vi, vj] = a[vi, vj] + T.float32(1)
    return add


@T.prim_func(s_tir=True)
def row_sums(a_h: T.handle, c_h: T.handle):
    n, k = T.int64(), T.int64()
    a = T.match_buffer(a_h, (n, k))
    c = T.match_buffer(c_h, (n,))
    for i in T.parallel(n):
        for j in range(k):                              # the work depends on k: left alone
            with T.sblock("sum"):
                vi, vj = T.axis.remap("SR", [i, j])
                with T.init():
                    c[vi] = T.float32(0)
                c[vi] = c[vi] + a[vi, vj]


@T.prim_func(s_tir=True)
def scratch_rows(a_h: T.handle, c_h: T.handle):
    n = T.int64()
    a = T.match_buffer(a_h, (n, T.int64(8)))
    c = T.match_buffer(c_h, (n, T.int64(8)))
    for i in T.parallel(n):
        with T.sblock("row"):
            t = T.sblock_alloc_buffer((8,), "float32")  # a twin would define it twice: left alone
            for j in range(8):
                t[j] = a[i, j] * T.float32(2)
            for j in range(8):
                c[i, j] = t[j]


@T.prim_func(s_tir=True)
def padded_rows(a_h: T.handle, c_h: T.handle):
    n = T.int64()
    a = T.match_buffer(a_h, (n, T.int64(1040)))
    c = T.match_buffer(c_h, (n, T.int64(1040)))
    for i in T.parallel((n + T.int64(1)) // T.int64(2) * T.int64(16)):   # 16 x 1,040 >= 16,384 at n = 1
        for j in range(T.int64(1040)):
            with T.sblock("copy"):
                c[i % n, j] = a[i % n, j]


def _loop_kinds(func) -> list:
    kinds = []

    def visit(loop, visitor):
        kinds.append(loop.kind)
        return visitor.default_visit(loop)
    tvm_ffi.structural_visit(func.body, (tirx.For, visit))
    return kinds


def test_body_work_counts_stores_with_vector_lanes():
    loop = add_rows.body.block.body                     # the parallel loop under the root block
    assert loop.kind == tirx.ForKind.PARALLEL
    assert body_work(loop.body) == 576
    assert body_work(row_sums.body.block.body.body) is None


def test_symbolic_rows_get_a_serial_twin_behind_the_work():
    out = serial_when_small(add_rows)
    kinds = _loop_kinds(out)
    assert kinds.count(tirx.ForKind.PARALLEL) == 1 and kinds.count(tirx.ForKind.SERIAL) == 3
    branch = out.body.block.body
    assert isinstance(branch, tirx.IfThenElse)
    assert "576" in str(branch.condition) and str(SERIAL_WORK) in str(branch.condition)
    assert branch.then_case.kind == tirx.ForKind.SERIAL and branch.else_case.kind == tirx.ForKind.PARALLEL


def test_static_loops_take_one_side():
    small, large = _static_add(4), _static_add(SERIAL_WORK // 64)       # 256 and exactly SERIAL_WORK stores
    assert tirx.ForKind.PARALLEL not in _loop_kinds(serial_when_small(small))
    assert serial_when_small(large).same_as(large)


@pytest.mark.parametrize("func", [row_sums, scratch_rows, padded_rows],
                         ids=["symbolic-work", "allocates", "no-rows-fit"])
def test_left_alone(func):
    assert serial_when_small(func).same_as(func)


@pytest.mark.parametrize("rows", [1, 3, 28, 29, 64])   # 28 x 576 < 16,384 <= 29 x 576: both branches
def test_twin_computes_the_same(rows):
    mod = serial_small_loops(tvm.IRModule({"main": add_rows}))
    lib = tvm.compile(mod, target=get_profile("cpu").tvm_target())
    rng = np.random.default_rng(rows)
    a, b = (rng.standard_normal((rows, 576)).astype("float32") for _ in range(2))
    c = tvm.runtime.tensor(np.zeros((rows, 576), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    np.testing.assert_array_equal(c.numpy(), a + b)


def test_cpu_profile_runs_it_at_finalize():
    assert serial_small_loops in get_profile("cpu").passes("finalize")
