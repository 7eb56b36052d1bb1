"""StepGraphs' bookkeeping (runtime/step_graph.py) with a driver that records its calls: when a step is
run plainly, captured or replayed, which graphs are kept, and that a failed capture turns graphs off
and runs the step as before. The graphs themselves run on a GPU (test_cuda_variants.py); the runner's
keys, and the VM a step is captured through (TVM's graph stretches run in place), are checked here
on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
from tvm.script import ir as I, relax as R, tirx as T

from kiln.runtime.step_graph import RUN_OR_CAPTURE, GraphError, StepGraphs, capture_functions

pytestmark = pytest.mark.unit


class Recorder:
    """Stands in for the CUDA driver and TVM's device: every call in order."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple] = []
        self.fail = fail
        self.made = 100

    def _new(self, what: str) -> int:
        self.made += 1
        self.calls.append((what, self.made))
        if self.fail == what:
            raise GraphError(f"{what} failed")
        return self.made

    def stream(self) -> int:
        return self._new("stream")

    def begin(self, stream: int) -> None:
        self.calls.append(("begin", stream))

    def end(self, stream: int) -> int:
        return self._new("end")

    def instantiate(self, graph: int) -> int:
        return self._new("instantiate")

    def launch(self, graph_exec: int, stream: int) -> None:
        self.calls.append(("launch", graph_exec))

    def drop_graph(self, graph: int) -> None:
        self.calls.append(("drop_graph", graph))

    def drop_exec(self, graph_exec: int) -> None:
        self.calls.append(("drop_exec", graph_exec))

    def set_raw_stream(self, stream: int) -> None:
        self.calls.append(("set_stream", stream))

    def drop_stream(self, stream: int) -> None:
        self.calls.append(("drop_stream", stream))

    def wait(self, stream: int) -> None:
        self.calls.append(("wait", stream))


def _graphs(fail=None, kept=8):
    rec = Recorder(fail)
    return StepGraphs(rec, driver=rec, kept=kept), rec


def test_a_key_runs_plainly_then_is_captured_then_replayed():
    graphs, rec = _graphs()
    ran = []
    forward = lambda: ran.append(1) or ("logits", len(ran))      # noqa: E731
    assert graphs.run(("greedy", 1, 9), forward) == ("logits", 1)
    assert rec.calls == [("stream", 101)] and len(ran) == 1      # plainly: no capture the first time
    captured = graphs.run(("greedy", 1, 9), forward)
    assert captured == ("logits", 2)
    assert rec.calls[1:] == [("set_stream", 101), ("begin", 101), ("end", 102), ("instantiate", 103),
                             ("set_stream", 0), ("drop_graph", 102), ("launch", 103)]
    del rec.calls[:]
    assert graphs.run(("greedy", 1, 9), forward) is captured     # replayed: the captured outputs
    assert rec.calls == [("launch", 103)] and len(ran) == 2
    assert graphs.stats() == {"captures": 1, "replays": 1, "kept": 1, "off": None}


def test_a_key_that_changes_every_step_is_never_captured():
    graphs, rec = _graphs()
    for pages in range(20):
        graphs.run(("greedy", 16, pages), lambda: None)
    assert [c for c in rec.calls if c[0] == "begin"] == [] and graphs.stats()["captures"] == 0


def test_the_least_recently_used_graphs_are_dropped():
    graphs, rec = _graphs(kept=2)
    for pages in (1, 2, 3):
        for _ in range(2):
            graphs.run(("greedy", 1, pages), lambda: None)
    dropped = [c[1] for c in rec.calls if c[0] == "drop_exec"]
    assert len(dropped) == 1 and graphs.stats()["kept"] == 2
    graphs.close()
    assert rec.calls[-4:] == [("wait", 101), ("drop_exec", dropped[0] + 2), ("drop_exec", dropped[0] + 4),
                              ("drop_stream", 101)]
    assert graphs.stats()["kept"] == 0


@pytest.mark.parametrize("fail", ["end", "instantiate"])
def test_a_failed_capture_turns_graphs_off_and_runs_the_step(fail, caplog):
    graphs, rec = _graphs(fail=fail)
    ran = []
    graphs.run("k", lambda: ran.append(1))
    graphs.run("k", lambda: ran.append(1))          # the capture fails: the step is run plainly
    assert len(ran) == 3 and graphs.off and f"{fail} failed" in graphs.off
    assert f"step graphs off, decode steps run as before: capture failed: {fail} failed" in caplog.text
    assert ("set_stream", 0) == [c for c in rec.calls if c[0] == "set_stream"][-1]
    graphs.run("k", lambda: ran.append(1))
    assert len(ran) == 4 and not [c for c in rec.calls if c[0] == "launch"]


def test_an_error_in_the_step_itself_still_reaches_the_caller():
    graphs, rec = _graphs()

    def forward():
        raise ValueError("token id out of range")
    with pytest.raises(ValueError, match="out of range"):
        graphs.run("k", forward)
    with pytest.raises(ValueError, match="out of range"):
        graphs.run("k", forward)                   # captured, fails, run plainly: the same error
    assert rec.calls[-2:] == [("set_stream", 0), ("drop_graph", 102)]      # the stream restored, the graph freed


@pytest.mark.numerics
def test_the_runners_keys(tiny_artifacts):
    """A decode step's key is (pick, batch, the pages its sequences will hold); a sequence in a fork
    never takes a graph, and stops counting as one once removed. Graphs are CUDA's alone."""
    from kiln.runtime.artifact import Artifact
    from kiln.runtime.model_runner import ModelRunner
    artifact = Artifact.load(tiny_artifacts["tied"])
    with pytest.raises(ValueError, match="CUDA graphs, and this artifact runs on cpu"):
        ModelRunner(artifact, max_num_seqs=4, step_graphs=True)
    runner = ModelRunner(artifact, max_num_seqs=4)
    with pytest.raises(ValueError, match="CUDA graphs, and this artifact runs on cpu"):
        runner.start_step_graphs()
    graphs, _ = _graphs()
    runner.graphs = graphs
    page = runner.page_size
    for s, n in ((0, page - 1), (1, page), (2, 3)):
        runner.add_sequence(s)
        runner.prefill([s], [list(range(3, 3 + n))])
    assert runner._graph_key("greedy", [0]) == ("greedy", 1, 1)          # the token fills the first page
    assert runner._graph_key("greedy", [1]) == ("greedy", 1, 2)          # it opens a second
    assert runner._graph_key("sample", [0, 1, 2]) == ("sample", 3, 4)
    runner.fork_sequence(2, 3)
    assert runner._graph_key("greedy", [0, 3]) is None and runner._graph_key("greedy", [2]) is None
    runner.remove_sequence(2)
    runner.remove_sequence(3)
    runner.add_sequence(2)
    runner.prefill([2], [[5, 6]])
    assert runner._graph_key("greedy", [2]) == ("greedy", 1, 1)


@I.ir_module
class Stretched:
    """What RewriteCUDAGraph leaves in a decode entry, in little: a stretch of kernels handed to TVM's
    graph builtin as a closure over its arguments."""

    @R.function(pure=False)
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        cls = Stretched
        out = R.call_builtin_with_ctx(RUN_OR_CAPTURE, (cls.stretch, (x,), R.prim_value(0)),
                                      ty_args=(R.Tuple(R.Tensor((4,), "float32")),))
        return out[0]

    @R.function
    def stretch(x: R.Tensor((4,), "float32")) -> R.Tuple(R.Tensor((4,), "float32")):
        cls = Stretched
        y = R.call_tir(cls.add_one, (x,), out_ty=R.Tensor((4,), "float32"))
        return (y,)

    @T.prim_func
    def add_one(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i in range(4):
            b[i] = a[i] + T.float32(1)


def test_a_step_is_captured_through_a_vm_that_runs_tvm_graph_stretches_itself():
    """capture_functions' VM runs a stretch's kernels itself; TVM's builtin (a stand-in here: a CPU
    machine has no CUDA runtime) stays what every other VM, made before or after, calls."""
    import gc

    import tvm
    import tvm_ffi
    from tvm import relax
    from tvm.runtime.vm import VirtualMachine
    ex = relax.build(Stretched, target=tvm.target.Target({"kind": "llvm"}))
    x = tvm.runtime.tensor(np.arange(4, dtype="float32"))
    invoke, tvms = tvm_ffi.get_global_func("vm.builtin.invoke_closure"), []

    def tvm_graphs(vm, func, args, index, *shape):
        tvms.append(index)
        return invoke(vm, func, *args)

    tvm_ffi.register_global_func(RUN_OR_CAPTURE, tvm_graphs)
    try:
        standing = tvm_ffi.get_global_func(RUN_OR_CAPTURE)
        before = VirtualMachine(ex, tvm.cpu())
        captured = capture_functions(ex, tvm.cpu(), ["main"])
        assert tvm_ffi.get_global_func(RUN_OR_CAPTURE).same_as(standing)
        gc.collect()                                         # its functions keep their VM
        np.testing.assert_array_equal(captured["main"](x).numpy(), [1, 2, 3, 4])
        assert tvms == []                                    # the stretch ran without TVM's builtin
        for vm in (before, VirtualMachine(ex, tvm.cpu())):
            np.testing.assert_array_equal(vm["main"](x).numpy(), [1, 2, 3, 4])
        assert tvms == [0, 0]
    finally:
        tvm_ffi.remove_global_func(RUN_OR_CAPTURE)
    capture_functions(ex, tvm.cpu(), ["main"])               # where TVM has none, none is left behind
    assert tvm_ffi.get_global_func(RUN_OR_CAPTURE, allow_missing=True) is None
