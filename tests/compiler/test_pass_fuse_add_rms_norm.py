"""FuseAddRMSNorm: residual add + RMSNorm over the sum -> one two-output kernel.

Before/After in TVMScript, the cases it must leave alone, the CPU schedule of the fused kernel,
and a small pre-norm block compiled through kiln's CPU pipeline with and without the pass vs numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend import nn
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from kiln.compiler import pipeline
from kiln.compiler.passes.fuse_add_rms_norm import FuseAddRMSNorm
from kiln.models.layers import MLP, Norm
from kiln.targets import get_profile

pytestmark = pytest.mark.compiler


@I.ir_module
class Before:
    @R.function
    def main(x: R.Tensor((1, "n", 8), "float32"), r: R.Tensor((1, "n", 8), "float32"),
             w: R.Tensor((8,), "float32")):
        n = T.int64()
        with R.dataflow():
            y = R.add(x, r)
            z = R.nn.rms_norm(y, w, axes=[-1], epsilon=1e-5)
            o = R.add(y, z)  # y used again: the residual stream
            R.output(o)
        return o


@I.ir_module
class After:
    @T.prim_func(private=True, s_tir=True)
    def fuse_add_rms_norm(x_h: T.handle, r_h: T.handle, w: T.Buffer((T.int64(8),), "float32"),
                          y_h: T.handle, out_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        x = T.match_buffer(x_h, (T.int64(1), n, T.int64(8)))
        r = T.match_buffer(r_h, (T.int64(1), n, T.int64(8)))
        T_add = T.match_buffer(y_h, (T.int64(1), n, T.int64(8)))
        T_rms_norm = T.match_buffer(out_h, (T.int64(1), n, T.int64(8)))
        T_multiply_red = T.sblock_alloc_buffer((T.int64(1), n))
        rsqrt = T.sblock_alloc_buffer((T.int64(1), n))
        for i0, i1, i2 in T.grid(T.int64(1), n, T.int64(8)):
            with T.sblock("T_add"):
                v_i0, v_i1, v_i2 = T.axis.remap("SSS", [i0, i1, i2])
                T_add[v_i0, v_i1, v_i2] = x[v_i0, v_i1, v_i2] + r[v_i0, v_i1, v_i2]
        for i0, i1, k in T.grid(T.int64(1), n, T.int64(8)):
            with T.sblock("T_multiply_red"):
                v_i0, v_i1, v_k = T.axis.remap("SSR", [i0, i1, k])
                with T.init():
                    T_multiply_red[v_i0, v_i1] = T.float32(0.0)
                T_multiply_red[v_i0, v_i1] = (T_multiply_red[v_i0, v_i1]
                                              + T_add[v_i0, v_i1, v_k] * T_add[v_i0, v_i1, v_k])
        for i0, i1 in T.grid(T.int64(1), n):
            with T.sblock("rsqrt"):
                v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
                rsqrt[v_i0, v_i1] = T.rsqrt(T_multiply_red[v_i0, v_i1] / T.float32(8.0) + T.float32(1e-05))
        for i0, i1, i2 in T.grid(T.int64(1), n, T.int64(8)):
            with T.sblock("T_rms_norm"):
                v_i0, v_i1, v_i2 = T.axis.remap("SSS", [i0, i1, i2])
                T_rms_norm[v_i0, v_i1, v_i2] = rsqrt[v_i0, v_i1] * T_add[v_i0, v_i1, v_i2] * w[v_i2]

    @R.function
    def main(x: R.Tensor((1, "n", 8), "float32"), r: R.Tensor((1, "n", 8), "float32"),
             w: R.Tensor((8,), "float32")):
        n = T.int64()
        cls = After
        with R.dataflow():
            lv = R.call_tir(cls.fuse_add_rms_norm, (x, r, w),
                            out_ty=[R.Tensor((1, n, 8), "float32"), R.Tensor((1, n, 8), "float32")])
            y = lv[0]
            z = lv[1]
            o = R.add(y, z)
            R.output(o)
        return o


def test_before_after():
    tvm.ir.assert_structural_equal(FuseAddRMSNorm()(Before), After)


@I.ir_module
class SumUsedOnlyByNorm:  # the final norm: FuseOps would leave the add a kernel of its own
    @R.function
    def main(x: R.Tensor((2, 8), "float32"), r: R.Tensor((2, 8), "float32"), w: R.Tensor((8,), "float32")):
        with R.dataflow():
            y = R.add(x, r)
            z = R.nn.rms_norm(y, w, axes=[-1], epsilon=1e-5)
            R.output(z)
        return z


@I.ir_module
class BroadcastAdd:  # r broadcasts over the rows: not a residual stream
    @R.function
    def main(x: R.Tensor((2, 8), "float32"), r: R.Tensor((1, 8), "float32"), w: R.Tensor((8,), "float32")):
        with R.dataflow():
            y = R.add(x, r)
            z = R.nn.rms_norm(y, w, axes=[-1], epsilon=1e-5)
            o = R.add(y, z)
            R.output(o)
        return o


@I.ir_module
class NormOverTwoAxes:
    @R.function
    def main(x: R.Tensor((2, 4, 8), "float32"), r: R.Tensor((2, 4, 8), "float32"),
             w: R.Tensor((4, 8), "float32")):
        with R.dataflow():
            y = R.add(x, r)
            z = R.nn.rms_norm(y, w, axes=[-2, -1], epsilon=1e-5)
            o = R.add(y, z)
            R.output(o)
        return o


def test_sum_used_only_by_the_norm_is_fused():
    """The final norm over the last layer's sum: one fused call, no add or rms_norm left."""
    after = FuseAddRMSNorm()(SumUsedOnlyByNorm)
    text = after["main"].script()
    assert "fuse_add_rms_norm" in text and "R.add(" not in text and "R.nn.rms_norm(" not in text


@pytest.mark.parametrize("mod", [BroadcastAdd, NormOverTwoAxes], ids=["broadcast-add", "two-axes"])
def test_leaves_other_patterns_alone(mod):
    tvm.ir.assert_structural_equal(FuseAddRMSNorm()(mod), mod)


# ----------------------------------------------------------------------------- numerics

HIDDEN, INTER, EPS = 64, 96, 1e-5


class PreNormStack(nn.Module):
    """Two pre-norm layers (x = x + proj(norm(x)); x = x + mlp(norm(x))) and a final norm."""

    def __init__(self, layers: int = 2):
        self.norms = nn.ModuleList([Norm(HIDDEN, EPS) for _ in range(2 * layers + 1)])
        self.projs = nn.ModuleList([nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(layers)])
        self.mlps = nn.ModuleList([MLP(HIDDEN, INTER) for _ in range(layers)])

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        for i, (proj, mlp) in enumerate(zip(self.projs, self.mlps)):
            x = x + proj(self.norms[2 * i](x))
            x = x + mlp(self.norms[2 * i + 1](x))
        return self.norms[-1](x)


def reference(x: np.ndarray, params: dict[str, np.ndarray], layers: int = 2) -> np.ndarray:
    x = x.astype(np.float64)
    p = {k: v.astype(np.float64) for k, v in params.items()}
    norm = lambda v, w: v / np.sqrt((v * v).mean(-1, keepdims=True) + EPS) * w  # noqa: E731
    for i in range(layers):
        x = x + norm(x, p[f"norms.{2 * i}.weight"]) @ p[f"projs.{i}.weight"].T
        gate, up = np.split(norm(x, p[f"norms.{2 * i + 1}.weight"]) @ p[f"mlps.{i}.gate_up_proj.weight"].T, 2, -1)
        x = x + (gate / (1 + np.exp(-gate)) * up) @ p[f"mlps.{i}.down_proj.weight"].T
    return norm(x, p[f"norms.{2 * layers}.weight"])


@pytest.fixture(scope="module")
def exported():
    spec = {"prefill": {"x": nn.spec.Tensor([1, "seq_len", HIDDEN], "float32")},
            "decode": {"x": nn.spec.Tensor(["batch", 1, HIDDEN], "float32")}}
    model = PreNormStack()
    model.prefill = model.forward
    model.decode = model.forward
    mod, named = model.export_tvm(spec=spec)
    rng = np.random.default_rng(0)
    params = {name: (rng.normal(1.0, 0.1, p.shape) if "norms" in name else rng.normal(0, 0.1, p.shape))
              .astype("float32") for name, p in named}
    return mod, params


def _phases_without(name: str):
    real = pipeline.phases
    return lambda profile: [(phase, [p for p in passes if p.info.name != name]) for phase, passes in real(profile)]


def _build(mod, monkeypatch, with_pass: bool):
    profile = get_profile("cpu")
    with monkeypatch.context() as m:
        if not with_pass:
            m.setattr(pipeline, "phases", _phases_without("FuseAddRMSNorm"))
        ex = relax.build(mod, target=profile.tvm_target(), relax_pipeline=pipeline.build_pipeline(profile))
    return relax.VirtualMachine(ex, tvm.cpu())


def test_fused_kernel_is_scheduled_parallel_and_vectorised(exported):
    mod, _ = exported
    profile = get_profile("cpu")
    before_lower = [p for name, passes in pipeline.phases(profile) if name in ("graph", "legalize", "schedule")
                    for p in passes]
    with profile.tvm_target():
        scheduled = tvm.transform.Sequential(before_lower)(mod)
    fused = {gv.name_hint: f for gv, f in scheduled.functions_items() if gv.name_hint.startswith("fuse_add_rms_norm")}
    assert len(fused) == 2  # one per row layout: [1, seq_len, h] and [batch, 1, h]
    for name, func in fused.items():
        text = func.script()
        assert func.attrs["tirx.is_scheduled"], name
        assert "T.parallel(" in text and "T.vectorized(" in text, name


@pytest.mark.parametrize("entry,shape", [("prefill", (1, 7, HIDDEN)), ("prefill", (1, 33, HIDDEN)),
                                         ("decode", (1, 1, HIDDEN)), ("decode", (3, 1, HIDDEN))])
def test_same_results_with_and_without_the_pass(exported, monkeypatch, entry, shape):
    mod, params = exported
    x = np.random.default_rng(1).normal(0, 1, shape).astype("float32")
    ref = reference(x, params)
    outs = []
    for with_pass in (True, False):
        vm = _build(mod, monkeypatch, with_pass)
        args = [tvm.runtime.tensor(x)] + [tvm.runtime.tensor(v) for v in params.values()]
        outs.append(vm[entry](*args).numpy())
    for out in outs:
        np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-6, rtol=1e-6)
