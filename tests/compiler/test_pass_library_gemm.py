"""LibraryGEMM: in batch_prefill_gemm and batch_decode_gemm, a matmul over the call's rows becomes a
kiln.gemm_nt call; a weight dequantized from parameters only is made once by
batch_prefill_gemm_weights (shared by both entries) and passed to each entry as its last parameter.
A matmul over other rows (a prefill's gathered positions) and other functions stay as they were.
(tests/compiler/test_library_gemm.py runs the compiled entries against batch_prefill's numerics.)"""

from __future__ import annotations

import pytest
import tvm
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from kiln.compiler.passes.library_gemm import LibraryGEMM

pytestmark = pytest.mark.compiler

PARAMS = R.Tuple(R.Tensor((8, 2), "uint32"), R.Tensor((8, 1), "float16"), R.Tensor((4, 16), "float16"))


@I.ir_module
class Before:
    @T.prim_func(private=True)
    def dequantize_q4(q: T.Buffer((8, 2), "uint32"), s: T.Buffer((8, 1), "float16"),
                      w: T.Buffer((8, 16), "float16")):
        T.evaluate(0)

    @T.prim_func(private=True)
    def NT_matmul(x: T.handle, w: T.Buffer((8, 16), "float16"), y: T.handle):
        m, n = T.int64(), T.int64()
        T.match_buffer(x, (m, n, 16), "float16")
        T.match_buffer(y, (m, n, 8), "float16")
        T.evaluate(0)

    @R.function
    def batch_prefill_gemm(x: R.Tensor((1, "seq_len", 16), "float16"), rows: R.Tensor((1, "batch_size", 16), "float16"),
                           packed_params: PARAMS):
        seq_len, batch_size = T.int64(), T.int64()
        R.func_attr({"num_input": 2})
        cls = Before
        with R.dataflow():
            q = packed_params[0]
            s = packed_params[1]
            w = R.call_tir(cls.dequantize_q4, (q, s), out_ty=R.Tensor((8, 16), "float16"))
            y = R.call_tir(cls.NT_matmul, (x, w), out_ty=R.Tensor((1, seq_len, 8), "float16"))
            # the gathered positions' rows: not the call's tokens
            z = R.call_tir(cls.NT_matmul, (rows, w), out_ty=R.Tensor((1, batch_size, 8), "float16"))
            out = (y, z)
            R.output(out)
        return out

    @R.function
    def batch_decode_gemm(x: R.Tensor(("batch_size", 1, 16), "float16"), packed_params: PARAMS):
        batch_size = T.int64()
        R.func_attr({"num_input": 1})
        cls = Before
        with R.dataflow():
            q = packed_params[0]
            s = packed_params[1]
            w = R.call_tir(cls.dequantize_q4, (q, s), out_ty=R.Tensor((8, 16), "float16"))
            y = R.call_tir(cls.NT_matmul, (x, w), out_ty=R.Tensor((batch_size, 1, 8), "float16"))
            R.output(y)
        return y

    @R.function
    def batch_decode(x: R.Tensor(("batch_size", 1, 16), "float16"), packed_params: PARAMS):
        batch_size = T.int64()
        R.func_attr({"num_input": 1})
        cls = Before
        with R.dataflow():
            q = packed_params[0]
            s = packed_params[1]
            w = R.call_tir(cls.dequantize_q4, (q, s), out_ty=R.Tensor((8, 16), "float16"))
            y = R.call_tir(cls.NT_matmul, (x, w), out_ty=R.Tensor((batch_size, 1, 8), "float16"))
            R.output(y)
        return y


WEIGHTS = R.Tuple(R.Tensor((8, 16), "float16"))


@I.ir_module
class After:
    @T.prim_func(private=True)
    def dequantize_q4(q: T.Buffer((8, 2), "uint32"), s: T.Buffer((8, 1), "float16"),
                      w: T.Buffer((8, 16), "float16")):
        T.evaluate(0)

    @T.prim_func(private=True)
    def NT_matmul(x: T.handle, w: T.Buffer((8, 16), "float16"), y: T.handle):
        m, n = T.int64(), T.int64()
        T.match_buffer(x, (m, n, 16), "float16")
        T.match_buffer(y, (m, n, 8), "float16")
        T.evaluate(0)

    @R.function
    def batch_prefill_gemm(x: R.Tensor((1, "seq_len", 16), "float16"), rows: R.Tensor((1, "batch_size", 16), "float16"),
                           packed_params: PARAMS, gemm_weights: WEIGHTS):
        seq_len, batch_size = T.int64(), T.int64()
        R.func_attr({"num_input": 2})
        cls = After
        with R.dataflow():
            w = gemm_weights[0]
            y = R.call_dps_packed("kiln.gemm_nt", (x, w), out_ty=R.Tensor((1, seq_len, 8), "float16"))
            z = R.call_tir(cls.NT_matmul, (rows, w), out_ty=R.Tensor((1, batch_size, 8), "float16"))
            out = (y, z)
            R.output(out)
        return out

    @R.function
    def batch_decode_gemm(x: R.Tensor(("batch_size", 1, 16), "float16"), packed_params: PARAMS,
                          gemm_weights: WEIGHTS):
        batch_size = T.int64()
        R.func_attr({"num_input": 1})
        with R.dataflow():
            w = gemm_weights[0]
            y = R.call_dps_packed("kiln.gemm_nt", (x, w), out_ty=R.Tensor((batch_size, 1, 8), "float16"))
            R.output(y)
        return y

    @R.function
    def batch_prefill_gemm_weights(packed_params: PARAMS) -> WEIGHTS:
        cls = After
        with R.dataflow():
            q = packed_params[0]
            s = packed_params[1]
            w = R.call_tir(cls.dequantize_q4, (q, s), out_ty=R.Tensor((8, 16), "float16"))
            out = (w,)
            R.output(out)
        return out


def test_row_matmuls_call_the_blas_on_weights_made_once():
    mod = LibraryGEMM()(Before)
    tvm.ir.assert_structural_equal(mod["batch_decode"], Before["batch_decode"])      # not an entry of the pass
    tvm.ir.assert_structural_equal(_without(mod, "batch_decode"), After)


def _without(mod: tvm.IRModule, name: str) -> tvm.IRModule:
    return tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint != name})


def test_float_weights_lift_nothing():
    """A weight that is a parameter itself reaches the BLAS as it is; the weights tuple is empty."""

    @I.ir_module
    class Float:
        @T.prim_func(private=True)
        def NT_matmul(x: T.handle, w: T.Buffer((8, 16), "float16"), y: T.handle):
            m, n = T.int64(), T.int64()
            T.match_buffer(x, (m, n, 16), "float16")
            T.match_buffer(y, (m, n, 8), "float16")
            T.evaluate(0)

        @R.function
        def batch_prefill_gemm(x: R.Tensor((1, "seq_len", 16), "float16"),
                               packed_params: R.Tuple(R.Tensor((8, 16), "float16"))):
            seq_len = T.int64()
            R.func_attr({"num_input": 1})
            cls = Float
            with R.dataflow():
                w = packed_params[0]
                y = R.call_tir(cls.NT_matmul, (x, w), out_ty=R.Tensor((1, seq_len, 8), "float16"))
                R.output(y)
            return y

    mod = LibraryGEMM()(Float)
    entry = mod["batch_prefill_gemm"]
    assert [p.name for p in entry.params] == ["x", "packed_params", "gemm_weights"]
    assert len(entry.params[-1].ty.fields) == 0 and len(mod["batch_prefill_gemm_weights"].ret_ty.fields) == 0
    assert "kiln.gemm_nt" in entry.script()


def test_modules_without_the_entries_are_left_alone():
    mod = tvm.IRModule({"batch_decode": Before["batch_decode"], "NT_matmul": Before["NT_matmul"],
                        "dequantize_q4": Before["dequantize_q4"]})
    tvm.ir.assert_structural_equal(LibraryGEMM()(mod), mod)
