"""targets/cpu/int8_gemv.py: the GEMVs (1-8 rows) with int8 activations (`kiln compile --decode-activations
int8`), built through QuantMatmul as a compile builds it (the function tagged with INT8_DECODE_ATTR),
for this machine's CPU with each dot-product instruction set it has (vpdpbusd; AVX2's vpmaddubsw).
Checked against numpy doing the same arithmetic (x rounded to int8 per 32 values, integer dot
products, the zero values' term from float sums of x) and, looser, against the exact float64
product; rows 2+ keep the exact kernels; what the option does not take stays exact."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm

from kiln.compiler.quant_modules import QuantFormat
from kiln.compiler.quant_pack import dequantize, unpack_nibbles
from kiln.targets import INT8_DECODE_ATTR
from kiln.targets.cpu import int8_gemv
from kiln.targets.cpu.quant_schedule import QuantMatmul

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from bench_cpu_gemv import dequant_matmul, random_planes  # noqa: E402  (the kernels as kiln emits them)

pytestmark = pytest.mark.compiler

HOST = {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
        "mattr": ["-amx-tile", "-amx-int8", "-amx-bf16"]}
AVX2 = {"kind": "llvm", "mcpu": "haswell"}           # no VNNI: the vpmaddubsw + vpmaddwd form
ISA_TARGETS = {"vnni": HOST, "avx2": AVX2}


def _runs_here(isa: str) -> bool:
    host = tvm.target.Target(HOST)
    return int8_gemv.int8_isa(host) is not None and (isa == "avx2" or int8_gemv.int8_isa(host) == "vnni")


def int8_reference(fmt: QuantFormat, planes: dict, x: np.ndarray) -> np.ndarray:
    """y [n] as the kernel computes it, in float64 from its float32 roundings: x's int8 codes and dx
    per 32 values, each chunk's integer dot product with the codes, times its group's scale and dx;
    plus each group's zero value (q4's -8 scale, q4m's min) times the group's float sum of x."""
    chunks = x.reshape(-1, 32)
    amax = np.abs(chunks).max(-1)
    dx = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(amax > 0, np.float32(1) / np.where(dx > 0, dx, 1), 0).astype(np.float32)
    xq = np.rint(chunks * inv[:, None]).astype(np.int64)                          # [chunks, 32]
    codes = unpack_nibbles(planes["qweight"])
    n, k = codes.shape
    dots = (codes.astype(np.int64).reshape(n, -1, 32) * xq[None]).sum(-1)       # [n, chunks]
    per = fmt.group_size // 32
    scale = np.repeat(planes["scale"].astype(np.float64), per, axis=1)             # a chunk's group scale
    y = (dots * scale * dx.astype(np.float64)[None]).sum(-1)
    zero = planes["min"] if fmt.kind == "q4m" else planes["scale"].astype(np.float32) * np.float32(-8)
    sums = x.reshape(-1, fmt.group_size).astype(np.float64).sum(-1)
    return y + (zero.astype(np.float64) * sums[None]).sum(-1)


def _built(kind, group, scale_dtype, n, k, target):
    func = dequant_matmul(kind, n, k, group, scale_dtype=scale_dtype)
    sch = QuantMatmul().apply(func.with_attr(INT8_DECODE_ATTR, True), tvm.target.Target(target), False)
    assert sch is not None
    return tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=tvm.target.Target(target))


def _run(lib, planes, x, n):
    dev = tvm.cpu()
    y = tvm.runtime.tensor(np.zeros((x.shape[0], 1, n), np.float32), dev)
    lib["main"](*(tvm.runtime.tensor(p, dev) for p in planes.values()), tvm.runtime.tensor(x, dev), y)
    return y.numpy()[:, 0]


# (kind, group, scale dtype): GGUF's Q4_0 / Q4_1 keep float16 scales; groups of 64 and 96 (a pair of
# chunks in one group; pairs across groups)
CASES = [("q4", 32, "float32"), ("q4m", 32, "float16"), ("q4", 32, "float16"), ("q4m", 64, "float32"),
         ("q4m", 96, "float16")]


@pytest.mark.parametrize("isa", list(ISA_TARGETS))
@pytest.mark.parametrize("case", CASES, ids=[f"{k}-g{g}-{s[5:]}s" for k, g, s in CASES])
def test_one_row_matches_numpy_int8_arithmetic(case, isa):
    if not _runs_here(isa):
        pytest.skip(f"this CPU lacks the {isa} instructions")
    kind, group, scale_dtype = case
    n, k = 40, 384 if group != 64 else 512
    lib = _built(kind, group, scale_dtype, n, k, ISA_TARGETS[isa])
    assert ("vpdpbusd" if isa == "vnni" else "vpmaddubsw") in lib.mod.inspect_source("s")
    rng = np.random.default_rng(3)
    fmt = QuantFormat(kind, group, scale_dtype)
    planes = random_planes(fmt, n, k, rng)
    x = rng.standard_normal((1, 1, k)).astype(np.float32)
    x[0, 0, 32:64] = 0                          # a chunk of zeros: dx 0, its codes 0
    x[0, 0, 70] = 9.0                           # an outlier: its chunk's scale
    got = _run(lib, planes, x, n)[0]
    want = int8_reference(fmt, planes, x[0, 0])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5 * np.abs(want).max())
    exact = x[0, 0].astype(np.float64) @ dequantize(fmt, planes).astype(np.float64).T
    err = np.abs(got - exact).max() / np.abs(exact).max()
    assert 1e-5 < err < 3e-2, err               # x's rounding to 8 bits, and no more


@pytest.mark.parametrize("rows", [2, 3, 4, 5, 8, 9])
def test_more_rows(rows):
    """2-8 rows (decode's sequences, a prefill's few tokens) take int8 x too, each row its own codes
    and dx (5-8: two passes of 4; rows past the call's not written); 9, the exact tiled matmul."""
    n, k = 40, 384
    lib = _built("q4m", 32, "float16", n, k, HOST)
    fmt = QuantFormat("q4m", 32, "float16")
    rng = np.random.default_rng(rows)
    planes = random_planes(fmt, n, k, rng)
    x = rng.standard_normal((rows, 1, k)).astype(np.float32)
    got = _run(lib, planes, x, n)
    if rows > 8:
        want = x[:, 0].astype(np.float64) @ dequantize(fmt, planes).astype(np.float64).T
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        return
    for r in range(rows):
        want = int8_reference(fmt, planes, x[r, 0])
        np.testing.assert_allclose(got[r], want, rtol=1e-5, atol=2e-5 * np.abs(want).max())


def test_what_it_does_not_take():
    """8- and 16-bit codes, K not a multiple of 64, groups of 16: the exact kernels; no x86
    AVX2, no kernel."""
    assert not any(int8_gemv.takes(kind, 384, 32) for kind in ("q8", "q8m", "f16", "bf16"))
    assert not int8_gemv.takes("q4", 160, 32) and not int8_gemv.takes("q4", 384, 16)
    assert int8_gemv.takes("q4m", 576, 32) and int8_gemv.takes("q4", 576, 64)
    assert int8_gemv.int8_isa(tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                                                 "mattr": ["+neon"]})) is None
    assert int8_gemv.int8_isa(tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                                                 "mattr": ["+neon", "+dotprod"]})) == "sdot"
    assert int8_gemv.int8_isa(tvm.target.Target({"kind": "llvm", "mcpu": "sandybridge"})) is None
    assert int8_gemv.int8_isa(tvm.target.Target(AVX2)) == "avx2"
    assert int8_gemv.int8_isa(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})) == "vnni"
    with pytest.raises(ValueError, match="takes"):
        int8_gemv.int8_gemv_kernel("q8", 8, 64, 32, "float32", "vnni")


def test_untagged_functions_stay_exact():
    """Without the attribute (a compile without --decode-activations int8) one row is exact."""
    n, k = 40, 384
    func = dequant_matmul("q4m", n, k, 32)
    sch = QuantMatmul().apply(func, tvm.target.Target(HOST), False)
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=tvm.target.Target(HOST))
    fmt = QuantFormat("q4m", 32)
    rng = np.random.default_rng(1)
    planes = random_planes(fmt, n, k, rng)
    x = rng.standard_normal((1, 1, k)).astype(np.float32)
    want = x[:, 0].astype(np.float64) @ dequantize(fmt, planes).astype(np.float64).T
    np.testing.assert_allclose(_run(lib, planes, x, n), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("name", ["aarch64", "android"])
def test_aarch64_profiles_add_the_dot_product_for_int8_only(name):
    """The generic AArch64 presets run without the dot product; a --decode-activations int8 build
    of them adds +dotprod, so the kernel takes sdot (run under QEMU: test_aarch64_qemu.py)."""
    from kiln.targets import get_profile
    profile = get_profile(name)
    assert profile.int8_decode and "+dotprod" not in profile.target["mattr"]
    assert int8_gemv.int8_isa(profile.tvm_target()) is None
    assert int8_gemv.int8_isa(profile.with_int8_decode().tvm_target()) == "sdot"
    assert get_profile("x86-64-v3").with_int8_decode() == get_profile("x86-64-v3")      # nothing to add
