"""Memory planned at compile time (compiler/spec.py bound_shapes): every allocation of the entry
functions a server calls has a constant size, so the VM's pooled allocator reuses the same buffers
whatever the prompt length or batch; and on CUDA, decode runs as captured CUDA graphs."""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.compiler

BOUNDED = ("embed", "prefill", "decode", "batch_prefill", "batch_hidden", "batch_decode", "greedy_tokens", "sample_tokens")


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_entry_functions_allocate_only_constant_sizes(dumped_ir, target):
    funcs = dumped_ir(target, "finalize")
    for name in BOUNDED:
        sizes = re.findall(r"R\.vm\.alloc_storage\(([^,]+),", funcs[name])
        assert sizes, name
        dynamic = [s for s in sizes if not s.startswith("R.shape([")]
        assert not dynamic, f"{name} allocates by run-time shape: {dynamic}"
    # batch_verify's output (logits at every position) is the one size left to the call
    assert any(not s.startswith("R.shape([")
               for s in re.findall(r"R\.vm\.alloc_storage\(([^,]+),", funcs["batch_verify"]))


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_artifact_records_the_planned_activation_memory(dumped_ir, target):
    """kiln-config.json's activation_bytes (what the KV cache sizing leaves room for) is every
    constant allocation of the memory-planned module: the alloc_storage sizes in the finalize IR."""
    funcs = dumped_ir(target, "finalize")
    want = sum(int(n) for text in funcs.values()
               for n in re.findall(r"R\.vm\.alloc_storage\(R\.shape\(\[(\d+)\]\)", text))
    config = json.loads((dumped_ir.artifact(target) / "kiln-config.json").read_text())
    assert want > 0 and config["activation_bytes"] == want


def test_cuda_decode_runs_as_captured_graphs(dumped_ir):
    funcs = dumped_ir("cuda", "finalize")
    for name in ("decode", "batch_decode"):
        assert "vm.builtin.cuda_graph.run_or_capture" in funcs[name], name
