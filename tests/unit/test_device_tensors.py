"""runtime/device_tensors.py: copies back to the host through a thread's kept host array."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tvm

from kiln.runtime.device_tensors import LaunchedTokens, _to_host

pytestmark = pytest.mark.unit


def test_tokens_of_a_known_shape_come_back_as_their_own_arrays():
    """Two forwards' tokens copied back through the same kept [2] int32 array: each result is its own
    copy (the second copy does not change the first), on another thread too; a wrong known shape is
    refused by the copy, never read as other bytes."""
    first = LaunchedTokens(tvm.runtime.tensor(np.array([5, 9], np.int32)), queued=False, count=2).wait()
    second = LaunchedTokens(tvm.runtime.tensor(np.array([7, 3], np.int32)), queued=False, count=2).wait()
    assert first.tolist() == [5, 9] and second.tolist() == [7, 3]
    got = []
    worker = threading.Thread(target=lambda: got.append(
        _to_host(tvm.runtime.tensor(np.array([1, 2], np.int32)), False, ((2,), "int32"))))
    worker.start()
    worker.join()
    assert got[0].tolist() == [1, 2] and first.tolist() == [5, 9]
    with pytest.raises(Exception):
        _to_host(tvm.runtime.tensor(np.array([1, 2, 3], np.int32)), False, ((2,), "int32"))
    logits = np.zeros((2, 1, 4), np.float32)
    logits[0, 0, 3] = logits[1, 0, 1] = 1
    assert LaunchedTokens(tvm.runtime.tensor(logits), queued=False, argmax=True, count=2).wait().tolist() == [3, 1]
