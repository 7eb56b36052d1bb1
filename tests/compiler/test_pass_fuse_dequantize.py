"""FuseDequantizeMatmul and FuseDequantizeTake: TVMScript before/after, then numerics of the
fused kernels (the whole CPU pipeline) against numpy dequantize + matmul / gather."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from kiln.compiler import quant_pack
from kiln.compiler.passes.fuse_dequantize_matmul import FuseDequantizeMatmul
from kiln.compiler.passes.fuse_dequantize_take import FuseDequantizeTake
from kiln.compiler.pipeline import build_pipeline, phases
from kiln.compiler.quant_modules import QuantFormat
from kiln.targets import get_profile

pytestmark = pytest.mark.compiler

# pylint: disable=invalid-name,no-self-argument,missing-function-docstring


@I.ir_module
class MatmulBefore:
    @T.prim_func(private=True, s_tir=True)
    def dequantize_q4(qweight: T.Buffer((T.int64(32), T.int64(8)), "uint32"),
                      scale: T.Buffer((T.int64(32), T.int64(2)), "float32"),
                      dequantize: T.Buffer((T.int64(32), T.int64(64)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for n, k in T.grid(T.int64(32), T.int64(64)):
            with T.sblock("dequantize"):
                v_n, v_k = T.axis.remap("SS", [n, k])
                dequantize[v_n, v_k] = (T.Cast("float32", qweight[v_n, v_k // T.int64(8)]
                                               >> T.Cast("uint32", v_k % T.int64(8) * T.int64(4)) & T.uint32(15))
                                        - T.float32(8.0)) * scale[v_n, v_k // T.int64(32)]

    @T.prim_func(private=True, s_tir=True)
    def NT_matmul(x: T.Buffer((T.int64(1), T.int64(4), T.int64(64)), "float32"),
                  w: T.Buffer((T.int64(32), T.int64(64)), "float32"),
                  out: T.Buffer((T.int64(1), T.int64(4), T.int64(32)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i0, i1, i2, k in T.grid(T.int64(1), T.int64(4), T.int64(32), T.int64(64)):
            with T.sblock("NT_matmul"):
                v_i0, v_i1, v_i2, v_k = T.axis.remap("SSSR", [i0, i1, i2, k])
                with T.init():
                    out[v_i0, v_i1, v_i2] = T.float32(0.0)
                out[v_i0, v_i1, v_i2] = out[v_i0, v_i1, v_i2] + x[v_i0, v_i1, v_k] * w[v_i2, v_k]

    @R.function
    def forward(x: R.Tensor((1, 4, 64), "float32"), qweight: R.Tensor((32, 8), "uint32"),
                scale: R.Tensor((32, 2), "float32")) -> R.Tensor((1, 4, 32), "float32"):
        cls = MatmulBefore
        with R.dataflow():
            w = R.call_tir(cls.dequantize_q4, (qweight, scale), out_ty=R.Tensor((32, 64), "float32"))
            y = R.call_tir(cls.NT_matmul, (x, w), out_ty=R.Tensor((1, 4, 32), "float32"))
            R.output(y)
        return y


@I.ir_module
class MatmulAfter:
    @T.prim_func(private=True, s_tir=True)
    def dequantize_q4(qweight: T.Buffer((T.int64(32), T.int64(8)), "uint32"),
                      scale: T.Buffer((T.int64(32), T.int64(2)), "float32"),
                      dequantize: T.Buffer((T.int64(32), T.int64(64)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for n, k in T.grid(T.int64(32), T.int64(64)):
            with T.sblock("dequantize"):
                v_n, v_k = T.axis.remap("SS", [n, k])
                dequantize[v_n, v_k] = (T.Cast("float32", qweight[v_n, v_k // T.int64(8)]
                                               >> T.Cast("uint32", v_k % T.int64(8) * T.int64(4)) & T.uint32(15))
                                        - T.float32(8.0)) * scale[v_n, v_k // T.int64(32)]

    @T.prim_func(private=True, s_tir=True)
    def NT_matmul(x: T.Buffer((T.int64(1), T.int64(4), T.int64(64)), "float32"),
                  w: T.Buffer((T.int64(32), T.int64(64)), "float32"),
                  out: T.Buffer((T.int64(1), T.int64(4), T.int64(32)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i0, i1, i2, k in T.grid(T.int64(1), T.int64(4), T.int64(32), T.int64(64)):
            with T.sblock("NT_matmul"):
                v_i0, v_i1, v_i2, v_k = T.axis.remap("SSSR", [i0, i1, i2, k])
                with T.init():
                    out[v_i0, v_i1, v_i2] = T.float32(0.0)
                out[v_i0, v_i1, v_i2] = out[v_i0, v_i1, v_i2] + x[v_i0, v_i1, v_k] * w[v_i2, v_k]

    @R.function(private=True)
    def fused_dequantize_q4_NT_matmul(qweight: R.Tensor((32, 8), "uint32"), scale: R.Tensor((32, 2), "float32"),
                                      x: R.Tensor((1, 4, 64), "float32")) -> R.Tensor((1, 4, 32), "float32"):
        R.func_attr({"Composite": "kiln.dequantize_matmul", "Primitive": True})
        cls = MatmulAfter
        with R.dataflow():
            w = R.call_tir(cls.dequantize_q4, (qweight, scale), out_ty=R.Tensor((32, 64), "float32"))
            y = R.call_tir(cls.NT_matmul, (x, w), out_ty=R.Tensor((1, 4, 32), "float32"))
            R.output(y)
        return y

    @R.function
    def forward(x: R.Tensor((1, 4, 64), "float32"), qweight: R.Tensor((32, 8), "uint32"),
                scale: R.Tensor((32, 2), "float32")) -> R.Tensor((1, 4, 32), "float32"):
        cls = MatmulAfter
        with R.dataflow():
            y: R.Tensor((1, 4, 32), "float32") = cls.fused_dequantize_q4_NT_matmul(qweight, scale, x)
            R.output(y)
        return y


@I.ir_module
class PermuteBefore:
    """The form QuantizedLinear emits: matmul(x, permute_dims(dequantize(planes)))."""

    @T.prim_func(private=True, s_tir=True)
    def dequantize_q4(qweight: T.Buffer((T.int64(32), T.int64(8)), "uint32"),
                      scale: T.Buffer((T.int64(32), T.int64(2)), "float32"),
                      dequantize: T.Buffer((T.int64(32), T.int64(64)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for n, k in T.grid(T.int64(32), T.int64(64)):
            with T.sblock("dequantize"):
                v_n, v_k = T.axis.remap("SS", [n, k])
                dequantize[v_n, v_k] = (T.Cast("float32", qweight[v_n, v_k // T.int64(8)]
                                               >> T.Cast("uint32", v_k % T.int64(8) * T.int64(4)) & T.uint32(15))
                                        - T.float32(8.0)) * scale[v_n, v_k // T.int64(32)]

    @R.function
    def forward(x: R.Tensor((1, 4, 64), "float32"), qweight: R.Tensor((32, 8), "uint32"),
                scale: R.Tensor((32, 2), "float32")) -> R.Tensor((1, 4, 32), "float32"):
        cls = PermuteBefore
        with R.dataflow():
            w = R.call_tir(cls.dequantize_q4, (qweight, scale), out_ty=R.Tensor((32, 64), "float32"))
            wt: R.Tensor((64, 32), "float32") = R.permute_dims(w, axes=None)
            y: R.Tensor((1, 4, 32), "float32") = R.matmul(x, wt, out_dtype=None)
            R.output(y)
        return y


def test_dequantize_matmul_is_grouped_into_one_primitive_function():
    tvm.ir.assert_structural_equal(FuseDequantizeMatmul()(MatmulBefore), MatmulAfter)


def test_permute_dims_form_is_grouped_the_same_way():
    after = FuseDequantizeMatmul()(PermuteBefore)
    names = sorted(gv.name_hint for gv in after.get_global_vars())
    assert names == ["NT_matmul", "dequantize_q4", "forward", "fused_dequantize_q4_NT_matmul"]
    tvm.ir.assert_structural_equal(after["fused_dequantize_q4_NT_matmul"],
                                   MatmulAfter["fused_dequantize_q4_NT_matmul"], map_free_vars=True)
    tvm.ir.assert_structural_equal(after["forward"], MatmulAfter["forward"], map_free_vars=True)


@I.ir_module
class TakeBefore:
    @T.prim_func(private=True, s_tir=True)
    def dequantize_q8(qweight: T.Buffer((T.int64(100), T.int64(64)), "int8"),
                      scale: T.Buffer((T.int64(100), T.int64(2)), "float32"),
                      dequantize: T.Buffer((T.int64(100), T.int64(64)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for n, k in T.grid(T.int64(100), T.int64(64)):
            with T.sblock("dequantize"):
                v_n, v_k = T.axis.remap("SS", [n, k])
                dequantize[v_n, v_k] = T.Cast("float32", qweight[v_n, v_k]) * scale[v_n, v_k // T.int64(32)]

    @R.function
    def forward(ids: R.Tensor((5,), "int32"), qweight: R.Tensor((100, 64), "int8"),
                scale: R.Tensor((100, 2), "float32")) -> R.Tensor((5, 64), "float32"):
        cls = TakeBefore
        with R.dataflow():
            table = R.call_tir(cls.dequantize_q8, (qweight, scale), out_ty=R.Tensor((100, 64), "float32"))
            rows: R.Tensor((5, 64), "float32") = R.take(table, ids, axis=0, mode="fast")
            R.output(rows)
        return rows


@I.ir_module
class TakeAfter:
    @T.prim_func(private=True, s_tir=True)
    def dequantize_q8(qweight: T.Buffer((T.int64(100), T.int64(64)), "int8"),
                      scale: T.Buffer((T.int64(100), T.int64(2)), "float32"),
                      dequantize: T.Buffer((T.int64(100), T.int64(64)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for n, k in T.grid(T.int64(100), T.int64(64)):
            with T.sblock("dequantize"):
                v_n, v_k = T.axis.remap("SS", [n, k])
                dequantize[v_n, v_k] = T.Cast("float32", qweight[v_n, v_k]) * scale[v_n, v_k // T.int64(32)]

    @R.function(private=True)
    def fused_dequantize_q8_relax_take(qweight: R.Tensor((100, 64), "int8"), scale: R.Tensor((100, 2), "float32"),
                                       ids: R.Tensor((5,), "int32")) -> R.Tensor((5, 64), "float32"):
        R.func_attr({"Composite": "kiln.dequantize_take", "Primitive": True})
        cls = TakeAfter
        with R.dataflow():
            table = R.call_tir(cls.dequantize_q8, (qweight, scale), out_ty=R.Tensor((100, 64), "float32"))
            rows: R.Tensor((5, 64), "float32") = R.take(table, ids, axis=0, mode="fast")
            R.output(rows)
        return rows

    @R.function
    def forward(ids: R.Tensor((5,), "int32"), qweight: R.Tensor((100, 64), "int8"),
                scale: R.Tensor((100, 2), "float32")) -> R.Tensor((5, 64), "float32"):
        cls = TakeAfter
        with R.dataflow():
            rows: R.Tensor((5, 64), "float32") = cls.fused_dequantize_q8_relax_take(qweight, scale, ids)
            R.output(rows)
        return rows


def test_dequantize_take_is_grouped_into_one_primitive_function():
    tvm.ir.assert_structural_equal(FuseDequantizeTake()(TakeBefore), TakeAfter)


def test_each_pass_leaves_the_other_pattern_alone():
    tvm.ir.assert_structural_equal(FuseDequantizeMatmul()(TakeBefore), TakeBefore)
    tvm.ir.assert_structural_equal(FuseDequantizeTake()(MatmulBefore), MatmulBefore)


# ----------------------------------------------------------------------------- numerics


def _build(mod: tvm.IRModule):
    profile = get_profile("cpu")
    with profile.tvm_target():
        ex = relax.build(mod, target=profile.tvm_target(), relax_pipeline=build_pipeline(profile))
    return relax.VirtualMachine(ex, tvm.cpu())


def _kernels(mod: tvm.IRModule) -> list[str]:
    """The PrimFuncs left after the graph and legalize phases (one per kernel)."""
    profile = get_profile("cpu")
    with profile.tvm_target():
        passes = [p for name, phase in phases(profile) if name in ("graph", "legalize") for p in phase]
        lowered = tvm.transform.Sequential(passes)(mod)
    return sorted(gv.name_hint for gv, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


@pytest.mark.parametrize("before", [MatmulBefore, PermuteBefore], ids=["nt_matmul", "permute_dims"])
def test_fused_dequantize_matmul_matches_numpy(before):
    assert _kernels(before) == ["fused_dequantize_q4_NT_matmul"]          # one kernel
    rng = np.random.default_rng(0)
    planes = quant_pack.quantize(QuantFormat("q4"), rng.standard_normal((32, 64)).astype(np.float32))
    x = rng.standard_normal((1, 4, 64)).astype(np.float32)
    got = _build(before)["forward"](*[tvm.runtime.tensor(a) for a in (x, planes["qweight"], planes["scale"])])
    want = x @ quant_pack.dequantize(QuantFormat("q4"), planes).T
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5, rtol=1e-5)


def test_fused_dequantize_take_matches_numpy():
    assert _kernels(TakeBefore) == ["fused_dequantize_q8_relax_take"]
    rng = np.random.default_rng(1)
    planes = quant_pack.quantize(QuantFormat("q8"), rng.standard_normal((100, 64)).astype(np.float32))
    ids = np.array([3, 99, 0, 3, 42], np.int32)
    got = _build(TakeBefore)["forward"](*[tvm.runtime.tensor(a) for a in (ids, planes["qweight"], planes["scale"])])
    np.testing.assert_array_equal(got.numpy(), quant_pack.dequantize(QuantFormat("q8"), planes)[ids])
