"""targets/workspace_outputs.py: a kernel's temporary global buffer becomes an output its calls
allocate (split-K tensor-core tiles keep their partial sums there, targets/narrow_tiles.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from kiln.targets.workspace_outputs import WorkspaceOutputs, lift_workspace, workspace_count

pytestmark = pytest.mark.compiler


def _module():
    @I.ir_module
    class Module:
        @T.prim_func(private=True, s_tir=True)
        def row_sums(var_x: T.handle, var_out: T.handle):
            n = T.int64()
            x = T.match_buffer(var_x, (n, T.int64(8)))
            out = T.match_buffer(var_out, (n,))
            part = T.sblock_alloc_buffer((T.int64(2), n))          # a half row's sum each
            for s, i, j in T.grid(T.int64(2), n, T.int64(4)):
                with T.sblock("part"):
                    vs, vi, vj = T.axis.remap("SSR", [s, i, j])
                    with T.init():
                        part[vs, vi] = T.float32(0)
                    part[vs, vi] = part[vs, vi] + x[vi, vs * T.int64(4) + vj]
            for i in range(n):
                with T.sblock("total"):
                    vi = T.axis.spatial(n, i)
                    out[vi] = part[T.int64(0), vi] + part[T.int64(1), vi]

        @R.function
        def main(x: R.Tensor(("m", 8), "float32")) -> R.Tensor(("m",), "float32"):
            m = T.int64()
            cls = Module
            with R.dataflow():
                y = R.call_tir(cls.row_sums, (x,), out_ty=R.Tensor((m,), "float32"))
                z = R.add(y, y)
                R.output(z)
            return z

    return Module


def _lifted():
    mod = _module()
    gv = mod.get_global_var("row_sums")
    mod[gv] = lift_workspace(mod[gv])
    return mod


def test_lift_workspace_makes_the_buffer_a_trailing_parameter():
    func = _lifted()["row_sums"]
    assert workspace_count(func) == 1
    assert [p.name for p in func.params][-1] == "part"
    assert not func.body.block.alloc_buffers
    assert lift_workspace(func).same_as(func)                  # nothing left to lift


def test_calls_allocate_the_workspace_at_their_own_sizes():
    """The call gets a second output shaped (2, m) from the caller's m, its use keeps the first;
    built for the CPU the function still sums each row (numpy), at two sizes."""
    mod = WorkspaceOutputs()(_lifted())
    text = mod["main"].script()
    assert 'out_ty=[R.Tensor((m,), dtype="float32"), R.Tensor((2, m), dtype="float32")]' in text, text
    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    rng = np.random.default_rng(0)
    for rows in (3, 17):
        x = rng.standard_normal((rows, 8)).astype(np.float32)
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, 2 * x.sum(axis=1), rtol=1e-6)


def test_modules_without_workspace_pass_through():
    mod = _module()
    assert WorkspaceOutputs()(mod).same_as(mod)
