"""compiler/passes/constant_fills.py: ones, zeros and full of a static shape become the constants they
make (numpy's values, the op's dtype); a symbolic shape or a fill value that is not a constant stays
an op; the module computes what it computed."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from kiln.compiler.passes.constant_fills import ConstantFills

pytestmark = pytest.mark.compiler


@I.ir_module
class Fills:
    @R.function
    def main(x: R.Tensor((2, 3), "float32"), s: R.Tensor(("m",), "float32"), v: R.Tensor((), "float32")):
        m = T.int64()
        with R.dataflow():
            ones = R.ones(R.shape([3]), "float32")
            zeros = R.zeros(R.shape([2, 3]), "int32")
            half = R.full(R.shape([1]), R.const(-0.5, "float32"), "float16")
            rows = R.ones(R.shape([m]), "float32")                      # symbolic: stays
            taken = R.full(R.shape([2]), v, "float32")                  # not a constant: stays
            y = R.add(R.multiply(x, ones), R.astype(zeros, "float32"))
            R.output(y, half, rows, taken)
        return (y, half, rows, taken)


def _calls(mod) -> list[str]:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: isinstance(e, relax.Call) and isinstance(
        e.op, tvm.ir.Op) and found.append(e.op.name))
    return found


def test_static_fills_become_constants_and_the_rest_stay():
    before = _calls(Fills)
    after_mod = ConstantFills()(Fills)
    after = _calls(after_mod)
    assert before.count("relax.ones") == 2 and after.count("relax.ones") == 1       # the symbolic one
    assert "relax.zeros" not in after and after.count("relax.full") == 1            # the one over `v`
    consts = []
    relax.analysis.post_order_visit(after_mod["main"], lambda e: isinstance(e, tvm.ir.expr.Constant)
                                    and hasattr(e.value, "numpy") and consts.append(e.value.numpy()))
    by_shape = {(c.shape, str(c.dtype)): c for c in consts}
    np.testing.assert_array_equal(by_shape[((3,), "float32")], np.ones(3, "float32"))
    np.testing.assert_array_equal(by_shape[((2, 3), "int32")], np.zeros((2, 3), "int32"))
    np.testing.assert_array_equal(by_shape[((1,), "float16")], np.full(1, -0.5, "float16"))


def test_the_module_computes_what_it_computed():
    @I.ir_module
    class Small:
        @R.function
        def main(x: R.Tensor((2, 3), "float32")):
            with R.dataflow():
                y = R.add(R.multiply(x, R.full(R.shape([3]), R.const(1.5, "float32"), "float32")),
                          R.ones(R.shape([2, 3]), "float32"))
                R.output(y)
            return y

    x = np.arange(6, dtype="float32").reshape(2, 3)
    outs = []
    for mod in (Small, ConstantFills()(Small)):
        ex = relax.build(mod, target=tvm.target.Target({"kind": "llvm"}))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        outs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    np.testing.assert_array_equal(outs[1], x * 1.5 + 1)
    np.testing.assert_array_equal(outs[0], outs[1])
