"""The artifact contract (runtime/contract.py): the config record validates, round-trips, and
refuses what the runtime cannot use; parameter shards read back what was written."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from kiln.runtime import contract as c

pytestmark = pytest.mark.unit


def _config(**changes) -> c.ArtifactConfig:
    base = c.ArtifactConfig(
        model=c.ModelInfo("m", "llama", {"hidden_size": 8}, c.SourceInfo("hf", "ab" * 32, "/models/m")),
        quantization={"name": "q0f32"}, target=c.TargetInfo("cpu", "cpu", {"kind": "llvm"}, "lib.so"),
        entry_functions=c.ENTRY_FUNCTIONS, params=("w",), vocab_size=16, hidden_size=8, context_window_size=64,
        prefill_chunk_size=32, max_batch_size=4,
        kv_cache=c.KVCacheLayout(16, 2, 1, 4, "float32", layer_kinds=("sliding", "full"), sliding_window=32))
    return dataclasses.replace(base, **changes)


def _write_artifact(root, config: c.ArtifactConfig) -> None:
    root.mkdir(parents=True, exist_ok=True)
    writer = c.ParamWriter(root / c.PARAMS_DIR)
    writer.add("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.close()
    (root / "lib.so").write_bytes(b"\x7fELF stand-in")
    c.write_config(root, config)


def test_round_trip_through_the_file(tmp_path):
    _write_artifact(tmp_path / "a", _config())
    back = c.read_config(tmp_path / "a")
    assert back == dataclasses.replace(_config(), files=back.files)
    assert set(back.files) == {"lib.so", "params/shard-000.bin", "params/tensor-cache.json"}
    c.verify_files(tmp_path / "a", back)
    np.testing.assert_array_equal(next(c.iter_params(tmp_path / "a", ("w",))), np.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.pop("vocab_size"), "vocab_size"),
    (lambda d: d.update(format_version=0), "artifact format 0, this kiln reads 1"),
    (lambda d: d["kv_cache"].update(layer_kinds=["full", "local"]), "known kinds: full, sliding"),
    (lambda d: d["kv_cache"].update(layer_kinds=["full"]), "lists 1 layers, the model has 2"),
    (lambda d: d["kv_cache"].update(sliding_window=None), "no sliding_window size"),
    (lambda d: d.update(prefill_chunk_size=128), "exceeds context_window_size"),
    (lambda d: d.update(entry_functions=["embed"]), "lacks entry functions"),
    (lambda d: d["target"].pop("device"), "does not match the artifact schema"),
    (lambda d: d["kv_cache"].update(layer_kv=[[1, 4]]), "layer_kv lists 1 layers, the model has 2"),
    (lambda d: d["kv_cache"].update(layer_kv=[[1, 4], [1, 8]]), "needs the KV cache kiln owns"),
    (lambda d: d["kv_cache"].update(owner="kiln", tables=["slots"], layer_sources=[1, 1]),
     "itself or an earlier layer of its shape"),
    (lambda d: d["kv_cache"].update(owner="kiln", tables=["slots"], layer_kv=[[1, 4], [1, 8]], layer_sources=[0, 0]),
     "itself or an earlier layer of its shape"),
    (lambda d: d["kv_cache"].update(owner="kiln", tables=["slots"], layer_states=[[[6, 3]], []]),
     r"tables lack \('state_slots',\)"),
    (lambda d: d["kv_cache"].update(owner="kiln", tables=["slots", "state_slots"], layer_states=[[[6, 0]], []]),
     "a shape of positive sizes"),
    (lambda d: d["kv_cache"].update(layer_states=[[[6, 3]], []]), "needs the KV cache kiln owns"),
])
def test_bad_configs_are_refused_by_name(tmp_path, edit, message):
    _write_artifact(tmp_path, _config())
    raw = json.loads((tmp_path / c.CONFIG_NAME).read_text())
    edit(raw)
    (tmp_path / c.CONFIG_NAME).write_text(json.dumps(raw))
    with pytest.raises(c.ArtifactError, match=message) as err:
        c.read_config(tmp_path)
    assert "recompile" in str(err.value)


def test_per_layer_kv_shapes_count_the_layers_that_hold_pages():
    """Gemma 4's cache: a global layer with its own head size, a later layer reading an earlier one's pages."""
    layout = c.KVCacheLayout(16, 3, 2, 4, "float16", owner="kiln", tables=("slots",),
                             layer_kv=((2, 4), (1, 8), (2, 4)), layer_sources=(0, 1, 0))
    assert layout.owners == [0, 1] and layout.kv_of(1) == (1, 8)
    assert layout.bytes_per_token == 2 * 2 * (2 * 4 + 1 * 8)
    assert c.KVCacheLayout(16, 3, 2, 4, "float16").bytes_per_token == 2 * 2 * 3 * 2 * 4


def test_recurrent_layers_hold_states_not_pages():
    """Qwen3.5's cache: DeltaNet layers keep state tensors a sequence (no pages, no bytes a token), which can give
    no tokens back; a TVM cache with a sliding window cannot either, the cache kiln owns with one can."""
    states = (((64, 3), (4, 8, 8)), ((64, 3), (4, 8, 8)), ())
    layout = c.KVCacheLayout(16, 3, 2, 4, "float16", owner="kiln", tables=(*c.OWNED_KV_TABLES, "state_slots"),
                             layer_states=states)
    assert layout.owners == [2] and layout.states == [(64, 3), (4, 8, 8)] * 2
    assert layout.bytes_per_token == 2 * 2 * 2 * 4
    assert "recurrent layers" in layout.rewind_problem()
    sliding = dict(layer_kinds=("sliding", "full", "sliding"), sliding_window=8)
    assert "sliding-window" in c.KVCacheLayout(16, 3, 2, 4, "float16", **sliding).rewind_problem()
    assert c.KVCacheLayout(16, 3, 2, 4, "float16", owner="kiln", tables=("slots",), **sliding).rewind_problem() is None


def test_tampered_or_missing_files_fail_verification(tmp_path):
    _write_artifact(tmp_path, _config())
    config = c.read_config(tmp_path)
    (tmp_path / "lib.so").write_bytes(b"changed")
    with pytest.raises(c.ArtifactError, match="lib.so does not match its hash"):
        c.verify_files(tmp_path, config)
    (tmp_path / "lib.so").unlink()
    with pytest.raises(c.ArtifactError, match="missing lib.so"):
        c.verify_files(tmp_path, config)


def test_truncated_shard_is_refused(tmp_path):
    _write_artifact(tmp_path, _config())
    shard = tmp_path / c.PARAMS_DIR / "shard-000.bin"
    shard.write_bytes(shard.read_bytes()[:10])
    with pytest.raises(c.ArtifactError, match="truncated"):
        list(c.iter_params(tmp_path, ("w",)))



def test_an_artifact_needing_the_dot_product_is_refused_where_the_cpu_lacks_it(monkeypatch):
    """runtime/artifact.py check_host: an AArch64 build with --decode-activations int8 carries
    +dotprod; a CPU whose AT_HWCAP lacks asimddp refuses it in one line (not an illegal instruction
    later); where there is no AT_HWCAP to read (macOS) it loads."""
    from types import SimpleNamespace

    from kiln.runtime import artifact
    triple = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+dotprod"]}
    target = SimpleNamespace(name="aarch64", lib="lib.so", tvm_target=triple)
    art = SimpleNamespace(config=SimpleNamespace(target=target))
    monkeypatch.setattr(artifact.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(artifact, "_hwcap", lambda: 0b11)                  # fp and asimd only
    with pytest.raises(c.ArtifactError, match=r"needs the ARMv8.2 dot product \(asimddp\).*--decode-activations int8"):
        artifact.check_host(art)
    monkeypatch.setattr(artifact, "_hwcap", lambda: 0b11 | 1 << 20)
    artifact.check_host(art)
    monkeypatch.setattr(artifact, "_hwcap", lambda: None)
    artifact.check_host(art)
    target.tvm_target["mattr"] = ["+neon"]                                  # an exact build needs nothing
    monkeypatch.setattr(artifact, "_hwcap", lambda: 0b11)
    artifact.check_host(art)


def test_hwcap_reads_this_process_auxv():
    """Linux hands every process its CPU's AT_HWCAP bits (x86's too); elsewhere there are none."""
    import sys

    from kiln.runtime import artifact
    assert (artifact._hwcap() is not None) == sys.platform.startswith("linux")
