"""targets/cpu/quant_gemv.py: the hand-written GEMVs QuantMatmul runs for kiln's q4 / q4m / q8 / q8m /
f16 / bf16 float32 kernels at 1, 2, 3-4 and 5-8 rows. Built through QuantMatmul from kernels written as
kiln's dequantize emits them, for this machine's CPU; 1-8 rows (the hand kernels; 5 and 8 in two passes of
4) and 9 (the tiled branch) against numpy's float64 product of the same dequantized planes; and what the
match turns away."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm

from kiln.compiler.quant_modules import QuantFormat
from kiln.compiler.quant_pack import dequantize
from kiln.targets.cpu import quant_gemv
from kiln.targets.cpu.quant_schedule import QuantMatmul

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import bench_cpu_gemv  # noqa: E402  (the kernels as kiln emits them, shared with the benchmark)
from bench_cpu_gemv import dequant_matmul, random_planes  # noqa: E402

pytestmark = pytest.mark.compiler

TARGET = {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
          "mattr": ["-amx-tile", "-amx-int8", "-amx-bf16"]}


# (kind, group, scale dtype): float16 scales are a GGUF's Q4_0 / Q4_1 / Q8_0 / Q5_0 / Q5_1 blocks' own;
# q8 in groups of 16 is Q6_K as stored (each half of a chunk its own scale)
CASES = [("q4", 32, "float32"), ("q4m", 32, "float32"), ("q4m", 128, "float32"), ("q8", 32, "float32"),
         ("q8m", 32, "float32"), ("q4", 64, "float32"), ("f16", 32, "float32"), ("bf16", 32, "float32"),
         ("q4m", 32, "float16"), ("q4", 32, "float16"), ("q8", 32, "float16"), ("q8m", 64, "float16"),
         ("q8", 16, "float32"), ("q8m", 16, "float16")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{k}-g{g}" + ("-f16s" if s == "float16" else "")
                                                    for k, g, s in CASES])
def built(request):
    kind, group, scale_dtype = request.param
    n, k = 48, 256 + 128 if group != 128 else 512
    func = dequant_matmul(kind, n, k, group, by_bits=kind == "q8", scale_dtype=scale_dtype)
    sch = QuantMatmul().apply(func, tvm.target.Target(TARGET), False)
    assert sch is not None
    script = sch.mod["main"].script()
    assert all(f'"{view}"' in script for view in ("one_row_gemv", "gemv_2_rows", "gemv_4_rows", "gemv_8_rows")), \
        "QuantMatmul did not take the hand-written GEMVs"
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=tvm.target.Target(TARGET))
    return kind, group, scale_dtype, n, k, lib


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9])
def test_gemv_matches_numpy(built, rows):
    kind, group, scale_dtype, n, k, lib = built
    rng = np.random.default_rng(rows)
    fmt = QuantFormat(kind, group, scale_dtype)
    planes = random_planes(fmt, n, k, rng)
    x = rng.standard_normal((rows, 1, k)).astype(np.float32)
    want = x[:, 0].astype(np.float64) @ dequantize(fmt, planes).astype(np.float64).T          # [rows, n]
    dev = tvm.cpu()
    y = tvm.runtime.tensor(np.zeros((rows, 1, n), np.float32), dev)
    lib["main"](*(tvm.runtime.tensor(p, dev) for p in planes.values()), tvm.runtime.tensor(x, dev), y)
    got = y.numpy()[:, 0]
    # float32 sums of k products, in another order than float64's
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["q4m", "q8"])
def test_prefill_layout_takes_the_gemvs(kind):
    """A prefill's [1, rows, K] activations (its logits: one row a sequence) take the same GEMVs, the
    kernels' [rows, 1, K] buffers declared over the same memory; 1-8 rows and the tiled 9 against numpy."""
    n, k = 48, 384
    func = dequant_matmul(kind, n, k, 32, rows_second=True)
    sch = QuantMatmul().apply(func, tvm.target.Target(TARGET), False)
    assert '"gemv_4_rows"' in sch.mod["main"].script()
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=tvm.target.Target(TARGET))
    fmt = QuantFormat(kind, 32)
    for rows in (1, 2, 3, 7, 9):
        rng = np.random.default_rng(rows)
        planes = random_planes(fmt, n, k, rng)
        x = rng.standard_normal((1, rows, k)).astype(np.float32)
        want = x[0].astype(np.float64) @ dequantize(fmt, planes).astype(np.float64).T
        dev = tvm.cpu()
        y = tvm.runtime.tensor(np.full((1, rows, n), np.nan, np.float32), dev)
        lib["main"](*(tvm.runtime.tensor(p, dev) for p in planes.values()), tvm.runtime.tensor(x, dev), y)
        np.testing.assert_allclose(y.numpy()[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_match_refuses_what_the_kernel_does_not_compute():
    assert quant_gemv.branches(dequant_matmul("q4m", 48, 384, 32)) is not None
    assert quant_gemv.branches(dequant_matmul("q4m", 48, 352, 32)) is None            # K not a multiple of 64
    assert quant_gemv.branches(dequant_matmul("q4m", 48, 384, 32, x_dtype="float16")) is None
    assert quant_gemv.branches(dequant_matmul("q4m", 48, 384, 32, rows=1)) is None    # static rows: the tiled rule
    assert quant_gemv.branches(dequant_matmul("f16", 48, 352, 32)) is None
    assert quant_gemv.branches(dequant_matmul("q4", 48, 384, 16)) is None             # 4-bit groups of 16 (Q3_K)


def test_the_kernel_builds_for_arm():
    """The same TIR for AArch64 (Android and Apple): LLVM lowers the 16-lane vectors onto NEON."""
    for target in ({"kind": "llvm", "mtriple": "aarch64-linux-android", "mcpu": "generic", "mattr": ["+neon"]},
                   {"kind": "llvm", "mtriple": "arm64-apple-macos", "mcpu": "apple-m1"}):
        for kind, scale_dtype in (("q4m", "float32"), ("q8", "float32"), ("q4m", "float16")):
            kernel = quant_gemv.gemv_kernel(kind, 64, 256, 32, scale_dtype=scale_dtype)
            tvm.compile(tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")}),
                        target=tvm.target.Target(target))


def test_the_benchmark_tool_runs(capsys):
    """tools/bench_cpu_gemv.py (hand-written against scheduled GEMV) on one small shape."""
    assert bench_cpu_gemv.main(["--formats", "q4m,f16", "--shapes", "o_proj", "--rows", "1,3", "--repeat", "1",
                                "--cold-mb", "1"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("q4m", "f16"))]
    assert len(lines) == 4
    assert all(float(line.split()[-1]) < 1e-5 and float(line.split()[-2]) < 1e-5 for line in lines)


def test_the_benchmark_tool_takes_groups_of_16(capsys):
    """--group 16: 8-bit codes (GGUF's Q6_K as stored) run; 4-bit ones the kernels refuse, said so."""
    assert bench_cpu_gemv.main(["--formats", "q8", "--group", "16", "--shapes", "o_proj", "--repeat", "1",
                                "--cold-mb", "1"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("q8"))
    assert float(line.split()[-1]) < 1e-5 and float(line.split()[-2]) < 1e-5
    with pytest.raises(SystemExit, match="quant_gemv does not take this kernel"):
        bench_cpu_gemv.main(["--formats", "q4", "--group", "16", "--shapes", "o_proj", "--repeat", "1",
                             "--cold-mb", "1"])
