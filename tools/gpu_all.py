"""`gpu_checks.py all`: every figure the CUDA issue's done-when names, the most telling first, within
a budget of seconds; steps a process of their own where a kernel never run before could fault, and
the steps a cut-short call finished kept for the next call on the same machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpu_8b import compare_logits, gemm_crossover, gemm_decode_crossover
from gpu_builds import (
    CANDIDATE, CHECKS, LEVER_PARTS, LEVERS_8B, SMOLLM2_SCHEMES, compile_timed, load_state, save_state, smollm2_gguf)
from gpu_rows import (
    GPU_TESTS_S, draft_model, facts, gpu_tests, references, sampled_decode, scheme_numerics, served,
    serving_limits, speculative)
from gpu_timing import (
    bench_runner, copy_bandwidth_gbs, gpu_kernel_times, kiln_bench, prefill_sequences, step_graph_rows, torch_rows,
    weight_bytes)


# Seconds a LEVERS_8B build's process may take (load, bench, kernels, step graphs), and the least a
# step needs: 52-112 s each on the H200, 2026-12-04 (its log's "[N s]" say where they go). Once a
# lever's process has run in the call, a step needs LEVER_MARGIN times what the last one took (at
# most LEVER_NEED_S), so that the call's last minute still measures a lever where they run short.
LEVER_S, LEVER_NEED_S, LEVER_MARGIN = 120, 100, 1.25


ALL_STATE = "all-state.json"        # in --work: the steps an earlier `all` call on this machine finished


def _earlier_steps(args) -> dict:
    """The steps a previous `all` call left in --work (same kiln sources, same --quick), finished
    ones only: a second call on a warm machine goes on from there instead of measuring them again."""
    steps = load_state(Path(args.work) / ALL_STATE, args).get("steps", {})
    return {k: v for k, v in steps.items() if not _unfinished(v)}


def _unfinished(step) -> bool:
    """A step (or one of its parts: a variant) skipped for lack of time, or failed, or a process of
    its own cut at its time limit (one that exited with an error, a faulting kernel, would again)."""
    if not isinstance(step, dict):
        return False
    timed_out = step.get("process", {}).get("returncode") == "timed out"
    return ("skipped" in step or "error" in step or timed_out
            or any(isinstance(v, dict) and "skipped" in v for v in step.values()))


class _Steps:
    """`all`'s steps, each called as steps(name, need_s, fn): run within the deadline or marked
    skipped (fewer than need_s seconds left), an exception kept as the step's error, the result
    saved after each one (--out/all.json, and --work/all-state.json for a later call); a step an
    earlier call finished (_earlier_steps) is taken from it, not run again."""

    def __init__(self, args, budget: float) -> None:
        self.args, self.out, self.work = args, Path(args.out), Path(args.work)
        self.earlier, self.result = _earlier_steps(args), {}
        self.deadline = time.monotonic() + budget

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        (self.out / "all.json").write_text(json.dumps(self.result, indent=1, default=str))
        save_state(self.work / ALL_STATE, self.args, steps={**self.earlier, **self.result})

    def __call__(self, name: str, need_s: float, fn):
        left, result = self.left(), self.result
        if name in self.earlier:
            result[name] = self.earlier[name]
            print(f"[an earlier call] {name}", flush=True)
        elif left < need_s:
            result[name] = {"skipped": f"{left:.0f} s left, it needs about {need_s:.0f}"}
        else:
            t = time.perf_counter()
            try:
                result[name] = fn()
            except Exception as e:  # noqa: BLE001 - one failing check must not cost the others
                import traceback
                result[name] = {"error": f"{type(e).__name__}: {e}"[:500],
                                "where": traceback.format_exc().strip().splitlines()[-6:]}
            print(f"[{time.perf_counter() - t:.0f} s] {name}:", json.dumps(result[name], default=str)[:3000],
                  flush=True)
        self.save()
        return result[name]


def run_all(args) -> dict:
    """Every figure the issue's done-when names, the most telling first, inside --budget seconds; the
    8B checkpoint and compile run meanwhile in a second process on the cores the first leaves free.
    all.json is rewritten after every step, so a run cut short still brings back what it measured;
    --work/all-state.json keeps the finished steps, so `all` called again on the same (warm) machine
    runs only what the first call did not reach (its all.json holds both calls' steps)."""
    out, step = Path(args.out), _Steps(args, args.budget)
    result, earlier = step.result, step.earlier

    cores = sorted(os.sched_getaffinity(0))
    child = None
    if "llama3-8b-arch compiled" not in earlier:
        mine, theirs = cores[:4], cores[4:] or cores
        os.sched_setaffinity(0, mine)
        child_args = [sys.executable, "-P", str(CHECKS), "prep8b", "--out", str(out),
                      "--work", args.work, "--target", args.target, "--device", args.device] + ["--quick"] * args.quick
        with (out / "prep8b.log").open("w") as log:
            child = subprocess.Popen(child_args, stdout=log, stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: os.sched_setaffinity(0, theirs))
    src = smollm2_gguf()
    batches = [1, 4] if args.quick else [1, 16, 64, 256]
    step("facts", 0, lambda: facts(args))
    # Weight conversions first (CPU), while the second process writes the 8B checkpoint from the GPU.
    arts = {}
    for quant in SMOLLM2_SCHEMES:
        step(f"convert {quant}", 30, lambda quant=quant: dict(zip(("artifact", "compile_s"),
                                                                   compile_timed(src, quant, args))))
        arts[quant] = result[f"convert {quant}"]

    def checkpoint_written() -> dict:
        while child is not None and child.poll() is None and not (out / "prep8b.checkpoint").is_file():
            time.sleep(1)
        return {"returncode": child.poll() if child else None, "log": log_tail(out / "prep8b.log", 2)}

    step("8B checkpoint written", 0, checkpoint_written)
    bw = step("copy_bandwidth_gbs", 0, lambda: round(copy_bandwidth_gbs(args.device)))

    def smollm2_kiln() -> dict:
        art, seconds = Path(arts["q4f16"]["artifact"]), arts["q4f16"]["compile_s"]
        floor = bw * 1e9 / weight_bytes(art)
        rows, runner = {}, bench_runner(art, max(batches), args)
        for b in batches:
            rows[f"batch {b}"] = kiln_bench(art, b, args, runner)
            print(f"q4f16 batch {b}", rows[f"batch {b}"], flush=True)
        if args.device == "cuda":
            rows["batch 1 decode kernels"] = gpu_kernel_times(runner, prefill_sequences(runner, 1, args))
            # Host-bound at batch 1 (2026-12-04: 1.70 ms wall, 0.77 busy): the step captured whole.
            rows["batch 1 step graphs"] = step_graph_rows(runner, art, args)
            # Where the BLAS entries pay for a model of SmolLM2's size (runtime/library_gemm.py scales the
            # 8B's decode crossover by the matmuls' size: beyond 256 sequences here; prefill is not scaled).
            rows["library gemm crossover"] = gemm_crossover(runner, args)
            rows["library gemm decode crossover"] = gemm_decode_crossover(runner, args, batches=(16, 64, 256))
        return {"artifact": str(art), "compile_s": round(seconds, 1), "batch1_floor_tok_s": round(floor),
                "batch1_pct_of_floor": round(100 * rows["batch 1"]["decode_tok_s"] / floor, 1), **rows}

    q4 = step("smollm2 q4f16 kiln", 60, smollm2_kiln)
    os.sched_setaffinity(0, cores)                      # the 8B steps may use every core once it is built

    def prep8b_done() -> dict:
        left = step.left()
        try:
            child.wait(timeout=max(1.0, left - 120))
        except subprocess.TimeoutExpired:
            child.kill()
            return {"error": "the 8B compile did not finish in time", "log": log_tail(out / "prep8b.log")}
        prep_file = out / "prep8b.json"
        if child.returncode != 0 or not prep_file.is_file():
            return {"error": f"prep8b exited {child.returncode}", "log": log_tail(out / "prep8b.log")}
        return json.loads(prep_file.read_text())

    prep = step("llama3-8b-arch compiled", 120, prep8b_done)
    # The one unmet figure first: the whole 8B at batch 1 through each of LEVERS_8B, "base" (what
    # ships) first, each in a process of its own (kernels that have not run on a GPU before fault
    # only that process); then the done-when's other 8B rows (measure8b: batch 16 and 64, the 16 x
    # 128 prefill, the kernels, the library GEMM's crossovers), met on earlier runs. With a CANDIDATE
    # (a build about to be adopted) its measure8b comes first and what ships is measured after it
    # (adopting compares with it), so that a call cut short (a second call goes on, tools/README.md)
    # has the rows the decision needs first.
    measured = []

    def measure(tag: str) -> dict:
        art8b = prep[CANDIDATE]["artifact"] if tag == CANDIDATE else prep["artifact"]
        label = "llama3-8b-arch q4f16" + (f" {CANDIDATE}" if tag == CANDIDATE else "")
        row = step(label, 90, lambda: apart(
            args, "measure8b", min(240.0, max(60.0, step.left() - 60)), f"measure8b-{tag}",
            ("--artifact", art8b, "--tag", tag)))
        measured.extend([tag] * ("logits" in row))
        return row

    if CANDIDATE and CANDIDATE in prep:
        measure(CANDIDATE)
    if "artifact" in prep:         # the unmet figure: batch 1 through each lever, the whole 8B, a process each
        last_s = LEVER_NEED_S / LEVER_MARGIN          # what the last lever's process took

        def lever8b(lever: str) -> dict:
            nonlocal last_s
            lost = parts_lost(result, lever)
            if lost:
                return lost
            started = time.monotonic()
            try:
                return apart(args, "lever8b", LEVER_S, f"lever8b-{lever}",
                             ("--artifact", prep["artifact"], "--tag", lever))
            finally:
                last_s = time.monotonic() - started

        for lever in LEVERS_8B:
            step(f"8b batch 1 {lever}", min(LEVER_NEED_S, LEVER_MARGIN * last_s), lambda lever=lever: lever8b(lever))
        step("8b batch 1 levers", 0, lambda: lever_table(result))
        measure("base")
        step("llama3-8b-arch transformers fp16 static", 120, lambda: apart(
            args, "torch8b", max(60.0, step.left() - 30)))
    step("smollm2 torch fp16 static", 45, lambda: torch_rows(src, batches[:1], args))
    refs = []

    def scheme(quant: str) -> dict:
        if not refs:                                    # transformers fp32 and fp16, once a call
            refs.extend(references(src, args))
        return scheme_numerics(src, quant, tuple(refs), args, arts.get(quant))

    step("numerics q0f16", 60, lambda: scheme("q0f16"))
    if "artifact" in q4:
        # After the 8B steps: an Engine sizes its KV cache from most of the GPU's free memory.
        step("serving limits", 20, lambda: serving_limits(Path(q4["artifact"])))
    if measured == [CANDIDATE, "base"]:
        step(f"llama3-8b-arch {CANDIDATE} logits vs base", 0, lambda: compare_logits(step.work, CANDIDATE))
    if not args.quick:              # the shipped kernels against numpy first (GPU_TEST_ORDER)
        step("gpu tests", 120, lambda: gpu_tests(args, min(GPU_TESTS_S, max(60.0, step.left() - 60))))
    if "artifact" in q4:
        ends = list(dict.fromkeys((batches[0], *batches[-2:])))     # the smallest and the two largest
        step("sampled decode", 40, lambda: {f"batch {b}": sampled_decode(Path(q4["artifact"]), b, args)
                                            for b in ends})
        # `kiln serve` itself at as many streams, beside the rows above (tools/serve_load.py)
        step("smollm2 q4f16 served", 140, lambda: served(Path(q4["artifact"]), ends, args))
        step("smollm2 q4f16 speculative", 45, lambda: speculative(Path(q4["artifact"]), args))
        if "artifact" in arts["q0f16"]:
            step("smollm2 q0f16 draft model q4f16", 45, lambda: draft_model(
                Path(arts["q0f16"]["artifact"]), Path(q4["artifact"]), args))
    step("smollm2 torch fp16 static, more rows", 60, lambda: torch_rows(src, batches[1:3], args))
    # Which lever does what at 2-64 rows, on 2 layers (tools/README.md), with the time then left.
    step("low-batch variants", 60, lambda: apart(args, "variants", step.left() - 20))
    for quant in ("as-stored", "as-stored-f16"):
        step(f"numerics {quant}", 45, lambda quant=quant: scheme(quant))
    refs.clear()
    # Last, with what time is left: a KV cache kiln owns against TVM's on the 8B's attention layers alone
    # (tools/kv_probe.py: the decode step's time each way, outputs compared; the graph's with sinks too).
    step("kv probe", 60, lambda: kv_probe_rows(args))
    if child is not None and child.poll() is None:
        child.kill()
    return result


def kv_probe_rows(args) -> dict:
    """tools/kv_probe.py at the 8B's attention shape on CUDA (one and 16 sequences after 128-token prompts;
    with sinks, the graph's only), SmolLM2's on the CPU of a dry run (`tiny` with --quick)."""
    import dataclasses

    from kv_probe import SHAPES, run_both
    cuda = args.device == "cuda"
    shape = SHAPES["8b" if cuda else "tiny" if args.quick else "smollm2"]
    target = "cuda" if cuda else "cpu"
    rows = {f"batch {b}": run_both(shape, target, [args.prompt_len] * b, decode_steps=2, timed_steps=100)
            for b in (1, 16)}
    rows["batch 1 sinks"] = run_both(dataclasses.replace(shape, sinks=True), target, [args.prompt_len], decode_steps=2,
                                     timed_steps=100)
    return rows


def _best_tok_s(row: dict) -> float | None:
    """A lever row's batch-1 tok/s, with or without step graphs, whichever is more; None unmeasured."""
    tok_s = [r.get("decode_tok_s") for r in (row.get("batch 1", {}), row.get("batch 1 step graphs", {}))]
    return max((t for t in tok_s if t), default=None)


def parts_lost(result: dict, lever: str) -> dict | None:
    """Why LEVER_PARTS' combination `lever` is not measured in this run: a part measured no faster
    than base ("not run": final), or a part or base not measured yet ("skipped": a later call on the
    machine looks again); None where every part beat base (or `lever` is no combination)."""
    base = _best_tok_s(result.get("8b batch 1 base", {}))
    for part in LEVER_PARTS.get(lever, ()):
        got = _best_tok_s(result.get(f"8b batch 1 {part}", {}))
        if base is None or got is None:
            return {"skipped": f"{part} or base not measured yet"}
        if got <= base:
            return {"not run": f"{part} ({got} tok/s) did not beat base ({base} tok/s)"}
    return None


def lever_table(result: dict) -> dict:
    """The LEVERS_8B rows `all` measured, one line each, fastest first: batch-1 tok/s and % of the
    floor, the same with step graphs, and the largest logit difference from base's; a lever whose
    process failed says why ("missing"), a combination whose part lost says so ("not run"), one not
    reached yet is "skipped" (so the table itself is unfinished, and a later call on the machine
    makes it again with what that call adds)."""
    rows = {}
    for lever in LEVERS_8B:
        got = result.get(f"8b batch 1 {lever}", {})
        if "batch 1" not in got:       # not reached yet ("skipped": a later call makes the table again)
            failed = got.get("error") or got.get("process")
            rows[lever] = ({"missing": failed} if failed else {"not run": got["not run"]} if "not run" in got
                           else {"skipped": got.get("skipped", "not reached")})
            continue
        graphs = got.get("batch 1 step graphs", {})
        rows[lever] = {"tok_s": got["batch 1"]["decode_tok_s"], "pct": got["batch 1"]["pct_of_floor"],
                       "graphs_tok_s": graphs.get("decode_tok_s"), "graphs_pct": graphs.get("pct_of_floor"),
                       "max_diff": got.get("vs base", {}).get("max_diff")}
    # By tok/s (one model, the same bytes): each process measures the copy bandwidth its % divides by.
    return dict(sorted(rows.items(), key=lambda kv: -(_best_tok_s(result.get(f"8b batch 1 {kv[0]}", {})) or 0)))


def apart(args, command: str, seconds: float, name: str | None = None, extra: tuple[str, ...] = ()) -> dict:
    """`command` of this script in a process of its own, within `seconds`: a kernel never run before
    that faults (a sticky CUDA error) costs that process, not the rest of `all`. Its json comes
    back (a run cut short: what it wrote so far), with its return code and log tail if it failed."""
    out = Path(args.out)
    name = name or command
    cmd = [sys.executable, "-P", str(CHECKS), command, "--out", str(out), "--work", args.work,
           "--target", args.target, "--device", args.device, "--budget", str(seconds), "--runs", str(args.runs),
           "--json-name", name, "--prompt-len", str(args.prompt_len), "--gen-len", str(args.gen_len),
           *extra] + ["--quick"] * args.quick
    with (out / f"{name}.log").open("w") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=seconds + 60).returncode
        except subprocess.TimeoutExpired:
            rc = "timed out"
    done = out / f"{name}.json"
    result = json.loads(done.read_text()) if done.is_file() else {}
    if rc != 0:
        result["process"] = {"returncode": rc, "log": log_tail(out / f"{name}.log")}
    return result


def log_tail(path: Path, lines: int = 8) -> list[str]:
    return path.read_text(errors="replace").strip().splitlines()[-lines:] if path.is_file() else []
