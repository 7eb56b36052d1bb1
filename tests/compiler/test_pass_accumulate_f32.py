"""AccumulateInFloat32 (compiler/passes/accumulate_f32.py): float16 matmuls sum in float32.

What it rewrites and leaves alone, that the sum is as exact as numpy's float32 one, and that the
CUDA schedule (dlight's GEMV rule) keeps the float32 accumulator in registers. End to end,
SmolLM2 q0f16 against transformers is tests/numerics/test_quantized.py."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.frontend import nn

from kiln.compiler.passes.accumulate_f32 import AccumulateInFloat32

pytestmark = pytest.mark.compiler
K, N = 2048, 64


class Proj(nn.Module):
    def __init__(self, dtype: str, logits: bool = False):
        self.proj = nn.Linear(K, N, bias=False, dtype=dtype)
        self.logits = logits

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        y = self.proj(x)
        return y.astype("float32") if self.logits else y


def _export(dtype: str, logits: bool = False) -> tvm.IRModule:
    mod, _ = Proj(dtype, logits).export_tvm(spec={"forward": {"x": nn.spec.Tensor([1, 1, K], dtype)}})
    return mod


def _calls(mod: tvm.IRModule, op_name: str) -> list[relax.Call]:
    found = []
    relax.analysis.post_order_visit(mod["forward"], lambda e: found.append(e) if isinstance(e, relax.Call)
                                    and getattr(e.op, "name", None) == op_name else None)
    return found


def test_float16_matmul_sums_in_float32_and_casts_back():
    mod = AccumulateInFloat32()(_export("float16"))
    (matmul,) = _calls(mod, "relax.matmul")
    assert str(matmul.attrs.out_dtype) == "float32"
    assert [str(c.attrs.dtype) for c in _calls(mod, "relax.astype")] == ["float16"]
    assert mod["forward"].ret_ty.fields[0].dtype == "float16" if hasattr(mod["forward"].ret_ty, "fields") \
        else mod["forward"].ret_ty.dtype == "float16"


def test_logits_keep_the_float32_sum_without_a_float16_round_trip():
    mod = AccumulateInFloat32()(_export("float16", logits=True))
    (matmul,) = _calls(mod, "relax.matmul")
    assert str(matmul.attrs.out_dtype) == "float32"
    assert not _calls(mod, "relax.astype")


def test_float32_matmuls_are_left_alone():
    before = _export("float32")
    assert tvm_ffi.structural_equal(AccumulateInFloat32()(before), before)


def test_the_sum_is_as_exact_as_float32():
    """K = 2048 products of O(1) values: a float16 accumulator drifts by many float16 ulps."""
    from kiln.compiler.pipeline import phases
    from kiln.targets import get_profile
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, K)).astype(np.float16)
    w = rng.standard_normal((N, K)).astype(np.float16)
    exact = x.astype(np.float64)[0, 0] @ w.astype(np.float64).T
    profile = get_profile("cpu")
    mod = _export("float16")
    with profile.tvm_target():
        for _, passes in phases(profile):
            mod = tvm.transform.Sequential(passes)(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, target=profile.tvm_target()), tvm.cpu())
    got = vm["forward"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy().astype(np.float64)[0, 0]
    ulp = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
    assert np.all(np.abs(got - exact) <= ulp), np.max(np.abs(got - exact) / ulp)   # one rounding, at the end


def test_cuda_gemv_keeps_a_float32_accumulator():
    from kiln.compiler.pipeline import phases
    from kiln.targets import get_profile
    profile = get_profile("cuda")
    mod = _export("float16")
    with profile.tvm_target():
        for _, passes in phases(profile)[:3]:               # graph, legalize, schedule
            mod = tvm.transform.Sequential(passes)(mod)
    # TVMScript prints a buffer's dtype only when it is not float32.
    accumulators = [line.strip() for _, func in mod.functions_items() if isinstance(func, tvm.tirx.PrimFunc)
                    for line in func.script().splitlines()
                    if "alloc_buffer" in line and "matmul" in line and 'scope="local"' in line]
    assert accumulators and not any("float16" in a for a in accumulators), accumulators
