"""targets/cpu/quant_kernel.py: the compiled q4 quantizer conversion runs, against quant_pack's numpy
search (quantize(reference=True)): the same codes and scales, bit for bit, for float16 and float32
weights, float16 and float32 scales, a partial last block and fewer groups than a block, and the
groups that test the rules (all zero, one value, constant, halves that round to even, a tie for
the extreme); a NaN or infinity refused with the tensor named."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.compiler.quant_modules import QuantFormat
from kiln.compiler.quant_pack import dequantize, quantize
from kiln.targets import get_profile
from kiln.targets.cpu import quant_kernel

pytestmark = pytest.mark.unit


def _special(dtype) -> np.ndarray:
    rng = np.random.default_rng(5)
    w = rng.normal(0, 0.02, (7, 96)).astype(dtype)
    w[0, :32] = 0                                            # all zero: scale 0, codes 8
    w[1, :32] = 0
    w[1, 7] = -0.5                                           # one value
    w[2, 32:64] = 0.25                                       # constant
    w[3, :32] = np.arange(32) * 0.125 - 2                    # levels landing on halves
    w[4, 64:] = rng.choice([-1.0, 1.0], 32)                  # the extreme tied: the first wins
    w[5, :32] = rng.normal(0, 1e-4, 32)                      # small values (float16 subnormal range)
    w[6, :] = rng.normal(0, 30, 96)                          # large ones
    return w


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("scale_dtype", ["float16", "float32"])
@pytest.mark.parametrize("shape", [(1, 32), (3, 96), (17, 64), (300, 576), (4096, 256)])
def test_kernel_gives_the_reference_bits(dtype, scale_dtype, shape):
    w = np.random.default_rng(shape[0]).normal(0, 0.02, shape).astype(dtype)
    fmt = QuantFormat("q4", 32, scale_dtype)
    got, want = quantize(fmt, w), quantize(fmt, w, reference=True)
    np.testing.assert_array_equal(got["qweight"], want["qweight"])
    np.testing.assert_array_equal(got["scale"].view(np.uint8), want["scale"].view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_kernel_follows_the_rules_on_special_groups(dtype):
    w = _special(dtype)
    fmt = QuantFormat("q4", 32, "float32")
    got, want = quant_kernel.q4_quantize(w, "float32"), quantize(fmt, w, reference=True)
    np.testing.assert_array_equal(got["qweight"], want["qweight"])
    np.testing.assert_array_equal(got["scale"], want["scale"])
    assert got["scale"][0, 0] == 0 and (dequantize(fmt, got)[0, :32] == 0).all()
    np.testing.assert_allclose(dequantize(fmt, got)[2, 32:64], 0.25, rtol=1e-6)


def test_the_host_profile_offers_it():
    assert get_profile("cpu").q4_quantizer is quant_kernel.q4_quantize


def test_kernel_tries_the_reference_candidates():
    from kiln.compiler.quant_pack import _Q4_DIVISORS
    assert quant_kernel.DIVISORS == [float(d) for d in _Q4_DIVISORS]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_weights_are_refused(bad):
    w = np.random.default_rng(0).normal(0, 1, (4, 64)).astype(np.float16)
    w[2, 40] = bad
    with pytest.raises(ValueError, match="1 groups of 32 values hold NaN or infinity"):
        quantize(QuantFormat("q4", 32, "float16"), w)


@pytest.mark.parametrize("scale_dtype", ["float32", "float16"])
def test_q8_keeps_mxfp4_values_exactly(scale_dtype):
    """q8 of a weight whose groups are MXFP4 blocks (e2m1 codes times a power of two: gpt-oss's experts) takes the
    power-of-two scale that holds them, so dequantizing gives them back bit for bit; other groups keep
    max|w| / 127."""
    from kiln.models.gpt_oss import mxfp4_decode
    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 256, size=(6, 4, 16), dtype=np.uint8)
    scales = rng.integers(115, 130, size=(6, 4), dtype=np.uint8)
    w = mxfp4_decode(blocks, scales)                          # [6, 128]: four 32-value blocks a row
    fmt = QuantFormat("q8", 32, scale_dtype)
    planes = quantize(fmt, w)
    np.testing.assert_array_equal(dequantize(fmt, planes), w)
    plain = rng.standard_normal((6, 128)).astype(np.float32)
    scale = quantize(fmt, plain)["scale"]
    np.testing.assert_array_equal(scale, (np.abs(plain.reshape(6, 4, 32)).max(-1) / 127).astype(scale_dtype))


def test_llvm_opt_level_goes_into_the_cpu_target_and_a_bad_one_is_refused(monkeypatch):
    """KILN_LLVM_OPT_LEVEL (targets/cpu llvm_opt_level): 0-3 becomes the target's opt-level, unset leaves LLVM's
    default, anything else is refused naming the variable and the values it takes."""
    monkeypatch.delenv("KILN_LLVM_OPT_LEVEL", raising=False)
    assert "opt-level" not in get_profile("cpu").target
    monkeypatch.setenv("KILN_LLVM_OPT_LEVEL", "0")
    assert get_profile("cpu").target["opt-level"] == 0
    monkeypatch.setenv("KILN_LLVM_OPT_LEVEL", "fast")
    with pytest.raises(ValueError, match=r"KILN_LLVM_OPT_LEVEL='fast': LLVM takes 0, 1, 2 or 3"):
        get_profile("cpu")
