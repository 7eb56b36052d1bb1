"""Memory planned at compile time (compiler/spec.py bound_shapes): every allocation of the entry
functions a server calls has a constant size, so the VM's pooled allocator reuses the same buffers
whatever the prompt length or batch; and on CUDA, decode runs as captured CUDA graphs."""

from __future__ import annotations

import re

import pytest

import kiln

pytestmark = pytest.mark.compiler

BOUNDED = ("embed", "prefill", "decode", "batch_prefill", "batch_hidden", "batch_decode")


def _functions(ir: str) -> dict[str, str]:
    """TVMScript text of each Relax function, by name."""
    parts = re.split(r"\n    @R\.function[^\n]*\n    def ", ir)
    return {p.split("(", 1)[0]: p for p in parts[1:]}


@pytest.fixture(scope="module")
def finalized(tiny_dirs, tmp_path_factory):
    built = {}

    def build(target: str) -> dict[str, str]:
        if target in built:
            return built[target]
        out = tmp_path_factory.mktemp(f"plan-{target}")
        kiln.compile(str(tiny_dirs["tied"]), target=target, quant="q4f32" if target == "cpu" else "q4f16",
                     output=out / "art", dump_ir=out / "ir", golden=False)
        built[target] = _functions((out / "ir" / "4-finalize.py").read_text())
        return built[target]
    return build


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_entry_functions_allocate_only_constant_sizes(finalized, target):
    funcs = finalized(target)
    for name in BOUNDED:
        sizes = re.findall(r"R\.vm\.alloc_storage\(([^,]+),", funcs[name])
        assert sizes, name
        dynamic = [s for s in sizes if not s.startswith("R.shape([")]
        assert not dynamic, f"{name} allocates by run-time shape: {dynamic}"
    # batch_verify's output (logits at every position) is the one size left to the call
    assert any(not s.startswith("R.shape([")
               for s in re.findall(r"R\.vm\.alloc_storage\(([^,]+),", funcs["batch_verify"]))


def test_cuda_decode_runs_as_captured_graphs(finalized):
    funcs = finalized("cuda")
    for name in ("decode", "batch_decode"):
        assert "vm.builtin.cuda_graph.run_or_capture" in funcs[name], name
