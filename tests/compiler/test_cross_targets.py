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


def test_cuda_float16_matmul_schedules_without_tensor_core_crash():
    """dlight's tensor-core path segfaults in TVM 0.27 on f16 NT matmuls with all dims > 64;
    the cuda profile must steer around it (this test would kill the process otherwise)."""
    import tvm
    from tvm.relax.frontend import nn

    from kiln.compiler.pipeline import phases
    from kiln.targets import get_profile

    class Proj(nn.Module):
        def __init__(self):
            self.proj = nn.Linear(256, 512, bias=False, dtype="float16")

        def forward(self, x: nn.Tensor) -> nn.Tensor:
            return self.proj(x)

    profile = get_profile("cuda")
    mod, _ = Proj().export_tvm(spec={"forward": {"x": nn.spec.Tensor([1, "n", 256], "float16")}})
    with profile.tvm_target():
        for _, passes in phases(profile)[:3]:               # graph, legalize, schedule
            mod = tvm.transform.Sequential(passes)(mod)
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert funcs and all(f.attrs and f.attrs.get("tirx.is_scheduled") for f in funcs)
