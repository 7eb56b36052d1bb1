"""Artifacts that check themselves: `kiln compile --check` and `kiln check` run an artifact on its golden
prompts (transformers' float32 top-k logits stored at compile time) and fail, in one line, when it
disagrees: a build with a wrong RoPE theta fed the right model's golden file, a corrupted golden.npz."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.runtime.contract import CONFIG_NAME, GOLDEN_NAME, read_golden, sha256_file
from tiny_models import write_tiny

pytestmark = pytest.mark.e2e


def kiln_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "kiln.cli", *args], capture_output=True, text=True,
                          timeout=300)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in proc.stderr
    return [line for line in proc.stderr.strip().splitlines() if line.startswith("error")]


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict[str, tuple[Path, Path, subprocess.CompletedProcess]]:
    """family -> (model dir, q0f32 artifact, the `kiln compile --check` run that wrote it); both compile at once."""
    root = tmp_path_factory.mktemp("check")
    runs = {}
    for family in ("Llama", "Qwen2"):
        model = write_tiny(family, root / family, tied=family == "Llama")
        args = [sys.executable, "-P", "-m", "kiln.cli", "compile", str(model), "--quant", "q0f32",
                "-o", str(root / f"{family}-art"), "--check"]
        runs[family] = model, root / f"{family}-art", args, subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = {}
    for family, (model, art, args, proc) in runs.items():
        stdout, stderr = proc.communicate(timeout=300)
        out[family] = model, art, subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)
    return out


@pytest.mark.parametrize("family", ["Llama", "Qwen2"])
def test_compile_check_passes(checked, family):
    _, art, proc = checked[family]
    assert proc.returncode == 0, proc.stderr
    assert "transformers" in proc.stdout and proc.stdout.rstrip().endswith("ok"), proc.stdout
    golden = json.loads((art / CONFIG_NAME).read_text())["golden"]
    assert golden["file"] == GOLDEN_NAME and golden["prompts"] == 3 and golden["top_k"] == 32
    prompts = read_golden(art)
    assert [len(p.ids) for p in prompts] == golden["tokens"] and all(4 <= len(p.ids) <= 16 for p in prompts)


def test_kiln_check_prints_the_table(checked):
    proc = kiln_cli("check", str(checked["Llama"][1]))
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["0", "1", "2"]
    for _, tokens, err, top1, kl in rows:
        assert float(err) < 1e-3 and top1 == "100%" and float(kl) < 1e-6


def test_wrong_rope_theta_fails_against_the_right_golden(checked, tmp_path):
    """A build whose files all match their hashes but compute the wrong function: RoPE theta 10x off."""
    model, art, _ = checked["Llama"]
    wrong = tmp_path / "wrong-model"
    shutil.copytree(model, wrong)
    cfg = json.loads((wrong / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_theta"] == 10000.0
    cfg["rope_parameters"]["rope_theta"] = 1000.0
    (wrong / "config.json").write_text(json.dumps(cfg))
    bad = kiln.compile(str(wrong), quant="q0f32", output=tmp_path / "bad", golden=False)

    with pytest.raises(kiln.ArtifactError, match="nothing to check against"):   # golden=False (--no-golden)
        kiln.check(bad)

    shutil.copy(art / GOLDEN_NAME, bad / GOLDEN_NAME)          # the right model's golden, hashes consistent
    config = json.loads((bad / CONFIG_NAME).read_text())
    config["files"][GOLDEN_NAME] = sha256_file(bad / GOLDEN_NAME)
    config["golden"] = json.loads((art / CONFIG_NAME).read_text())["golden"]
    (bad / CONFIG_NAME).write_text(json.dumps(config))
    kiln.Artifact.load(bad)                                    # every hash matches
    proc = kiln_cli("check", str(bad))
    assert proc.returncode == 1
    lines = error_lines(proc)
    assert len(lines) == 1 and "disagrees with its golden logits" in lines[0] and "max logit error" in lines[0]
    assert "FAILED" in proc.stdout


def test_corrupted_golden_is_refused(checked, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(checked["Qwen2"][1], art)
    data = bytearray((art / GOLDEN_NAME).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (art / GOLDEN_NAME).write_bytes(bytes(data))
    with pytest.raises(kiln.ArtifactError, match=f"{GOLDEN_NAME} does not match its hash"):
        kiln.check(art)


def test_check_with_no_golden_is_a_usage_error(checked):
    proc = kiln_cli("compile", str(checked["Llama"][0]), "--check", "--no-golden")
    assert proc.returncode != 0 and "--no-golden" in error_lines(proc)[0]


def test_golden_matches_transformers(checked):
    """The stored values are transformers' logits at the stored ids (every position, top-k, best first)."""
    import torch
    import transformers
    model, art, _ = checked["Qwen2"]
    ref = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    for p in read_golden(art):
        with torch.no_grad():
            logits = ref(torch.tensor([p.ids.tolist()])).logits[0].numpy()
        np.testing.assert_allclose(np.take_along_axis(logits, p.top_ids, -1), p.top_values, atol=1e-5)
        np.testing.assert_array_equal(p.top_ids[:, 0], logits.argmax(-1))
        assert np.all(np.diff(p.top_values, axis=-1) <= 0)


def test_without_transformers_the_reference_is_kilns_own_float32_build(checked, tmp_path, monkeypatch):
    """A source transformers cannot read gets its golden from kiln's q0f32 build for this machine."""
    import kiln.compiler.build as build
    monkeypatch.setattr(build, "transformers_reference", lambda source: (None, "transformers cannot load it"))
    model, right, _ = checked["Qwen2"]
    art = kiln.compile(str(model), quant="q0f16", output=tmp_path / "art")
    golden = json.loads((art / CONFIG_NAME).read_text())["golden"]
    assert golden["reference"] == "kiln q0f32 cpu (transformers cannot load it)"
    for ours, theirs in zip(read_golden(art), read_golden(right)):     # the same numbers as transformers'
        np.testing.assert_array_equal(ours.ids, theirs.ids)
        np.testing.assert_allclose(ours.top_values, theirs.top_values, atol=1e-4)
    report = kiln.check(art)
    assert report.ok and report.scheme == "q0f16", report.table()
