"""The target seam: compiler/ asks the TargetProfile and names no device; a family added under
targets/ only (ROCm) writes its artifact; the CPU profile's passes sit where the pipeline says;
the compiler writes the KV layout into the contract."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import kiln
from kiln.compiler.pipeline import phases
from kiln.runtime.contract import ENTRY_FUNCTIONS, OPTIONAL_ENTRY_FUNCTIONS, read_config
from kiln.targets import PHASES, ToolchainError, get_profile, names

pytestmark = pytest.mark.compiler

ROOT = Path(__file__).resolve().parents[2]
DEVICE_WORDS = re.compile(r"\b(cpus?|gpus?|cuda|rocm|hip|metal|vulkan|opencl|webgpu|wasm|android|ios|x86(_64)?|"
                          r"aarch64|arm64|llvm|nvptx|amdgpu|avx\w*|neon|sm_\d+|gfx\d+)\b", re.IGNORECASE)


def test_no_module_under_compiler_mentions_a_device():
    """Code, comments and docstrings alike: device knowledge belongs to targets/."""
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
            for p in sorted((ROOT / "compiler").rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if DEVICE_WORDS.search(line)]
    assert not hits, "device names under compiler/:\n" + "\n".join(hits)


def test_compiler_imports_no_private_target_module():
    private = re.compile(r"kiln\.targets\.\w+|from \.\.?targets\.")
    hits = [str(p.relative_to(ROOT)) for p in (ROOT / "compiler").rglob("*.py") if private.search(p.read_text())]
    assert not hits


@pytest.mark.parametrize("name", names())
def test_every_preset_is_a_complete_profile(name):
    profile = get_profile(name)
    profile.tvm_target()                                        # a valid TVM target
    for phase in PHASES:
        assert isinstance(profile.passes(phase), list)
    assert profile.default_quant in kiln.compiler.SCHEMES
    assert profile.lib_name.startswith("lib.")
    assert [n for n, _ in phases(profile)] == list(PHASES)


def test_cpu_passes_land_in_their_phases():
    by_phase = {name: [p.info.name for p in passes] for name, passes in phases(get_profile("cpu"))}
    assert "FastActivations" in by_phase["graph"] and by_phase["graph"][-1] == "DeadCodeElimination"
    assert by_phase["legalize"][-1] == "LowBatchGEMV"
    assert by_phase["schedule"][0] == "UseKilnCPUAttention"
    assert by_phase["lower"][0] == "DispatchLowBatchGEMV"
    cuda = {name: [p.info.name for p in passes] for name, passes in phases(get_profile("cuda"))}
    assert "kiln.RewriteCUDAGraph" in cuda["finalize"] and "FastActivations" not in cuda["graph"]


def test_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="unknown pipeline phase"):
        get_profile("cpu").passes("optimize")


@pytest.mark.parametrize("name,arch,wave", [("rocm-gfx942", "gfx942", 64), ("rocm-gfx1100", "gfx1100", 32)])
def test_rocm_artifact_is_written(name, arch, wave, tiny_dirs, tmp_path):
    profile = get_profile(name)
    try:
        profile.check_toolchain(profile)
    except ToolchainError as e:
        pytest.skip(str(e))
    art = kiln.compile(str(tiny_dirs["tied"]), target=name, quant="q4f16", output=tmp_path / name)
    cfg = json.loads((art / "kiln-config.json").read_text())
    assert cfg["target"]["device"] == "rocm" and cfg["target"]["tvm_target"]["thread_warp_size"] == wave
    assert cfg["quantization"]["name"] == "q4f16"
    lib = (art / "lib.so").read_bytes()
    assert f"amdgcn-amd-amdhsa-hcc-{arch}".encode() in lib      # the linked code object for this GPU
    kiln.Artifact.load(art)                                      # hashes verify


def test_compiled_artifact_records_its_kv_layout(tiny_artifacts):
    config = read_config(tiny_artifacts["tied"])
    assert config.kv_cache.layer_kinds == ("full", "full") and config.kv_cache.sliding_window is None
    assert config.model.arch == "llama" and config.entry_functions == (*ENTRY_FUNCTIONS, *OPTIONAL_ENTRY_FUNCTIONS)
