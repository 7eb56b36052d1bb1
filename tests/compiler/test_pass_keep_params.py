"""KeepParamsAlive: the kills of a function's parameters and of the items of a parameter tuple go;
every other kill stays, and the function computes the same."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from kiln.compiler import pipeline
from kiln.compiler.passes.keep_params import KeepParamsAlive
from kiln.targets import get_profile

pytestmark = pytest.mark.compiler


@I.ir_module
class Weights:
    @R.function
    def main(x: R.Tensor((4,), "float32"), w: R.Tensor((4,), "float32"),
             p: R.Tuple(R.Tensor((4,), "float32"), R.Tensor((4,), "float32"))):
        a = p[0]
        b = R.add(x, a)
        c = p[1]
        d = R.multiply(b, c)
        e = R.add(d, w)
        return e


def _killed(mod: tvm.IRModule) -> list[str]:
    kills = ("relax.memory.kill_tensor", "relax.vm.kill_object")
    return [b.value.args[0].name for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", None) in kills]


def test_kills_of_parameters_and_their_items_go_the_rest_stay():
    before = relax.transform.KillAfterLastUse()(relax.transform.ToNonDataflow()(Weights))
    after = KeepParamsAlive()(before)
    assert {"a", "c", "b", "d"} <= set(_killed(before))
    assert sorted(_killed(after)) == ["b", "d"]                 # the intermediates' kills only
    assert len(_killed(before)) > len(_killed(after))


def test_the_pipeline_runs_it_and_the_function_computes_the_same():
    profile = get_profile("cpu")
    assert "KeepParamsAlive" in [p.info.name for _, passes in pipeline.phases(profile) for p in passes]
    x, w, p0, p1 = (np.random.default_rng(i).standard_normal(4).astype("float32") for i in range(4))
    ex = relax.build(Weights, target=profile.tvm_target(), relax_pipeline=pipeline.build_pipeline(profile))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*(tvm.runtime.tensor(a) for a in (x, w)),
                                                      (tvm.runtime.tensor(p0), tvm.runtime.tensor(p1)))
    np.testing.assert_allclose(got.numpy(), (x + p0) * p1 + w, rtol=1e-6)
