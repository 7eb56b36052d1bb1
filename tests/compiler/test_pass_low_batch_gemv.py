"""LowBatchGEMV + DispatchLowBatchGEMV: NT matmuls over symbolic rows get a GEMV kernel for <= 4 rows.

Before/After in TVMScript for both halves, the cases left alone, and a small module compiled
through kiln's CPU pipeline with and without the passes vs numpy at 1..9 rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir
from tvm.relax.frontend import nn
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from kiln.compiler import pipeline
from kiln.targets.cpu.low_batch_gemv import DispatchLowBatchGEMV, LowBatchGEMV
from kiln.targets import get_profile

pytestmark = pytest.mark.compiler


@I.ir_module
class Before:
    @T.prim_func(private=True, s_tir=True)
    def NT_matmul(x_h: T.handle, w: T.Buffer((T.int64(4), T.int64(8)), "float32"), y_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (T.int64(1), n, T.int64(8)))
        y = T.match_buffer(y_h, (T.int64(1), n, T.int64(4)))
        for i0, i1, i2, k in T.grid(T.int64(1), n, T.int64(4), T.int64(8)):
            with T.sblock("NT_matmul"):
                v_i0, v_i1, v_i2, v_k = T.axis.remap("SSSR", [i0, i1, i2, k])
                with T.init():
                    y[v_i0, v_i1, v_i2] = T.float32(0.0)
                y[v_i0, v_i1, v_i2] = y[v_i0, v_i1, v_i2] + x[v_i0, v_i1, v_k] * w[v_i2, v_k]

    @R.function
    def main(x: R.Tensor((1, "n", 8), "float32"), w: R.Tensor((4, 8), "float32")):
        n = T.int64()
        cls = Before
        with R.dataflow():
            y = R.call_tir(cls.NT_matmul, (x, w), out_ty=R.Tensor((1, n, 4), "float32"))
            R.output(y)
        return y


@I.ir_module
class After:
    @T.prim_func(private=True, s_tir=True)
    def NT_matmul(x_h: T.handle, w: T.Buffer((T.int64(4), T.int64(8)), "float32"), y_h: T.handle):
        T.func_attr({"kiln.gemv_copy": "NT_matmul_gemv", "tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (T.int64(1), n, T.int64(8)))
        y = T.match_buffer(y_h, (T.int64(1), n, T.int64(4)))
        for i0, i1, i2, k in T.grid(T.int64(1), n, T.int64(4), T.int64(8)):
            with T.sblock("NT_matmul"):
                v_i0, v_i1, v_i2, v_k = T.axis.remap("SSSR", [i0, i1, i2, k])
                with T.init():
                    y[v_i0, v_i1, v_i2] = T.float32(0.0)
                y[v_i0, v_i1, v_i2] = y[v_i0, v_i1, v_i2] + x[v_i0, v_i1, v_k] * w[v_i2, v_k]

    @T.prim_func(private=True, s_tir=True)
    def NT_matmul_gemv(x_h: T.handle, w: T.Buffer((T.int64(4), T.int64(8)), "float32"), y_h: T.handle):
        T.func_attr({"kiln.gemv": 4, "tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (T.int64(1), n, T.int64(8)))
        y = T.match_buffer(y_h, (T.int64(1), n, T.int64(4)))
        for i0, i1, i2, k in T.grid(T.int64(1), n, T.int64(4), T.int64(8)):
            with T.sblock("NT_matmul"):
                v_i0, v_i1, v_i2, v_k = T.axis.remap("SSSR", [i0, i1, i2, k])
                with T.init():
                    y[v_i0, v_i1, v_i2] = T.float32(0.0)
                y[v_i0, v_i1, v_i2] = y[v_i0, v_i1, v_i2] + x[v_i0, v_i1, v_k] * w[v_i2, v_k]

    @R.function
    def main(x: R.Tensor((1, "n", 8), "float32"), w: R.Tensor((4, 8), "float32")):
        n = T.int64()
        cls = After
        with R.dataflow():
            y = R.call_tir(cls.NT_matmul, (x, w), out_ty=R.Tensor((1, n, 4), "float32"))
            R.output(y)
        return y


def assert_functions_equal(actual: tvm.IRModule, expected: tvm.IRModule) -> None:
    """Function by function: the GEMV copy shares its original's param vars by design (so that
    DispatchLowBatchGEMV can drop its scheduled body in), which a whole-module comparison against
    separately parsed functions would flag."""
    by_name = lambda mod: {gv.name_hint: f for gv, f in mod.functions_items()}  # noqa: E731
    actual, expected = by_name(actual), by_name(expected)
    assert actual.keys() == expected.keys()
    for name, func in expected.items():
        tvm.ir.assert_structural_equal(actual[name], func, map_free_vars=True)  # GlobalVars of two modules


def test_low_batch_gemv_adds_a_tagged_copy():
    out = LowBatchGEMV(max_rows=4)(Before)
    assert_functions_equal(out, After)
    assert all(p.same_as(q) for p, q in zip(out["NT_matmul"].params, out["NT_matmul_gemv"].params))


@I.ir_module
class StaticRows:  # the decode entry's [1, 1, h]: nothing to dispatch on
    @T.prim_func(private=True, s_tir=True)
    def NT_matmul(x: T.Buffer((T.int64(1), T.int64(1), T.int64(8)), "float32"),
                  w: T.Buffer((T.int64(4), T.int64(8)), "float32"),
                  y: T.Buffer((T.int64(1), T.int64(1), T.int64(4)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i0, i1, i2, k in T.grid(T.int64(1), T.int64(1), T.int64(4), T.int64(8)):
            with T.sblock("NT_matmul"):
                v_i0, v_i1, v_i2, v_k = T.axis.remap("SSSR", [i0, i1, i2, k])
                with T.init():
                    y[v_i0, v_i1, v_i2] = T.float32(0.0)
                y[v_i0, v_i1, v_i2] = y[v_i0, v_i1, v_i2] + x[v_i0, v_i1, v_k] * w[v_i2, v_k]


@I.ir_module
class NotAMatmul:  # a row reduction over symbolic rows
    @T.prim_func(private=True, s_tir=True)
    def row_sum(x_h: T.handle, y_h: T.handle):
        n = T.int64()
        x = T.match_buffer(x_h, (n, T.int64(8)))
        y = T.match_buffer(y_h, (n, T.int64(1)))
        for i, j, k in T.grid(n, T.int64(1), T.int64(8)):
            with T.sblock("sum"):
                v_i, v_j, v_k = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    y[v_i, v_j] = T.float32(0.0)
                y[v_i, v_j] = y[v_i, v_j] + x[v_i, v_k]


@I.ir_module
class DequantizePrologue:  # quantized weights: their own rule dispatches on the rows
    @T.prim_func(private=True, s_tir=True)
    def dequantize_NT_matmul(x_h: T.handle, codes: T.Buffer((T.int64(4), T.int64(8)), "int8"),
                             scale: T.Buffer((T.int64(4),), "float32"), y_h: T.handle):
        n = T.int64()
        x = T.match_buffer(x_h, (T.int64(1), n, T.int64(8)))
        y = T.match_buffer(y_h, (T.int64(1), n, T.int64(4)))
        w = T.sblock_alloc_buffer((T.int64(4), T.int64(8)))
        for j, k in T.grid(T.int64(4), T.int64(8)):
            with T.sblock("dequantize"):
                v_j, v_k = T.axis.remap("SS", [j, k])
                w[v_j, v_k] = T.Cast("float32", codes[v_j, v_k]) * scale[v_j]
        for i0, i1, i2, k in T.grid(T.int64(1), n, T.int64(4), T.int64(8)):
            with T.sblock("NT_matmul"):
                v_i0, v_i1, v_i2, v_k = T.axis.remap("SSSR", [i0, i1, i2, k])
                with T.init():
                    y[v_i0, v_i1, v_i2] = T.float32(0.0)
                y[v_i0, v_i1, v_i2] = y[v_i0, v_i1, v_i2] + x[v_i0, v_i1, v_k] * w[v_i2, v_k]


@pytest.mark.parametrize("mod", [StaticRows, NotAMatmul, DequantizePrologue],
                         ids=["static-rows", "not-a-matmul", "dequantize-prologue"])
def test_low_batch_gemv_leaves_other_functions_alone(mod):
    tvm.ir.assert_structural_equal(LowBatchGEMV()(mod), mod)


def _split_j(func, factor: int):
    """A stand-in schedule: split + vectorise the output-column loop (params kept, as dlight does)."""
    sch = s_tir.Schedule(func)
    *_, j, _k = sch.get_loops(sch.get_sblock("NT_matmul"))
    sch.vectorize(sch.split(j, [None, factor])[1])
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _scheduled_pair(gemv_scheduled: bool = True) -> tvm.IRModule:
    """LowBatchGEMV's output with both matmuls "scheduled" differently (as after the schedule phase)."""
    funcs = {gv.name_hint: (gv, f) for gv, f in LowBatchGEMV()(Before).functions_items()}
    (gv, mm), (gv_copy, copy), (gv_main, main) = funcs["NT_matmul"], funcs["NT_matmul_gemv"], funcs["main"]
    return tvm.IRModule({gv: _split_j(mm, 4), gv_copy: _split_j(copy, 2) if gemv_scheduled else copy,
                         gv_main: main})


@I.ir_module
class Dispatched:
    @T.prim_func(private=True, s_tir=True)
    def NT_matmul(x_h: T.handle, w: T.Buffer((T.int64(4), T.int64(8)), "float32"), y_h: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (T.int64(1), n, T.int64(8)))
        y = T.match_buffer(y_h, (T.int64(1), n, T.int64(4)))
        with T.sblock("root"):
            T.reads()
            T.writes()
            if n <= T.int64(4):  # the GEMV copy's body
                with T.sblock("root"):
                    T.reads()
                    T.writes()
                    for i0, i1, i2_0 in T.grid(T.int64(1), n, T.int64(2)):
                        for i2_1 in T.vectorized(T.int64(2)):
                            for k in range(T.int64(8)):
                                with T.sblock("NT_matmul"):
                                    v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
                                    v_i2 = T.axis.spatial(T.int64(4), i2_0 * T.int64(2) + i2_1)
                                    v_k = T.axis.reduce(T.int64(8), k)
                                    with T.init():
                                        y[v_i0, v_i1, v_i2] = T.float32(0.0)
                                    y[v_i0, v_i1, v_i2] = y[v_i0, v_i1, v_i2] + x[v_i0, v_i1, v_k] * w[v_i2, v_k]
            else:  # the general matmul's
                with T.sblock("root"):
                    T.reads()
                    T.writes()
                    for i0, i1, i2_0 in T.grid(T.int64(1), n, T.int64(1)):
                        for i2_1 in T.vectorized(T.int64(4)):
                            for k in range(T.int64(8)):
                                with T.sblock("NT_matmul"):
                                    v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
                                    v_i2 = T.axis.spatial(T.int64(4), i2_0 * T.int64(4) + i2_1)
                                    v_k = T.axis.reduce(T.int64(8), k)
                                    with T.init():
                                        y[v_i0, v_i1, v_i2] = T.float32(0.0)
                                    y[v_i0, v_i1, v_i2] = y[v_i0, v_i1, v_i2] + x[v_i0, v_i1, v_k] * w[v_i2, v_k]

    @R.function
    def main(x: R.Tensor((1, "n", 8), "float32"), w: R.Tensor((4, 8), "float32")):
        n = T.int64()
        cls = Dispatched
        with R.dataflow():
            y = R.call_tir(cls.NT_matmul, (x, w), out_ty=R.Tensor((1, n, 4), "float32"))
            R.output(y)
        return y


def test_dispatch_folds_the_copy_behind_a_row_check():
    assert_functions_equal(DispatchLowBatchGEMV()(_scheduled_pair()), Dispatched)


def test_dispatch_drops_a_copy_the_target_did_not_schedule():
    out = DispatchLowBatchGEMV()(_scheduled_pair(gemv_scheduled=False))
    names = {gv.name_hint for gv, _ in out.functions_items()}
    assert names == {"NT_matmul", "main"}
    expected = _split_j(After["NT_matmul"], 4).without_attr("kiln.gemv_copy")
    tvm.ir.assert_structural_equal(out["NT_matmul"], expected, map_free_vars=True)


# ----------------------------------------------------------------------------- numerics

HIDDEN, OUT = 64, 96


class TwoProjections(nn.Module):
    """x + down(silu(up(x))): one plain NT matmul and one with a fused residual epilogue."""

    def __init__(self):
        self.up = nn.Linear(HIDDEN, OUT, bias=False)
        self.down = nn.Linear(OUT, HIDDEN, bias=False)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return x + self.down(nn.op.silu(self.up(x)))


@pytest.fixture(scope="module")
def builds():
    """(vm with the passes, vm without, the lowered module with them, params)."""
    model = TwoProjections()
    model.prefill, model.decode = model.forward, model.forward
    mod, named = model.export_tvm(spec={"prefill": {"x": nn.spec.Tensor([1, "seq_len", HIDDEN], "float32")},
                                        "decode": {"x": nn.spec.Tensor(["batch", 1, HIDDEN], "float32")}})
    rng = np.random.default_rng(0)
    params = [rng.normal(0, 0.1, p.shape).astype("float32") for _, p in named]
    profile = get_profile("cpu")
    vms = []
    for with_pass in (True, False):
        with pytest.MonkeyPatch.context() as m:
            if not with_pass:
                real = pipeline.phases
                m.setattr(pipeline, "phases", lambda prof: [(name, [p for p in ps if p.info.name != "LowBatchGEMV"])
                                                            for name, ps in real(prof)])
            ex = relax.build(mod, target=profile.tvm_target(), relax_pipeline=pipeline.build_pipeline(profile))
        vms.append(relax.VirtualMachine(ex, tvm.cpu()))
    lowered = [p for name, ps in pipeline.phases(profile) if name != "finalize" for p in ps]
    with profile.tvm_target():
        lowered_mod = tvm.transform.Sequential(lowered)(mod)
    return vms[0], vms[1], lowered_mod, params


def test_every_matmul_dispatches_on_its_rows(builds):
    *_, lowered, _ = builds
    names = {gv.name_hint for gv, _ in lowered.functions_items()}
    matmuls = [f for gv, f in lowered.functions_items() if "NT_matmul" in gv.name_hint]
    assert len(matmuls) == 4 and not any(n.endswith("_gemv") for n in names)  # 2 layouts x 2 projections
    for func in matmuls:
        text = func.script()
        assert ("batch <= T.int64(4)" in text) or ("seq_len <= T.int64(4)" in text)
        assert "T.parallel(" in text and "T.vectorized(" in text


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_same_results_with_and_without_the_pass(builds, rows):
    with_pass, without, _, (w_up, w_down) = builds
    rng = np.random.default_rng(rows)
    for entry, shape in (("decode", (rows, 1, HIDDEN)), ("prefill", (1, rows, HIDDEN))):
        x = rng.normal(0, 1, shape).astype("float32")
        h = x.astype(np.float64) @ w_up.T
        ref = x + (h / (1 + np.exp(-h))) @ w_down.T
        args = [tvm.runtime.tensor(a) for a in (x, w_up, w_down)]
        got, base = with_pass[entry](*args).numpy(), without[entry](*args).numpy()
        np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(got, base, atol=1e-5, rtol=1e-5)
