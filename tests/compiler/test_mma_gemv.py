"""targets/mma_gemv.py: the 4- and 8-bit GEMV for 1-16 rows on the tensor cores' m16n8k16 MMA.

Its fragments run here (the same TIR in serial loops, the MMA computed from the PTX ISA's register
layout of mma.m16n8k16, built for this CPU) against numpy's float16 dequantization; the CUDA
kernel is built for cuda-sm90 through the branches that would carry it, and compiled by nvcc.
The MMA itself runs only on a GPU (tests/numerics/test_cuda_variants.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from kiln.compiler.quant_modules import QuantFormat
from kiln.compiler.quant_pack import dequantize, quantize
from kiln.targets import get_profile
from kiln.targets.mma_gemv import MMAGEMV, kernel_shape, mma_gemv

from gpu_kernels import nvcc_compiles
from test_q4_gemv import _fused_q4_matmul

FORMATS = {4: QuantFormat("q4", 32, "float16"), 8: QuantFormat("q8", 32, "float16")}

pytestmark = pytest.mark.compiler


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n, k, warps, unroll, count, groups", [
    (32, 512, 2, 2, None, 1), (16, 1024, 4, 2, 3, 1), (48, 256, 1, 2, 8, 1), (16, 128, 1, 1, 1, 1),
    (32, 512, 2, 1, 13, 2), (16, 256, 1, 2, 16, 2), (16, 256, 2, 1, 5, 2), (16, 2048, 16, 1, 3, 1)])
def test_fragments_give_the_float16_dequantized_weights_product(bits, n, k, warps, unroll, count, groups,
                                                                 pipeline=False):
    """The serial form (each lane's fragments as the kernel builds them, the MMA from its documented
    register layout), q4 and q8: float32 sums within float32 rounding of x . W with W rounded to
    float16 as the dequantize op rounds it, for 1 static row or `count` symbolic rows of 8 (one MMA
    a step) or 16 (two); the rows' outputs past the count are left alone."""
    fmt = FORMATS[bits]
    rows = None if count is None else tvm.tirx.Var("batch_size", "int64")
    func = mma_gemv(n, k, "float32", bits, warps, unroll, threads=False, count=rows,
                    groups=groups, pipeline=pipeline).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    rng = np.random.default_rng(n + k + bits)
    planes = quantize(fmt, rng.normal(0, 0.05, (n, k)).astype(np.float32))
    c = count or 1
    x = rng.normal(0, 1, (c, 1, k)).astype(np.float16)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in (planes["qweight"], planes["scale"], x,
                                                 np.full((c, 1, n), 7, np.float32))]
    lib["main"](*args)
    got = args[3].numpy()[:, 0].astype(np.float64)
    rounded = x[:, 0].astype(np.float64) @ dequantize(fmt, planes, "float16").astype(np.float64).T
    exact = x[:, 0].astype(np.float64) @ dequantize(fmt, planes, "float64").astype(np.float64).T
    bound = np.abs(x[:, 0]).astype(np.float64) @ np.abs(np.repeat(planes["scale"], 32, axis=1).astype(np.float64)
                                                          * 2 ** (bits - 1)).T
    np.testing.assert_array_less(np.abs(got - rounded), 1e-6 * bound + 1e-7)
    assert np.abs(got - exact).max() > 10 * np.abs(got - rounded).max()      # the float16 rounding is matched


def _built(func, branch_rows: int, rule) -> str:
    from kiln.targets.gpu import Matmul
    from kiln.targets.row_dispatch import dispatch_on_rows
    profile = get_profile("cuda-sm90")
    with profile.tvm_target():
        target = tvm.target.Target.current()
        branch = rule.apply(func, target, False)
        assert branch is not None
        tiled = Matmul().apply(func, target, False).mod["main"]
        merged = dispatch_on_rows(func, [(branch_rows, branch)], tiled, thread_invariant=True)
    merged = merged.with_attr("tirx.is_scheduled", True).with_attr("global_symbol", "gemv")
    return tvm.compile(tvm.IRModule({"gemv": merged}), target=profile.tvm_target()).mod.imports[0].inspect_source()


@pytest.mark.parametrize("rows, bits, most_warps, ahead, loads_first", [
    (1, 4, 8, 0, False), (8, 4, 8, 0, False), (16, 4, 8, 0, False), (1, 8, 8, 0, False), (16, 8, 8, 0, False),
    (1, 4, 16, 0, False), (16, 4, 16, 0, False), (1, 4, 8, 1, False), (16, 8, 8, 1, True), (1, 4, 8, 0, True)])
def test_branches_build_for_cuda(rows, bits, most_warps, ahead, loads_first, tmp_path):
    """At an 8B projection's shape (4096 x 14336: 7 iterations of K a warp), the one-row branch
    (OneRowGEMV) and the 8- and 16-row buckets (FirstOf, symbolic rows), merged with the tiled
    schedule, for q4 and q8 weights (and q4 with K split between 16 warps, gpu_checks.py's
    `warps16`; weights prefetched to L2 an iteration ahead, `prefetch`): the MMA instruction and the
    float16-pair arithmetic in the CUDA nvcc compiles; with `ahead`, each lane's two weight rows and
    their scales asked of L2 for iteration 1 before the loop and for the iteration after the next
    inside it, none without; with `loads_first`, a fence after the loads and before the first MMA."""
    from tvm.s_tir import dlight as dl

    from kiln.targets.gpu import FirstOf, OneRowGEMV
    func = _fused_q4_matmul(4096, 14336, fmt=FORMATS[bits])
    mma = MMAGEMV(bits, batch=rows, most_warps=most_warps, ahead=ahead, loads_first=loads_first)
    source = _built(func, rows, OneRowGEMV(mma) if rows == 1 else FirstOf(mma, dl.gpu.LowBatchGEMV(rows)))
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in source
    magic, mask = (0x64006400, 0x000F000F) if bits == 4 else (0x64806480, 0x00FF00FF)
    assert str(magic) in source and str(mask) in source
    kernel = source[source.index("gemv_kernel(half*"):]                          # the MMA GEMV's kernel
    loop = kernel.index("for (int it = 0;")
    prefetch = "tvm_builtin_ptx_prefetch_global_L2(("
    assert (prefetch in kernel[:loop], prefetch in kernel[loop:]) == (bool(ahead), bool(ahead))
    fence = "__threadfence_block();"
    assert (fence in kernel) == loads_first
    if loads_first:
        assert kernel.rindex("qweight_ptr + ", 0, kernel.index(fence)) < kernel.index(fence) < kernel.index("mma.sync")
    nvcc_compiles(source, tmp_path)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n, k, warps, unroll, count, groups", [
    (32, 1024, 2, 2, None, 1), (16, 2048, 4, 1, 3, 1), (16, 1536, 1, 2, 13, 2)])
def test_pipelined_fragments_give_the_product(bits, n, k, warps, unroll, count, groups):
    """`pipeline`'s order in the serial form (2, 4 and 6 iterations a warp): each lane's two register
    sets of weights, the next iteration's loaded into the other set before this one's MMAs read
    theirs, give the same sums."""
    test_fragments_give_the_float16_dequantized_weights_product(bits, n, k, warps, unroll, count, groups,
                                                                pipeline=True)


@pytest.mark.parametrize("rows", [1, 16])
def test_pipelined_kernel_loads_an_iteration_ahead(rows, tmp_path):
    """gpu_checks.py's `pipe` (MMAGEMV pipeline=True) at the 8B's down projection (7 iterations of
    2 chunks a warp): the iterations unrolled in the CUDA (no loop over them), the first MMA after
    the weight loads of two iterations (each: 2 chunks x rows g and g + 8, one 128-bit load each),
    every iteration's weights loaded once (28 loads), and nvcc compiles it; without it, one
    iteration's loads before the first MMA, in a loop."""
    from tvm.s_tir import dlight as dl

    from kiln.targets.gpu import FirstOf, OneRowGEMV
    func = _fused_q4_matmul(4096, 14336)
    for pipeline, before, loop in ((True, 8, False), (False, 4, True)):
        mma = MMAGEMV(4, batch=rows, pipeline=pipeline)
        source = _built(func, rows, OneRowGEMV(mma) if rows == 1 else FirstOf(mma, dl.gpu.LowBatchGEMV(rows)))
        kernel = source[source.index("gemv_kernel(half*"):]
        kernel = kernel[:kernel.index("\n}\n")]
        assert kernel.count("qweight_ptr + ", 0, kernel.index("mma.sync")) == before
        assert ("for (int it = 0;" in kernel) == loop
        if pipeline:
            assert kernel.count("qweight_ptr + ") == 28
            nvcc_compiles(source, tmp_path)
    with pytest.raises(ValueError, match="pipeline takes neither"):
        mma_gemv(4096, 14336, "float32", pipeline=True, ahead=1)


def test_rule_refuses_what_it_does_not_compute():
    """None (the next rule decides) for float32 scales, the other code width, N not a multiple of
    16, K not of 128, other targets, and a row count other than its own kind (static one row, or
    symbolic)."""
    from kiln.targets.row_dispatch import one_row
    cuda = get_profile("cuda-sm90").tvm_target()
    assert MMAGEMV().apply(one_row(_fused_q4_matmul(256, 512)), cuda, False) is not None
    assert MMAGEMV().apply(one_row(_fused_q4_matmul(256, 512, fmt=QuantFormat("q4", 32, "float32"))), cuda,
                           False) is None
    assert MMAGEMV(bits=8).apply(one_row(_fused_q4_matmul(256, 512)), cuda, False) is None
    assert MMAGEMV(bits=8).apply(one_row(_fused_q4_matmul(256, 512, fmt=FORMATS[8])), cuda, False) is not None
    assert MMAGEMV().apply(one_row(_fused_q4_matmul(256, 512, fmt=FORMATS[8])), cuda, False) is None
    assert MMAGEMV().apply(one_row(_fused_q4_matmul(264, 512)), cuda, False) is None
    assert MMAGEMV().apply(one_row(_fused_q4_matmul(256, 576)), cuda, False) is None
    assert MMAGEMV().apply(one_row(_fused_q4_matmul(256, 512)), get_profile("rocm").tvm_target(), False) is None
    assert MMAGEMV().apply(_fused_q4_matmul(256, 512), cuda, False) is None
    assert MMAGEMV(batch=8).apply(_fused_q4_matmul(256, 512), cuda, False) is not None
    assert MMAGEMV(batch=16).apply(_fused_q4_matmul(256, 512), cuda, False) is not None
    with pytest.raises(ValueError, match="1 to 16 rows"):
        MMAGEMV(batch=17)
    with pytest.raises(ValueError, match="4 or 8-bit"):
        MMAGEMV(bits=3)


def test_kernel_shape_splits_k_between_enough_warps():
    """8 warps a 16-row block for the 8B's 4096- and 6144-row projections, 4 for its 28,672-row one;
    fewer, or one chunk a load, where K does not divide; none where K is not whole chunks."""
    assert kernel_shape(4096, 4096) == (8, 2) and kernel_shape(6144, 4096) == (8, 2)
    assert kernel_shape(4096, 14336) == (8, 2) and kernel_shape(28672, 4096) == (4, 2)
    assert kernel_shape(576, 1536) == (4, 1)
    assert kernel_shape(1536, 576) is None
    # gpu_checks.py's `warps16`: twice the warps where the default has 8, one chunk a load where K
    # is no multiple of 16 x 2 chunks
    assert kernel_shape(4096, 4096, most_warps=16) == (16, 2) and kernel_shape(4096, 14336, most_warps=16) == (16, 1)
    assert kernel_shape(28672, 4096, most_warps=16) == (4, 2)
    # `unroll4`: 4 chunks a load where K divides, else 2 (the 8B's down projection), not 1
    assert kernel_shape(4096, 4096, unroll=4) == (8, 4) and kernel_shape(4096, 14336, unroll=4) == (8, 2)


def test_the_shipped_branches_fence_the_loads_at_one_row_only():
    """targets/gpu.py LOW_BATCH_BRANCHES: the one-row MMA GEMVs (4- and 8-bit) issue an iteration's
    loads before its MMAs (measured on the whole 8B, H200, 2026-12-04); those for 2-16 rows do not
    (unmeasured there)."""
    from kiln.targets import gpu
    by_rows = {rows: [r for r in branch.rules if isinstance(r, MMAGEMV)]
               for rows, branch in gpu.LOW_BATCH_BRANCHES if hasattr(branch, "rules")}
    assert [(r.bits, r.loads_first) for r in by_rows[1]] == [(4, True), (8, True)]
    assert all(not r.loads_first for rows, rules in by_rows.items() if rows > 1 for r in rules)
    assert sum(len(rules) for rows, rules in by_rows.items() if rows > 1) == 8    # 2, 4, 8 and 16 rows
