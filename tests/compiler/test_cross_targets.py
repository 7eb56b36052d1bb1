"""Targets built here but run elsewhere: the artifact is written with the target's library format."""

from __future__ import annotations

import json

import pytest

import kiln

pytestmark = pytest.mark.compiler


@pytest.mark.parametrize("target,lib,device", [("cuda", "lib.so", "cuda"), ("cuda-sm90", "lib.so", "cuda"),
                                               ("android", "lib.tar", "cpu")])
def test_cross_target_artifact(target, lib, device, tiny_dirs, tmp_path):
    art = kiln.compile(str(tiny_dirs["tied"]), target=target, quant="q0f16", output=tmp_path / target)
    cfg = json.loads((art / "kiln-config.json").read_text())
    assert cfg["target"]["lib"] == lib and cfg["target"]["device"] == device
    assert cfg["max_batch_size"] == (256 if device == "cuda" else 32)     # server GPUs batch wider
    assert (art / lib).stat().st_size > 10_000
    assert set(cfg["files"]) >= {lib, "params/tensor-cache.json", "tokenizer.json"}
    kiln.Artifact.load(art)                                  # hashes verify


def test_tvm_ffi_serializes_tir():
    """s_tir Tensorize deep-copies its intrinsic through TVM's JSON serializer; apache-tvm-ffi 0.1.15
    segfaults there on any TIR node with a dtype (pyproject pins the one that works). In a child
    process: the failure this guards against kills its process."""
    import subprocess
    import sys

    from kiln.targets.gpu import tensorize_works
    code = ("import tvm; from tvm import tirx; x = tirx.Var('x', 'int32');"
            "e = tvm.ir.load_json(tvm.ir.save_json(x + tirx.IntImm('int32', 3)));"
            "assert e.b.value == 3 and str(e.ty.dtype) == 'int32'; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-500:]
    assert tensorize_works()


def test_cuda_float16_matmuls_use_tensor_cores():
    """A float16 projection over symbolic rows (prefill, large batches) is scheduled on the tensor
    cores (dlight's wmma matmul, float32 accumulators) and builds (for the H100)."""
    from tvm.relax.frontend import nn

    from kiln.compiler.build import build_lib
    from kiln.compiler.passes.accumulate_f32 import AccumulateInFloat32
    from kiln.targets import get_profile

    class Proj(nn.Module):
        def __init__(self):
            self.proj = nn.Linear(256, 512, bias=False, dtype="float16")

        def forward(self, x: nn.Tensor) -> nn.Tensor:
            return self.proj(x)

    for preset in ("cuda-sm90",):
        mod, _ = Proj().export_tvm(spec={"forward": {"x": nn.spec.Tensor([1, "n", 256], "float16")}})
        executable, _ = build_lib(AccumulateInFloat32()(mod), get_profile(preset))
        source = executable.mod.imports[0].imports[0].inspect_source()
        assert "wmma::mma_sync" in source and "wmma::accumulator, 16, 16, 16, float>" in source, preset
