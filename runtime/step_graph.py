"""Whole decode steps replayed as CUDA graphs: ModelRunner(step_graphs=True), CUDA only.

Why: at one sequence the host queues a decode step one VM instruction at a time, TVM's per-layer
graphs, the KV cache's attention launches and the VM's own instructions: 1.64 ms a step for the 8B
on the H200 (tools/README.md, "H200 session"), where 75% of the bandwidth floor leaves 1.69 ms for
the whole step. TVM's RewriteCUDAGraph captures only the stretches between the cache's attention
calls. Here the runner captures a step's embedding, batch_decode and token pick whole (the VM, the
cache's launches, everything) and from then on replays it with one cuGraphLaunch.

What a replay reuses, and why each is safe:
- Inputs: the token ids and sampling parameters are staged into the runner's fixed device buffers
  (ModelRunner._staged); the weights and the KV pages never move.
- Page tables: TVM's cache copies them each step into one device buffer, array after array
  (attn_utils.h, CachedPagedKVCacheAuxDataManager). Their offsets, the kernels' shape arguments and
  kiln's attention split (targets/decode_attention.py) follow from the batch and the pages its
  sequences hold, so a graph serves one (pick, batch, pages) key. That holds while each sequence
  is one block of pages. A sequence that was forked (TVM then attends over depths of shared blocks)
  or slides a window never takes a graph (ModelRunner._graph_key). The copy itself is made before
  the replay (attention_kv_cache_get_query_positions).
- Scratch and outputs: the VM's pooled allocator hands the capture its blocks, and a replay writes
  the same addresses. Every forward's results are read (tokens copied back, a host sampler's logits)
  before the next forward is launched (ModelRunner.launch_next_tokens). So a block handed to another
  call in between never holds anything a replay could still overwrite. The outputs of each kept
  graph stay referenced, so no other call is handed them.

When to capture: a key is captured at its second step (the first runs as before), and replayed
from its third. At one sequence the key changes once every 16 tokens (a page), so 14 of 16 steps
replay. Where it changes nearly every step (many sequences), nothing is captured and nothing is lost.
The graph runs on a stream of its own, created blocking, so that it is ordered against the legacy
stream that TVM's copies and the cache's copy-stream wait use. If anything fails in a capture, graphs
are turned off for the runner (the reason kept in `off`) and the step runs as before.

TVM's own graphs inside a step: an artifact built with RewriteCUDAGraph launches a TVM graph for
each stretch between the cache's attention calls (vm.builtin.cuda_graph.run_or_capture). Whether
CUDA captures a graph launched into a stream that is itself capturing is not relied on: a step is
captured through a second VM over the same module (capture_functions), in which that builtin runs
the stretch's kernels straight into the current stream. The builtin is swapped only while that VM
is made (a VM binds its builtins then: tests/unit/test_step_graph.py), so the runner's own VM and
every other keep TVM's graphs for the steps that run plainly.
"""

from __future__ import annotations

import ctypes
import logging
from collections import OrderedDict
from typing import Callable, Hashable

from ._tvm import tvm_ffi                 # kiln's TVM (torch hidden) before tvm.runtime.vm
from tvm.runtime.vm import VirtualMachine

# CUDA driver API (cuda.h): CU_STREAM_DEFAULT (blocking), CU_STREAM_CAPTURE_MODE_RELAXED (TVM's pooled
# allocator may cudaMalloc while the step is captured).
_BLOCKING, _RELAXED = 0, 2
KEPT_GRAPHS = 8          # graphs kept (least recently used dropped): a page count's lasts 16 tokens at batch 1
_log = logging.getLogger("kiln.engine")

# TVM's per-stretch CUDA graphs (RewriteCUDAGraph): run_or_capture(vm, stretch, args, index[, shape]).
RUN_OR_CAPTURE = "vm.builtin.cuda_graph.run_or_capture"
# What a step graph captures: the embedding, the decode entry, the token picks.
CAPTURED = ("embed", "batch_decode", "greedy_tokens", "sample_tokens")


class GraphError(RuntimeError):
    pass


def capture_functions(module, device, names) -> dict:
    """`names`' functions of a second VM over `module` (what VirtualMachine takes) whose TVM graph
    stretches run their kernels in the current stream, no TVM graph launched (the module's
    docstring says why): what a step is captured through."""
    original = tvm_ffi.get_global_func(RUN_OR_CAPTURE, allow_missing=True)
    invoke = tvm_ffi.get_global_func("vm.builtin.invoke_closure")

    def stretch(vm, func, args, _index, *_shape):
        return invoke(vm, func, *args)

    tvm_ffi.register_global_func(RUN_OR_CAPTURE, stretch, override=True)
    try:
        vm = VirtualMachine(module, device)
    finally:                                   # every VM made from now on binds TVM's again
        if original is not None:
            tvm_ffi.register_global_func(RUN_OR_CAPTURE, original, override=True)
        else:
            tvm_ffi.remove_global_func(RUN_OR_CAPTURE)
    return {name: vm[name] for name in names}


class Driver:
    """The few CUDA driver calls a step graph needs (libcuda.so.1, through ctypes: the runtime-only TVM
    exposes no graph API). Handles are ints, as TVM's Device.set_raw_stream takes them."""

    def __init__(self, lib: ctypes.CDLL | None = None) -> None:
        try:
            self._lib = lib or ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise GraphError(f"the CUDA driver (libcuda.so.1) cannot be loaded: {e}") from e

    def _call(self, name: str, *args) -> None:
        result = getattr(self._lib, name)(*args)
        if result:
            text = ctypes.c_char_p()
            self._lib.cuGetErrorName(result, ctypes.byref(text))
            raise GraphError(f"{name} failed: {(text.value or b'CUDA error').decode()} ({result})")

    def _handle(self, name: str, *args) -> int:
        out = ctypes.c_void_p()
        self._call(name, ctypes.byref(out), *args)
        return out.value or 0

    def stream(self) -> int:
        return self._handle("cuStreamCreate", ctypes.c_uint(_BLOCKING))

    def begin(self, stream: int) -> None:
        self._call("cuStreamBeginCapture_v2", ctypes.c_void_p(stream), ctypes.c_int(_RELAXED))

    def end(self, stream: int) -> int:
        out = ctypes.c_void_p()
        self._call("cuStreamEndCapture", ctypes.c_void_p(stream), ctypes.byref(out))
        return out.value or 0

    def instantiate(self, graph: int) -> int:
        return self._handle("cuGraphInstantiateWithFlags", ctypes.c_void_p(graph), ctypes.c_ulonglong(0))

    def launch(self, graph_exec: int, stream: int) -> None:
        self._call("cuGraphLaunch", ctypes.c_void_p(graph_exec), ctypes.c_void_p(stream))

    def drop_graph(self, graph: int) -> None:
        self._lib.cuGraphDestroy(ctypes.c_void_p(graph))

    def drop_exec(self, graph_exec: int) -> None:
        self._lib.cuGraphExecDestroy(ctypes.c_void_p(graph_exec))

    def wait(self, stream: int) -> None:
        self._call("cuStreamSynchronize", ctypes.c_void_p(stream))

    def drop_stream(self, stream: int) -> None:
        self._lib.cuStreamDestroy_v2(ctypes.c_void_p(stream))


class StepGraphs:
    """Captured steps by key, replayed on one stream (see the module's docstring)."""

    def __init__(self, device, driver: Driver | None = None, kept: int = KEPT_GRAPHS) -> None:
        self.device = device                  # TVM device whose current stream a capture switches
        self.driver = driver or Driver()
        self.stream = self.driver.stream()
        self.kept = kept
        self._graphs: OrderedDict[Hashable, tuple[int, object]] = OrderedDict()   # key -> (exec, outputs)
        self._last: Hashable | None = None    # the key of the last step that ran without a graph
        self.off: str | None = None           # why graphs were turned off, once they were
        self.captures = self.replays = 0

    def run(self, key: Hashable, forward: Callable[[], object], capture: Callable[[], object] | None = None):
        """forward()'s outputs: replayed from the graph kept for `key`, captured now (through
        `capture`, the same step made by capture_functions, where given) if `key` is that of the
        step before (ran plainly), else run plainly."""
        if self.off is not None:
            return forward()
        kept = self._graphs.get(key)
        if kept is not None:
            self._graphs.move_to_end(key)
            self.driver.launch(kept[0], self.stream)
            self.replays += 1
            return kept[1]
        if key != self._last:
            self._last = key
            return forward()
        try:
            graph_exec, outputs = self._capture(capture or forward)
        except Exception as e:            # noqa: BLE001 - any failure: the step runs as before, graphs off
            self.off = f"capture failed: {e}"
            _log.warning("step graphs off, decode steps run as before: %s", self.off)
            return forward()
        self._last = None
        self._graphs[key] = (graph_exec, outputs)
        while len(self._graphs) > self.kept:
            self.driver.drop_exec(self._graphs.popitem(last=False)[1][0])
        self.driver.launch(graph_exec, self.stream)
        self.captures += 1
        return outputs

    def _capture(self, forward: Callable[[], object]) -> tuple[int, object]:
        """forward()'s launches captured on the graph stream (TVM's current stream meanwhile), not run."""
        self.device.set_raw_stream(self.stream)
        graph = 0
        try:
            self.driver.begin(self.stream)
            try:
                outputs = forward()
            finally:
                graph = self.driver.end(self.stream)      # raises if the capture was invalidated
            return self.driver.instantiate(graph), outputs
        finally:
            self.device.set_raw_stream(0)
            if graph:
                self.driver.drop_graph(graph)

    def clear(self) -> None:
        for graph_exec, _ in self._graphs.values():
            self.driver.drop_exec(graph_exec)
        self._graphs.clear()
        self._last = None

    def close(self) -> None:
        """The graphs and their stream freed, once the device has finished them."""
        self.driver.wait(self.stream)
        self.clear()
        self.driver.drop_stream(self.stream)

    def stats(self) -> dict:
        return {"captures": self.captures, "replays": self.replays, "kept": len(self._graphs), "off": self.off}
