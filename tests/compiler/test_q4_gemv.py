"""targets/q4_gemv.py: the 4-bit GEMV that dequantizes two values per integer operation.

Its arithmetic runs here (the same TIR in serial loops, built for this CPU) against numpy's
float16 dequantization; the CUDA kernel (threads, shuffles) is built for cuda-sm90 from a function
shaped as kiln's fused dequantize-matmul, through the OneRowGEMV branch that would carry it.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from kiln.compiler.quant_modules import QuantFormat, dequantize_element
from kiln.compiler.quant_pack import dequantize, quantize
from kiln.targets import get_profile
from kiln.targets.q4_gemv import Q4GEMV, q4_gemv

from gpu_kernels import nvcc_compiles

FMT = QuantFormat("q4", 32, "float16")


def _planes(n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    planes = quantize(FMT, rng.normal(0, 0.05, (n, k)).astype(np.float32))
    x = rng.normal(0, 1, (1, 1, k)).astype(np.float16)
    return planes, x


def _reference(planes, x, round_weights: bool) -> np.ndarray:
    """x . W in float64, W dequantized as the dequantize op does (in float16) or exactly."""
    w = dequantize(FMT, planes, "float16" if round_weights else "float64").astype(np.float64)
    return x[0, 0].astype(np.float64) @ w.T


@pytest.mark.parametrize("n, k, rows, warps", [(64, 512, 2, 4), (48, 768, 1, 3), (32, 256, 4, 2)])
def test_arithmetic_gives_the_float16_dequantized_weights_product(n, k, rows, warps):
    """The serial form of the kernel (the same per-lane arithmetic and lane-to-word mapping) on this
    CPU: float32 sums within float32 rounding of x . W with W rounded to float16 as the dequantize op
    rounds it, and measurably off the unrounded product (so the rounding is what is matched)."""
    func = q4_gemv(n, k, "float32", rows, warps, threads=False).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    planes, x = _planes(n, k, seed=n + k)
    dev = tvm.cpu()
    out = np.zeros((1, 1, n), np.float32)
    args = [tvm.runtime.tensor(a, dev) for a in (planes["qweight"], planes["scale"], x, out)]
    lib["main"](*args)
    got = args[3].numpy()[0, 0].astype(np.float64)
    rounded, exact = _reference(planes, x, True), _reference(planes, x, False)
    scale = np.abs(x[0, 0]).astype(np.float64) @ np.abs(np.repeat(planes["scale"], 32, axis=1).astype(np.float64) * 8).T
    np.testing.assert_array_less(np.abs(got - rounded), 1e-6 * scale + 1e-7)
    assert np.abs(got - exact).max() > 10 * np.abs(got - rounded).max()


@pytest.mark.parametrize("batch, count", [(2, 2), (4, 3), (4, 1)])
def test_rows_past_the_count_are_neither_read_nor_written(batch, count):
    """The kernel for up to `batch` activation rows, called with `count` of them (symbolic rows):
    each row's sums as the one-row product gives them, the outputs past it left alone (its serial
    form on this CPU, the rows' buffers exactly `count` long)."""
    n, k = 32, 512
    rows = tvm.tirx.Var("batch_size", "int64")
    func = q4_gemv(n, k, "float32", 2, 2, threads=False, batch=batch, count=rows).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    planes, _ = _planes(n, k, seed=batch)
    x = np.random.default_rng(count).normal(0, 1, (count, 1, k)).astype(np.float16)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in (planes["qweight"], planes["scale"], x,
                                                 np.full((count, 1, n), 7, np.float32))]
    lib["main"](*args)
    got = args[3].numpy()
    for b in range(count):
        np.testing.assert_allclose(got[b, 0], _reference(planes, x[b:b + 1], True), rtol=1e-5, atol=1e-5)


def q4_matmul_te(n: int, k: int, fmt: QuantFormat = FMT, rows=None, x=None):
    """(codes, scale, x, sums): kiln's dequantize-matmul (4-bit, or `fmt`'s codes) as TE stages, over
    `rows` activation rows (default: symbolic `batch_size`, decode's), float32 sums; `x`: the
    activations [rows, 1, k] as a stage of the caller's (rows then its rows), else a placeholder."""
    i64 = lambda v: tvm.tirx.IntImm("int64", v)                              # noqa: E731
    rows = (x.shape[0] if x is not None else tvm.tirx.Var("batch_size", "int64")) if rows is None else i64(rows)
    words = (te.placeholder((i64(n), i64(k)), "int8", name="qweight") if fmt.kind == "q8"
             else te.placeholder((i64(n), i64(k // 8)), "uint32", name="qweight"))
    scale = te.placeholder((i64(n), i64(k // fmt.group_size)), fmt.scale_dtype, name="scale")
    x = te.placeholder((rows, i64(1), i64(k)), "float16", name="x") if x is None else x
    deq = te.compute((i64(n), i64(k)), lambda r, c: dequantize_element(fmt, fmt.scale_dtype, words, scale, None, r, c),
                     name="dequantize")
    j = te.reduce_axis((i64(0), i64(k)), name="k")
    sums = te.compute((rows, i64(1), i64(n)), lambda a, b, r: te.sum(
        x[a, b, j].astype("float32") * deq[r, j].astype("float32"), axis=j), name="NT_matmul")
    return words, scale, x, sums


def _fused_q4_matmul(n: int, k: int, out_dtype: str = "float16", fmt: QuantFormat = FMT):
    """A function shaped as kiln's fused dequantize-matmul (4-bit, or `fmt`'s codes) over
    `batch_size` rows (decode)."""
    words, scale, x, sums = q4_matmul_te(n, k, fmt)
    if out_dtype == "float32":
        return te.create_prim_func([words, scale, x, sums])
    out = te.compute(sums.shape, lambda a, b, r: sums[a, b, r].astype(out_dtype), name="compute")
    return te.create_prim_func([words, scale, x, out])


@pytest.mark.parametrize("out_dtype", ["float16", "float32"])
def test_one_row_branch_builds_for_cuda(out_dtype, tmp_path):
    """OneRowGEMV(Q4GEMV()) on the fused function at an 8B projection's shape (4096 x 4096): the
    CUDA kernel has the float16-pair magic, the pair arithmetic and the lanes' shuffles."""
    from kiln.targets.gpu import OneRowGEMV
    from kiln.targets.row_dispatch import dispatch_on_rows
    profile = get_profile("cuda-sm90")
    func = _fused_q4_matmul(4096, 4096, out_dtype)
    with profile.tvm_target():
        branch = OneRowGEMV(Q4GEMV()).apply(func, tvm.target.Target.current(), False)
        assert branch is not None
        merged = dispatch_on_rows(func, [(1, branch)], branch, thread_invariant=True)
    merged = merged.with_attr("tirx.is_scheduled", True).with_attr("global_symbol", "gemv")
    source = tvm.compile(tvm.IRModule({"gemv": merged}), target=profile.tvm_target()).mod.imports[0].inspect_source()
    assert str(0x64006400) in source and str(0x000F000F) in source      # the pair's bits
    assert "half2" in source and "__shfl_down_sync" in source
    nvcc_compiles(source, tmp_path)


def test_row_bucket_builds_for_cuda(tmp_path):
    """Q4GEMV(batch=4) as a LOW_BATCH_BRANCHES entry over symbolic rows: a body over the function's
    own params, merged with the others by dispatch_on_rows, built for cuda-sm90."""
    from kiln.targets.gpu import FirstOf, Matmul
    from kiln.targets.row_dispatch import dispatch_on_rows
    from tvm.s_tir import dlight as dl
    profile = get_profile("cuda-sm90")
    func = _fused_q4_matmul(4096, 4096)
    with profile.tvm_target():
        target = tvm.target.Target.current()
        branch = FirstOf(Q4GEMV(batch=4), dl.gpu.LowBatchGEMV(4)).apply(func, target, False)
        assert isinstance(branch, tvm.tirx.PrimFunc)                  # Q4GEMV's (dlight's is a Schedule)
        tiled = Matmul().apply(func, target, False).mod["main"]
        merged = dispatch_on_rows(func, [(4, branch)], tiled, thread_invariant=True)
    merged = merged.with_attr("tirx.is_scheduled", True).with_attr("global_symbol", "gemv")
    source = tvm.compile(tvm.IRModule({"gemv": merged}), target=profile.tvm_target()).mod.imports[0].inspect_source()
    assert str(0x64006400) in source and "__shfl_down_sync" in source
    nvcc_compiles(source, tmp_path)


def test_rule_refuses_what_it_does_not_compute():
    """None (the next rule decides) for float32 scales (an as-stored GGUF's exact
    planes), rows that do not fill its warps, K not a multiple of 256, and other targets."""
    from kiln.targets.row_dispatch import one_row
    cuda = get_profile("cuda-sm90").tvm_target()
    rule = Q4GEMV()
    assert rule.apply(one_row(_fused_q4_matmul(256, 512)), cuda, False) is not None
    assert rule.apply(one_row(_fused_q4_matmul(256, 512, fmt=QuantFormat("q4", 32, "float32"))), cuda, False) is None
    assert rule.apply(one_row(_fused_q4_matmul(260, 512)), cuda, False) is None
    assert rule.apply(one_row(_fused_q4_matmul(256, 544)), cuda, False) is None
    assert rule.apply(one_row(_fused_q4_matmul(256, 512)), get_profile("rocm").tvm_target(), False) is None
    assert rule.apply(_fused_q4_matmul(256, 512), cuda, False) is None             # symbolic rows: a bucket's
    assert Q4GEMV(batch=2).apply(one_row(_fused_q4_matmul(256, 512)), cuda, False) is None
    assert Q4GEMV(batch=2).apply(_fused_q4_matmul(256, 512), cuda, False) is not None
