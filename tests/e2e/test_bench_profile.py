"""`kiln bench --profile`: a per-kernel breakdown of the prefill and decode step that adds up."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from kiln.runtime.bench import CUDA_GRAPHS, VM_OVERHEAD, kernel_group

pytestmark = pytest.mark.e2e


@pytest.mark.unit
@pytest.mark.parametrize("symbol, group", [
    ("vm.builtin.alloc_tensor", VM_OVERHEAD),
    ("vm.builtin.make_shape", VM_OVERHEAD),
    ("shape_func3", VM_OVERHEAD),
    ("vm.builtin.attention_kv_cache_attention_with_fused_qkv",) * 2,
    ("fused_dequantize_q4_NT_matmul5", "fused_dequantize_q4_NT_matmul5"),
    ("vm.builtin.cuda_graph.run_or_capture", CUDA_GRAPHS),
])
def test_kernel_group(symbol, group):
    assert kernel_group(symbol) == group


@pytest.fixture(scope="module")
def profile_json(tiny_artifacts) -> dict:
    proc = subprocess.run([sys.executable, "-m", "kiln.cli", "bench", str(tiny_artifacts["tied"]), "--prompt-len", "16",
                           "--gen-len", "4", "--runs", "1", "--profile", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_bench_keys_still_there(profile_json):
    assert profile_json["prompt_len"] == 16 and profile_json["gen_len"] == 4 and profile_json["tpot_ms"] > 0
    assert profile_json["profile"]["prompt_len"] == 16 and profile_json["profile"]["gen_len"] == 4


@pytest.mark.parametrize("step", ["prefill", "decode"])
def test_profile_adds_up(profile_json, step):
    p = profile_json["profile"][step]
    names = [k["name"] for k in p["kernels"]]
    assert any("matmul" in n for n in names), names
    assert any(n.startswith("vm.builtin.attention_kv_cache_") for n in names), names
    assert VM_OVERHEAD in names and not any(n.startswith("vm.builtin.") and "attention" not in n for n in names)
    for k in p["kernels"]:
        if "matmul" in k["name"] or "attention" in k["name"]:
            assert k["ms_per_step"] > 0 and k["ms_per_call"] > 0 and k["calls_per_step"] >= 1, k
        assert k["ms_per_step"] == pytest.approx(k["ms_per_call"] * k["calls_per_step"], rel=1e-6)
    kernel_sum = sum(k["ms_per_step"] for k in p["kernels"])
    assert kernel_sum == pytest.approx(p["kernel_sum_ms"], rel=1e-6)
    assert 0 < kernel_sum <= p["wall_ms"] * 1.01 + 0.05            # timed inside the step's wall time
    assert p["wall_ms_uninstrumented"] > 0
    assert sum(k["pct"] for k in p["kernels"]) + p["outside_pct"] == pytest.approx(100, abs=0.01)
    assert p["calls_per_step"] == pytest.approx(sum(k["calls_per_step"] for k in p["kernels"]))


def test_bench_sizes_the_kv_cache_for_its_shape_and_the_runner_refuses_what_does_not_fit(tiny_artifacts):
    """Batch x (prompt + gen) beyond the default capacity (one full context plus a page per sequence)
    ran into TVM's "The KV cache is full" mid-run; the CLI now sizes the cache for the shape, and a
    runner given too little is refused before anything runs."""
    from kiln.runtime import Artifact
    from kiln.runtime.bench import bench
    from kiln.runtime.model_runner import ModelRunner
    art = tiny_artifacts["tied"]
    context = Artifact.load(art).context_window
    shape = ["--batch", "8", "--prompt-len", str(context // 2), "--gen-len", "8", "--runs", "1", "--json"]
    proc = subprocess.run([sys.executable, "-m", "kiln.cli", "bench", str(art), *shape],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["batch"] == 8
    runner = ModelRunner(Artifact.load(art), max_num_seqs=8)          # the default capacity
    with pytest.raises(ValueError, match=r"needs \d+ tokens of KV cache; this runner holds \d+"):
        bench(runner, prompt_len=context // 2, gen_len=8, batch=8, runs=1)


def test_sampled_decode_steps_draw_on_the_device(tiny_artifacts, monkeypatch):
    """`kiln bench --temperature`: every decode step draws through sample_tokens with the row's
    parameters and a fresh uniform, and the JSON says how the steps drew (greedy: no key value)."""
    from kiln.runtime import Artifact
    from kiln.runtime.bench import Sampling, bench
    from kiln.runtime.model_runner import ModelRunner
    runner = ModelRunner(Artifact.load(tiny_artifacts["tied"]))
    drawn = []
    original = ModelRunner.decode_sampled

    def spy(self, seq_ids, tokens, params):
        drawn.append(params.copy())
        return original(self, seq_ids, tokens, params)

    monkeypatch.setattr(ModelRunner, "decode_sampled", spy)
    sampling = Sampling(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05)
    r = bench(runner, prompt_len=8, gen_len=3, batch=2, runs=1, sampling=sampling)
    assert len(drawn) == 2 * 3                                      # warm-up and one timed run, 3 steps each
    for params in drawn:
        assert params.shape == (2, 5) and params.dtype == np.float32
        np.testing.assert_array_equal(params[:, :4], np.float32([[0.7, 5, 0.9, 0.05]] * 2))
        assert ((0 <= params[:, 4]) & (params[:, 4] < 1)).all()
    assert len({tuple(p[:, 4]) for p in drawn}) == len(drawn)      # a fresh uniform each step
    assert r.sampling == sampling.as_dict() and r.decode_tok_s > 0
    assert bench(runner, prompt_len=8, gen_len=2, batch=1, runs=1).sampling is None    # greedy


@pytest.mark.unit
@pytest.mark.parametrize("kw, message", [
    (dict(top_p=0.9), "give a temperature above 0"),
    (dict(temperature=-1.0), "invalid sampling"),
    (dict(temperature=1.0, top_p=0.0), "invalid sampling"),
    (dict(temperature=1.0, min_p=1.0), "invalid sampling"),
])
def test_sampling_refuses_what_it_cannot_draw(kw, message):
    from kiln.runtime.bench import Sampling
    with pytest.raises(ValueError, match=message):
        Sampling(**kw)


def test_cli_refuses_sampling_knobs_without_a_temperature(tiny_artifacts):
    proc = subprocess.run([sys.executable, "-m", "kiln.cli", "bench", str(tiny_artifacts["tied"]), "--top-k", "5"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "give a temperature above 0" in proc.stderr
