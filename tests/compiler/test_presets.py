"""The --target presets: complete TVM targets (the `kiln targets` table: tests/e2e), the one-line answers for
vulkan and for a missing host tool, and `--target a,b,...` writing an artifact per preset beside
kiln-manifest.json while going on past a preset that fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import kiln
from kiln.compiler.multi import MANIFEST_NAME
from kiln.runtime.contract import sha256_file
from kiln.targets import UNSUPPORTED, ToolchainError, get_profile, names

pytestmark = pytest.mark.compiler

GPU_LIMITS = ("max_num_threads", "thread_warp_size", "max_shared_memory_per_block")


def _kiln(*args, env=None):
    return subprocess.run([sys.executable, "-P", "-m", "kiln.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_every_preset_names_its_limits_and_host_and_tvm_guesses_nothing(capfd):
    for name in names():
        p = get_profile(name)
        p.tvm_target()
        if p.device != "cpu":
            assert all(k in p.target for k in GPU_LIMITS), name
            assert "host" in p.target, name
        elif name != "cpu":                                     # cross builds name the machine they are for
            assert {"mtriple", "mcpu", "mattr"} <= set(p.target), name
    # TVM logs a warning for each limit it has to guess; ROCm's runtime version it probes regardless.
    guesses = [line for line in capfd.readouterr().err.splitlines()
               if "Warning" in line and "Unable to detect ROCm version" not in line]
    assert not guesses


def test_vulkan_answers_in_one_line_and_writes_nothing(tmp_path):
    done = _kiln("compile", str(tmp_path / "any-model"), "--target", "vulkan", "-o", str(tmp_path / "out"))
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1
    assert "SPIR-V" in done.stderr and "webgpu" in done.stderr and "android-opencl" in done.stderr
    assert not (tmp_path / "out").exists()


def test_missing_linker_is_named_before_the_model_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))                  # no ld64.lld, no ld.lld
    for target, tool in (("metal", "ld64.lld"), ("aarch64", "ld.lld")):
        with pytest.raises(ToolchainError, match=f"--target {target} links its library with {tool}"):
            kiln.compile(str(tmp_path / "not-read"), target=target, output=tmp_path / target)


@pytest.fixture(scope="module")
def many(tiny_dirs, tmp_path_factory):
    """`kiln compile --target vulkan,x86-64-v3`: (the output folder, the finished process)."""
    out = tmp_path_factory.mktemp("many") / "out"
    return out, _kiln("compile", str(tiny_dirs["tied"]), "--target", "vulkan,x86-64-v3", "--quant", "q0f32",
                      "-o", str(out))


def test_compile_several_targets_writes_a_manifest_and_goes_on_past_failures(many):
    out, done = many
    assert done.returncode == 1, done.stderr                   # vulkan failed, the others were written
    assert "1 of 2 targets failed: vulkan" in done.stderr
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert [a["target"] for a in manifest["artifacts"]] == ["x86-64-v3"]
    assert manifest["failures"] == [{"target": "vulkan", "error": UNSUPPORTED["vulkan"]}]
    for a in manifest["artifacts"]:
        art = out / a["path"]
        assert {name: sha256_file(art / name) for name in a["sha256"]} == a["sha256"]
        assert a["lib"] in a["sha256"] and kiln.Artifact.load(art).config.target.name == a["target"]
    assert sorted(os.listdir(out)) == sorted(["x86-64-v3", MANIFEST_NAME])


def test_portable_x86_artifact_matches_this_machines(many, tiny_artifacts):
    """x86-64-v3 code runs here and computes what the host build computes (same greedy tokens)."""
    if not get_profile("x86-64-v3").runnable_here:
        pytest.skip("this machine is not x86-64-v3")
    prompt, params = [1, 5, 9, 3], kiln.SamplingParams(max_tokens=8, temperature=0.0)
    portable = kiln.Engine(many[0] / "x86-64-v3").generate(prompt, params).token_ids
    host = kiln.Engine(tiny_artifacts["tied"]).generate(prompt, params).token_ids
    assert portable == host and len(portable) == 8


def test_q8_is_refused_where_kernels_cannot_read_8_bit_integers(tiny_dirs, tmp_path):
    """WGSL has no 8-bit types: webgpu keeps every weight 4-bit (its WGSL is validated in
    test_webgpu_kernels.py) and refuses --quant q8f32 in one line."""
    assert get_profile("webgpu").eight_bit_storage is False
    with pytest.raises(ValueError, match="--quant q8f32 stores 8-bit integers"):
        kiln.compile(str(tiny_dirs["tied"]), target="webgpu", quant="q8f32", output=tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_an_error_inside_a_preset_compile_is_recorded_in_one_line(tmp_path):
    from kiln.compiler import CompileOptions
    from kiln.compiler.multi import compile_many
    result = compile_many(CompileOptions(model=str(tmp_path / "no-such-model")), "cpu,vulkan", tmp_path / "out")
    assert [o.target for o in result.failed] == ["cpu", "vulkan"]
    assert "no-such-model" in result.failed[0].error and "\n" not in result.failed[0].error
    manifest = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert manifest["artifacts"] == [] and [f["target"] for f in manifest["failures"]] == ["cpu", "vulkan"]
