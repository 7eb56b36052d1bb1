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
    assert (art / lib).stat().st_size > 10_000
    assert set(cfg["files"]) >= {lib, "params/tensor-cache.json", "tokenizer.json"}
    kiln.Artifact.load(art)                                  # hashes verify
