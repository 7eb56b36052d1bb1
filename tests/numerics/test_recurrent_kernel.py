"""targets/recurrent.py's kernels on the CPU against numpy in float64: two sequences in one forward, one
starting (position 0, its slot holding stale values) and one continuing from its slot's state; then a
decode row each from the states they left."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.targets.recurrent import gated_delta, selective_scan, state_conv
from recurrent_reference import conv_reference, delta_reference, selective_scan_reference

pytestmark = pytest.mark.numerics
INDPTR, SLOTS = np.array([0, 3, 5], np.int32), np.array([2, 0], np.int32)
POSITIONS = np.array([0, 1, 2, 7, 8], np.int32)                # sequence 0 starts; sequence 1 holds 7 tokens


def _run(func, args, inplace: int):
    import tvm
    lib = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target({"kind": "llvm"}))
    tensors = [tvm.runtime.tensor(a) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy(), tensors[inplace].numpy()


@pytest.mark.parametrize("taps", [4, 2])
def test_conv_over_state_slots(taps):
    rng = np.random.default_rng(taps)
    c = 6
    w = rng.standard_normal((c, taps)).astype(np.float32)
    state = rng.standard_normal((3, c, taps - 1)).astype(np.float32)
    for indptr, positions in ((INDPTR, POSITIONS), (np.array([0, 1, 2], np.int32), np.array([3, 9], np.int32))):
        x = rng.standard_normal((int(indptr[-1]), c)).astype(np.float32)
        want, want_state = conv_reference(x, state, indptr, SLOTS, positions, w)
        got, state = _run(state_conv(c, taps, "float32"), [x, state, indptr, SLOTS, positions, w,
                                                          np.full_like(x, 7.0)], 1)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
        np.testing.assert_allclose(state[SLOTS], want_state[SLOTS], atol=1e-6, rtol=0)
        np.testing.assert_array_equal(state[1], want_state[1])     # a slot no sequence holds: untouched


@pytest.mark.parametrize("delta,channels", [(True, False), (False, False), (True, True)])
def test_gated_delta_over_state_slots(delta, channels):
    """The gated delta rule, without its delta Mamba-2's scan (B, C as k, q; x as v; dt as beta), and with a decay a
    key channel Kimi Linear's KDA."""
    rng = np.random.default_rng(0)
    hk, hv, dk, dv = 2, 4, 8, 6
    state = rng.standard_normal((3, hv, dk, dv)).astype(np.float32)
    for indptr, positions in ((INDPTR, POSITIONS), (np.array([0, 1, 2], np.int32), np.array([3, 9], np.int32))):
        n = int(indptr[-1])
        q, k = (rng.standard_normal((n, hk, dk)).astype(np.float32) for _ in range(2))
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
        v = rng.standard_normal((n, hv, dv)).astype(np.float32)
        g = -rng.uniform(0.01, 2.0, (n, hv, dk) if channels else (n, hv)).astype(np.float32)
        beta = rng.uniform(0, 1, (n, hv)).astype(np.float32)
        want, want_state = delta_reference(q, k, v, g, beta, state, indptr, SLOTS, positions, delta)
        got, state = _run(gated_delta(hk, hv, dk, dv, delta=delta, channels=channels),
                          [q, k, v, g, beta, state, indptr, SLOTS, positions, np.full_like(v, 7.0)], 5)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(state[SLOTS], want_state[SLOTS], atol=1e-5, rtol=1e-5)


def test_selective_scan_over_state_slots():
    """Mamba-1's scan: a decay a channel and state entry (32 channels: two CPU tasks of 16 a sequence)."""
    rng = np.random.default_rng(3)
    c, n_state = 32, 5
    A = -rng.uniform(0.1, 3.0, (c, n_state)).astype(np.float32)
    state = rng.standard_normal((3, c, n_state)).astype(np.float32)
    for indptr, positions in ((INDPTR, POSITIONS), (np.array([0, 1, 2], np.int32), np.array([3, 9], np.int32))):
        n = int(indptr[-1])
        x = rng.standard_normal((n, c)).astype(np.float32)
        dt = rng.uniform(0.01, 1.0, (n, c)).astype(np.float32)
        B, C = (rng.standard_normal((n, n_state)).astype(np.float32) for _ in range(2))
        want, want_state = selective_scan_reference(x, dt, A, B, C, state, indptr, SLOTS, positions)
        got, state = _run(selective_scan(c, n_state), [x, dt, A, B, C, state, indptr, SLOTS, positions,
                                                       np.full_like(x, 7.0)], 5)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(state[SLOTS], want_state[SLOTS], atol=1e-5, rtol=1e-5)
