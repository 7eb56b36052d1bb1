"""tools/gpu_checks.py's parts without a GPU: idle_gaps (gpu_timing.py: where a GPU profile's idle
time goes, from kernel start/end times), `all`'s steps (gpu_all.py: what a second call on a warm
machine runs again), and that the script's modules import together."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.unit


TOOLS = Path(__file__).parents[2] / "tools"


def _tool(name: str):
    """tools/<name>.py as its script imports it (its siblings by their names)."""
    sys.path.insert(0, str(TOOLS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(TOOLS))


def test_the_script_loads_with_its_commands(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))          # the script puts tools/ first in it
    spec = importlib.util.spec_from_file_location("gpu_checks_script", TOOLS / "gpu_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.main) and module.run_all is _tool("gpu_all").run_all


def test_idle_time_is_grouped_by_the_kernel_after_the_gap():
    # Two steps: embed, a graph kernel, a 10 us wait, attention (overlapping a copy), then 100 us
    # of host between the steps; spacings of 1 us are launch spacing, not idle.
    step = [("embed", 0, 5), ("fused_matmul", 6, 50), ("batch_decode_paged_kv", 60, 70), ("copy", 65, 72),
            ("greedy", 73, 80)]
    kernels = step + [(name, start + 180, end + 180) for name, start, end in step]
    gaps = _tool("gpu_timing").idle_gaps(kernels, steps=2, min_us=2.0)
    assert gaps["before"][0] == ("embed", 0.05, 0.5)               # 100 us once in 2 steps
    assert gaps["before"][1] == ("batch_decode_paged_kv", 0.01, 1.0)
    assert gaps["idle_ms"] == pytest.approx((100 + 2 * 10) / 2 / 1e3)
    assert gaps["launch_spacing_ms"] == pytest.approx(4 * 1 / 2 / 1e3)
    assert gaps["activities_per_step"] == 5
    assert gaps["covered_ms"] == pytest.approx((5 + 44 + 12 + 7) / 1e3)      # 60-72 once: the copy overlaps


def test_no_kernels_no_idle():
    assert _tool("gpu_timing").idle_gaps([], steps=1) == {"idle_ms": 0.0, "launch_spacing_ms": 0.0, "covered_ms": 0.0,
                                                    "activities_per_step": 0.0, "before": []}


def _all_steps(gpu_all, tmp_path, budget: float = 100.0):
    args = argparse.Namespace(out=str(tmp_path / "out"), work=str(tmp_path / "work"), quick=False)
    for folder in (args.out, args.work):
        Path(folder).mkdir(exist_ok=True)
    return gpu_all._Steps(args, budget)


def _fails():
    raise RuntimeError("a kernel faulted")


# name: (seconds it asks for, what it returns), and whether a second call runs it again
STEPS = {"finished": (0, lambda: {"tok_s": 1.0}, False),
         "raised": (0, _fails, True),
         "out of time": (1e9, lambda: {"tok_s": 2.0}, True),
         "process cut at its limit": (0, lambda: {"process": {"returncode": "timed out"}}, True),
         "a part skipped": (0, lambda: {"base": {"tok_s": 3.0}, "splitk": {"skipped": "out of time"}}, True),
         "process exited 1": (0, lambda: {"process": {"returncode": 1}}, False)}


def _call_all(steps, ran: list) -> None:
    for name, (need_s, fn, _) in STEPS.items():
        steps(name, need_s, lambda name=name, fn=fn: ran.append(name) or fn())


def test_a_second_all_call_runs_only_what_the_first_did_not_finish(tmp_path, monkeypatch):
    import kiln
    gpu_all = _tool("gpu_all")
    monkeypatch.setattr(kiln, "compiler_fingerprint", lambda: "sources-1")
    first, ran = _all_steps(gpu_all, tmp_path), []
    _call_all(first, ran)
    assert ran == [n for n in STEPS if n != "out of time"]
    assert first.result["raised"]["error"] == "RuntimeError: a kernel faulted"
    assert "skipped" in first.result["out of time"]
    assert json.loads((tmp_path / "out" / "all.json").read_text()) == json.loads(json.dumps(first.result))

    second, ran = _all_steps(gpu_all, tmp_path), []
    _call_all(second, ran)
    assert ran == [n for n, (*_, again) in STEPS.items() if again and n != "out of time"]
    assert second.result["finished"] == {"tok_s": 1.0}              # the first call's, in this call's all.json
    assert json.loads((tmp_path / "out" / "all.json").read_text())["finished"] == {"tok_s": 1.0}

    monkeypatch.setattr(kiln, "compiler_fingerprint", lambda: "sources-2")   # kiln edited: all again
    third, ran = _all_steps(gpu_all, tmp_path), []
    _call_all(third, ran)
    assert ran == [n for n in STEPS if n != "out of time"]


def test_a_step_runs_only_with_the_time_it_asks_for(tmp_path, monkeypatch):
    import kiln
    monkeypatch.setattr(kiln, "compiler_fingerprint", lambda: "sources-1")
    steps, ran = _all_steps(_tool("gpu_all"), tmp_path, budget=30), []
    assert "skipped" in steps("long", 60, lambda: ran.append("long"))
    assert steps("short", 10, lambda: ran.append("short") or {"ok": True}) == {"ok": True}
    assert ran == ["short"] and steps.left() <= 30


def test_a_swapped_library_makes_an_artifact_that_loads_and_leaves_the_base_alone(tiny_artifacts, tmp_path):
    from kiln.runtime import Artifact
    from kiln.runtime.contract import read_config
    base = tiny_artifacts["tied"]
    before = {p.name: p.read_bytes() for p in base.rglob("*") if p.is_file() and p.stat().st_size < 2**20}
    config = read_config(base)
    lib = (base / config.target.lib).read_bytes()
    dest = _tool("gpu_builds").swap_library(base, lib + b"\0", {"activation_bytes": 12345}, tmp_path / "swapped")
    art = Artifact.load(dest)                                        # hashes checked: the new library's too
    assert art.config.activation_bytes == 12345
    assert (dest / config.target.lib).read_bytes() == lib + b"\0" and not (dest / config.target.lib).is_symlink()
    params = [p for p in dest.rglob("*") if p.is_file() and p.name not in (config.target.lib, "kiln-config.json")]
    assert params and all(p.is_symlink() for p in params)           # the weights are base's, not copies
    assert {n: b for n, b in ((p.name, p.read_bytes()) for p in base.rglob("*") if p.name in before)} == before


def test_the_lever_table_puts_the_fastest_first_and_says_what_is_missing():
    gpu_all = _tool("gpu_all")
    row = lambda pct, graphs=None, diff=0.0: {                        # noqa: E731
        "batch 1": {"decode_tok_s": pct * 8, "pct_of_floor": pct}, "vs base": {"max_diff": diff},
        **({"batch 1 step graphs": {"decode_tok_s": graphs * 8, "pct_of_floor": graphs}} if graphs else {})}
    result = {"8b batch 1 base": row(40.0, 45.0), "8b batch 1 unroll4": row(44.0, diff=0.01),
              "8b batch 1 pdl": {"skipped": "10 s left, it needs about 25"},
              "8b batch 1 warps16": {"process": {"returncode": 1, "log": ["CUDA error"]}}}
    table = gpu_all.lever_table(result)
    assert list(table)[:2] == ["base", "unroll4"]                      # 45 with step graphs beats 44
    assert table["unroll4"] == {"tok_s": 352.0, "pct": 44.0, "graphs_tok_s": None, "graphs_pct": None,
                              "max_diff": 0.01}
    assert table["pdl"] == {"skipped": "10 s left, it needs about 25"}
    assert table["warps16"]["missing"]["returncode"] == 1
    assert set(table) == set(_tool("gpu_builds").LEVERS_8B)
    assert gpu_all._unfinished(table)                                  # a later call makes it again
    measured = {f"8b batch 1 {lever}": row(40.0) for lever in table}
    measured["8b batch 1 warps16"] = result["8b batch 1 warps16"]      # failed: missing, not to be run again
    assert not gpu_all._unfinished(gpu_all.lever_table(measured))


def test_a_combined_lever_runs_only_where_each_part_beat_base():
    gpu_all, builds = _tool("gpu_all"), _tool("gpu_builds")
    assert set(builds.LEVER_PARTS) <= set(builds.LEVERS_8B) and all(
        builds.LEVERS_8B.index(part) < builds.LEVERS_8B.index(combo)        # the parts measured first
        for combo, parts in builds.LEVER_PARTS.items() for part in parts)
    row = lambda tok_s, graphs=None: {"batch 1": {"decode_tok_s": tok_s, "pct_of_floor": tok_s / 8},  # noqa: E731
                                      **({"batch 1 step graphs": {"decode_tok_s": graphs}} if graphs else {})}
    result = {"8b batch 1 base": row(350.0, 370.0), "8b batch 1 pipe": row(360.0, 380.0),
              "8b batch 1 fused": row(340.0, 365.0)}
    assert gpu_all.parts_lost(result, "pdlfused")["not run"].startswith("fused (365.0 tok/s) did not beat base")
    assert "not run" in gpu_all.parts_lost(result, "pipefused")            # pipe won, fused did not
    assert gpu_all.parts_lost(result, "glu") is None                      # no combination: measured
    result["8b batch 1 fused"] = row(390.0)                                 # beats 370 without step graphs
    assert gpu_all.parts_lost(result, "pipefused") is None
    result["8b batch 1 fused"] = {"skipped": "10 s left, it needs about 100"}
    assert "skipped" in gpu_all.parts_lost(result, "pdlfused")             # a later call looks again
    table = gpu_all.lever_table({**result, "8b batch 1 pdlfused": {"not run": "fused lost"}})
    assert table["pdlfused"] == {"not run": "fused lost"}


def test_step_graph_rows_check_the_logits_first_and_say_why_not_here(tiny_artifacts):
    """step_graph_rows (gpu_timing.py) takes the plain runner's greedy logits before it starts the
    graphs (what "vs plain" compares the replayed steps with); on a CPU artifact starting them fails
    and the row says why, the runner left as it was."""
    from kiln.runtime import Artifact
    from kiln.runtime.model_runner import ModelRunner
    timing = _tool("gpu_timing")
    runner = ModelRunner(Artifact.load(tiny_artifacts["tied"]), max_num_seqs=1)
    args = argparse.Namespace(prompt_len=12, gen_len=4, runs=1)
    logits = timing._greedy_logits(runner, args)
    assert logits.shape == (timing.STEP_CHECK, 1, runner.vocab_size)
    np.testing.assert_array_equal(timing._greedy_logits(runner, args), logits)   # the cache left as it was
    row = timing.step_graph_rows(runner, tiny_artifacts["tied"], args)
    assert "CUDA graphs" in row["error"] and runner.graphs is None


def test_prebuild_keeps_what_these_sources_built_and_drops_the_rest(tmp_path, monkeypatch):
    import kiln
    builds = _tool("gpu_builds")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    monkeypatch.setattr(kiln, "compiler_fingerprint", lambda: "0123456789abcdef")
    monkeypatch.setattr(builds, "PREBUILT", tmp_path / "prebuilt")
    monkeypatch.setattr(builds, "smollm2_gguf", lambda: gguf)
    built = []

    def build_library(src, quant, variant, max_batch, args, dest):
        key = builds.prebuilt_name(src, quant, args.target, max_batch, variant)
        for ext in (".so.xz", ".json"):
            (dest / f"{key}{ext}").write_text("{}")
        built.append((src.name, quant, variant))
        return key, 0.0

    monkeypatch.setattr(builds, "build_library", build_library)
    args = argparse.Namespace(target="cuda-sm90", quick=True)
    (tmp_path / "prebuilt").mkdir()
    stale = tmp_path / "prebuilt" / "64b-q4f16-cuda-sm90-b256-fedcba9876543210-pipe.so.xz"
    stale.write_text("old")
    builds.prebuild(args)
    jobs = len(builds.SMOLLM2_SCHEMES) + len({"base", *builds.LEVERS_8B}) + len(builds.VARIANTS)
    assert len(built) == len(set(built)) == jobs and not stale.exists()
    kept = tmp_path / "prebuilt" / f"{builds.prebuilt_name(gguf, 'q0f16', 'cuda-sm90', None)}.json"
    kept.unlink()                                   # one library missing: a second call builds it alone
    built.clear()
    builds.prebuild(args)
    assert built == [("model.gguf", "q0f16", "base")] and kept.is_file()


def test_host_enqueue_times_the_runners_own_calls_on_the_cpu(tiny_artifacts):
    """host_enqueue (gpu_timing.py) wraps the KV cache's begin/end and the entry functions it finds; a
    refactor of the runner that moves them must not first break in a GPU session."""
    from kiln.runtime import kv_caches
    from kiln.runtime.artifact import Artifact
    from kiln.runtime.model_runner import ModelRunner
    runner = ModelRunner(Artifact.load(tiny_artifacts["tied"]))
    runner.add_sequence(0)
    runner.prefill([0], [[5, 6, 7]])
    before = dict(kv_caches._KV)
    got = _tool("gpu_timing").host_enqueue(runner, [0], [8], steps=2)
    assert {"begin_forward", "end_forward", "batch_decode"} <= set(got["host_calls_ms"])
    assert kv_caches._KV == before and runner.sequence_length(0) == 5
