"""Device tensors as the runner hands them around: views, copies back to the host, and the tokens of
a queued forward (LaunchedTokens), through TVM calls that keep the GIL where they only copy a few
bytes or make a view."""

from __future__ import annotations

import ctypes
import threading
from typing import Sequence

import numpy as np

from ._tvm import tvm
from tvm.runtime import ShapeTuple


# TVM's Python calls release the GIL (tvm_ffi's default), and a call's return then waits for it: up to
# the interpreter's switch interval (5 ms) while another thread runs Python, as a server's event loop
# does at every token. kiln's own handles to the calls that only keep books, copy a few bytes or make a
# view keep the GIL through them (nothing else in the process changes); so do the forwards on devices
# that only queue them (ModelRunner.__init__), leaving one wait a step: its tokens' copy back.
def _holding_gil(fn):
    fn.release_gil = False
    return fn


_COPY_IN, _COPY_OUT, _VIEW = (_holding_gil(tvm.get_global_func(f"runtime.TVMTensor{name}"))
                              for name in ("CopyFromBytes", "CopyToBytes", "CreateView"))


def _view(tensor, shape: Sequence[int]):
    """tensor's first elements as a tensor of `shape` (Tensor._create_view, holding the GIL)."""
    return _VIEW(tensor, ShapeTuple(list(shape)), tensor.dtype, 0)


class _Mirrors(threading.local):
    """This thread's host arrays for copies back of a known shape, by (shape, dtype), each with its pointer."""

    def __init__(self) -> None:
        self.arrays: dict[tuple, tuple[np.ndarray, ctypes.c_void_p]] = {}


_MIRRORS = _Mirrors()


def _to_host(tensor, wait: bool, known: tuple[tuple, str] | None = None) -> np.ndarray:
    """A copy of `tensor` on the host (Tensor.numpy for int and float tensors). wait: the copy waits for
    the device's queued work, so it lets the GIL go meanwhile; else it holds it. `known`: the tensor's
    (shape, dtype), where the caller knows them: the copy goes through this thread's kept host array
    of that shape and dtype, asking the tensor nothing. A CPU decode step's host work runs with its
    caches cold (the step streamed the weights through them): a token copied back took 155 us through
    a new array and its pointer, 30 through a kept one, after a 128 MB sweep (5 and 0.5 warm; 63 of
    the 155 asking the tensor its shape and dtype)."""
    if wait:
        return tensor.numpy()
    if known is None:
        out = np.empty(tuple(tensor.shape), np.dtype(str(tensor.dtype)))
        _COPY_OUT(tensor, out.ctypes.data_as(ctypes.c_void_p), out.nbytes)
        return out
    kept = _MIRRORS.arrays.get(known)
    if kept is None:
        host = np.empty(*known)
        kept = _MIRRORS.arrays[known] = (host, host.ctypes.data_as(ctypes.c_void_p))
    _COPY_OUT(tensor, kept[1], kept[0].nbytes)
    return kept[0].copy()


class LaunchedTokens:
    """The next tokens of a queued forward (ModelRunner.launch_next_tokens), still on the device."""

    def __init__(self, on_device, queued: bool, argmax: bool = False, front=None, count: int | None = None):
        self._on_device = on_device       # tokens [batch], or logits [batch, 1, vocab] to argmax here
        self._queued = queued             # the device runs the forward after the launch returned (a GPU)
        self._argmax = argmax
        self._known = None if argmax or count is None else ((count,), "int32")     # tokens: _to_host's
        self._front = front               # logits [k, 1, vocab] of the first k rows, for a host sampler
        self._tokens: np.ndarray | None = None

    def logits(self) -> np.ndarray:
        """The first rows' logits [k, vocab] on the host (k = launch_next_tokens' logits_rows; 0 rows if 0)."""
        if self._front is None:
            return np.zeros((0, 0), np.float32)
        return _to_host(self._front, wait=False)[:, 0, :]      # after wait(): the forward is done

    def wait(self) -> np.ndarray:
        """Wait for the forward; its tokens [batch] on the host (copied back once, kept for later calls)."""
        if self._tokens is None:
            out = _to_host(self._on_device, wait=self._queued, known=self._known)
            self._tokens = np.argmax(out[:, 0, :], axis=1) if self._argmax else out
            self._on_device = None
        return self._tokens
