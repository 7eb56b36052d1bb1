"""tools/gpu_checks.py's Llama-3-8B-architecture rows: the checkpoint and its q4f16 compile (prep8b),
batch-1 decode against the bandwidth floor, batch 16/64 decode and 16 x 128 prefill beside
transformers fp16 (measure8b), where the library GEMM starts to pay, and the batch-1 levers on the
whole model (lever8b)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import numpy as np

from gpu_builds import (
    CANDIDATE, PREBUILT, VARIANTS, compile_timed, library_swapped, llama8b_checkpoint, prebuilt_name)
from gpu_timing import (
    bench_runner, copy_bandwidth_gbs, gpu_kernel_times, kernel_profile, kiln_bench, prefill_kernel_times,
    prefill_sequences, prompts_for, recorder, step_graph_rows, step_ms, torch_rows, weight_bytes)


def prep8b(args) -> dict:
    """The 8B checkpoint and its q4f16 artifact: what `all` runs in a second process beside the
    SmolLM2 checks. The checkpoint is initialised on --device (on 12 CPU cores it did not finish in
    four minutes, H100 machine); --out/prep8b.checkpoint says when it is written, so that `all`
    times nothing on the GPU before then."""
    src, written = llama8b_checkpoint(args)
    (Path(args.out) / "prep8b.checkpoint").write_text(f"{written:.1f}")
    print(f"checkpoint written in {written:.0f} s", flush=True)
    stages: dict[str, list[float]] = {}

    def progress(stage: str, _done: int, _total: int) -> None:
        stages.setdefault(stage.split(":")[0], []).append(time.perf_counter())

    art, seconds = compile_timed(src, "q4f16", args, max_batch_size=256, progress=progress)
    span = {k: round(v[-1] - v[0], 1) for k, v in stages.items() if len(v) > 1}
    if "weights" in stages and "compile" in stages:         # the library's export, then every weight
        span["export+weights"] = round(stages["weights"][-1] - stages["compile"][-1], 1)
    result = {"artifact": str(art), "checkpoint_s": round(written, 1), "compile_s": round(seconds, 1),
              "stage_s": span, "convert_workers": len(os.sched_getaffinity(0))}
    # The same weights with CANDIDATE's library (built here only where prebuild left it: on the
    # device a second 8B compile would cost minutes the measurements need).
    if CANDIDATE and ((PREBUILT / f"{prebuilt_name(src, 'q4f16', args.target, 256, CANDIDATE)}.so.xz").is_file()
                      or args.quick):
        cand, seconds = compile_timed(src, "q4f16", args, CANDIDATE, max_batch_size=256)
        result[CANDIDATE] = {"artifact": str(cand), "compile_s": round(seconds, 1)}
    return result


def measure8b(art: Path, args, torch_too: bool = True, tag: str = "base", save: Path | None = None) -> dict:
    """Batch-1 decode against the floor (and its slowest kernels), 16 x 128 prefill and batch-64 decode,
    beside transformers fp16 with a static cache on the same checkpoint. The prefill's last-token
    logits and the first decode step's at each batch go to --work/8b-logits-<tag>.npz (kept between
    `all` calls on a warm machine; compare_logits: one build against another; result["logits"] says
    it was written). `save`: the
    result is rewritten there after each row (a process cut short or failing keeps what it measured)."""
    import gc

    bw = copy_bandwidth_gbs(args.device)
    floor = bw * 1e9 / weight_bytes(art)
    result = {"build": tag, "weight_gb": round(weight_bytes(art) / 1e9, 2), "copy_bandwidth_gbs": round(bw),
              "batch1_floor_tok_s": round(floor, 1)}
    record = recorder(result, save, "8b")
    batches = [2] if args.quick else [16, 64]
    runner = bench_runner(art, max(batches), args)      # one load of the weights for every row (5.65 GB)
    with _gemm_from(10 ** 9):                          # first, before any BLAS call: TVM's matmuls only
        record("batch 1", kiln_bench(art, 1, args, runner))
        record("batch1_pct_of_floor", round(100 * result["batch 1"]["decode_tok_s"] / floor, 1))
        if args.device == "cuda":
            step = step_graph_rows(runner, art, args)
            record("batch 1 step graphs", step)
            if "decode_tok_s" in step:
                record("batch1_step_graphs_pct_of_floor", round(100 * step["decode_tok_s"] / floor, 1))
    record("library gemm weights", {"bytes": runner.artifact.config.library_gemm_bytes,
                                    "unusable": runner.gemm_unusable})
    if runner.gemm_unusable is None:          # before any row whose prefill takes it
        record("library gemm probe", gemm_probe(runner, args))
    logits = {}
    for b in (1, *batches):                 # 16 x 128 and 64 x 128: the library GEMM prefill, where built
        ids = list(range(b))
        for i in ids:
            runner.add_sequence(i)
        logits[f"prefill {b}"] = runner.prefill(ids, prompts_for(ids, args))
        logits[f"batch {b}"] = runner.decode(ids, [5] * b)
        for i in ids:
            runner.remove_sequence(i)
    np.savez(Path(args.work) / f"8b-logits-{tag}.npz", **logits)
    record("logits", f"8b-logits-{tag}.npz")
    for b in batches:
        record(f"batch {b}", kiln_bench(art, b, args, runner))
    for b in (1, 16):
        if args.device == "cuda":
            ids = prefill_sequences(runner, b, args)
            record(f"batch {b} decode kernels", gpu_kernel_times(runner, ids))
            for i in ids:
                runner.remove_sequence(i)
        else:
            record(f"batch {b} decode kernels", kernel_profile(art, b, args))
    if args.device == "cuda":
        rows = 2 if args.quick else 16
        record(f"prefill {rows} x {args.prompt_len} kernels", prefill_kernel_times(art, rows, args, runner))
    if runner.gemm_unusable is None:
        record("library gemm crossover", gemm_crossover(runner, args))
        record("library gemm decode crossover", gemm_decode_crossover(runner, args))
    del runner
    gc.collect()
    if torch_too:
        record("torch fp16 static", torch8b(args))
    return result


def lever8b(base: Path, lever: str, args, save: Path | None = None) -> dict:
    """One LEVERS_8B build of the whole 8B (`base`, prep8b's artifact, with the lever's library) at
    batch 1: the bench row against the floor, the first decode step's logits against base's (the
    "base" lever's, measured the same way and kept in --work), the kernels' and the host's time a
    step (CUPTI), then the same with the decode steps replayed as whole CUDA graphs. TVM's matmuls
    throughout (the library GEMM's prefill would move the logits base is compared by)."""
    import shutil
    result = {"build": lever}
    record = recorder(result, save, f"8b {lever}")
    src, _ = llama8b_checkpoint(args)                    # written by prep8b: its path
    art = base if lever == "base" else library_swapped(base, src, lever, args)
    floor = copy_bandwidth_gbs(args.device) * 1e9 / weight_bytes(art)
    options = VARIANTS[lever].get("runner", {}) if args.device == "cuda" else {}
    reference = Path(args.work) / "8b-lever-logits-base.npy"
    try:
        with _gemm_from(10 ** 9):
            started = time.monotonic()
            runner = bench_runner(art, 1, args, verify=False, **options)
            record("load_s", round(time.monotonic() - started, 1))
            row = kiln_bench(art, 1, args, runner)
            record("batch 1", {**row, "pct_of_floor": round(100 * row["decode_tok_s"] / floor, 1)})
            ids = prefill_sequences(runner, 1, args)
            logits = runner.decode(ids, [5])
            runner.remove_sequence(ids[0])
            if lever == "base":
                np.save(reference, logits)
            elif reference.is_file():
                record("vs base", _logit_diff(logits, np.load(reference)))
            if args.device == "cuda":
                ids = prefill_sequences(runner, 1, args)
                times = gpu_kernel_times(runner, ids, top=6)
                runner.remove_sequence(ids[0])
                record("kernels", {**{k: times[k] for k in ("wall_ms", "busy_ms", "matmul_ms", "attention_ms",
                                                            "host_enqueue_ms", "kernels")},
                                   "covered_ms": times["idle"]["covered_ms"]})
                step = step_graph_rows(runner, art, args)
                if "decode_tok_s" in step:
                    step["pct_of_floor"] = round(100 * step["decode_tok_s"] / floor, 1)
                record("batch 1 step graphs", step)
    finally:
        if art != base:
            shutil.rmtree(art, ignore_errors=True)        # links and the library
    return result


# The entries the runner can take, TVM's matmuls or the library GEMM's, by the library_gemm.MIN_TOKENS
# (or MIN_DECODE_ROWS) that forces each.
GEMM_OR_NOT = (("tvm", 10 ** 9), ("gemm", 1))


@contextlib.contextmanager
def _gemm_from(least: int, knob: str = "MIN_TOKENS"):
    """Within: the runner takes the library GEMM entry for forwards of `least` tokens or more (knob
    MIN_DECODE_ROWS: its decode entry for steps of `least` sequences or more)."""
    from kiln.runtime import library_gemm
    knobs = {knob: least, **({"DECODE_CALL_VALUES": 0} if knob == "MIN_DECODE_ROWS" else {})}  # not scaled
    shipped = {name: getattr(library_gemm, name) for name in knobs}
    for name, value in knobs.items():
        setattr(library_gemm, name, value)
    try:
        yield
    finally:
        for name, value in shipped.items():
            setattr(library_gemm, name, value)


def _logit_diff(a: np.ndarray, b: np.ndarray) -> dict:
    """The largest difference and the rows whose argmax differs (last axis: the vocabulary); for those
    rows, `b`'s logit gap between the two argmaxes (a near-tie: at most twice max_diff)."""
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    moved = np.flatnonzero(a.argmax(-1) != b.argmax(-1))
    gaps = [float(b[r].max() - b[r, a[r].argmax()]) for r in moved]
    return {"max_diff": float(np.abs(a - b).max()), "argmax_differs": len(moved),
            **({"argmax_gaps": [round(g, 5) for g in gaps]} if gaps else {})}


def gemm_probe(runner, args) -> dict:
    """One prefill of MIN_TOKENS tokens and one decode step after it through batch_prefill and
    batch_decode, then through the library GEMM entries (never run on a GPU before 2026-11-27):
    their logits compared. Should a GEMM entry raise, the runner drops both (gemm_unusable says
    why) and the rows after this one are measured without them instead of lost."""
    from kiln.runtime import library_gemm
    from kiln.runtime.contract import LIBRARY_GEMM_COPIES
    prompt = list(range(3, 3 + library_gemm.MIN_TOKENS))          # one sequence, one forward
    logits = {}
    try:
        for label, least in GEMM_OR_NOT:
            runner.add_sequence(0)
            try:
                with _gemm_from(least), _gemm_from(least, "MIN_DECODE_ROWS"):
                    logits[label] = runner.prefill([0], [prompt])
                    logits[f"{label} decode"] = runner.decode([0], [5])
            finally:
                runner.remove_sequence(0)
    except Exception as e:  # noqa: BLE001 - the rows after this one go on through TVM's entries
        for name in LIBRARY_GEMM_COPIES:
            runner._fn.pop(name, None)
        runner.gemm_unusable = f"the probe failed: {type(e).__name__}: {e}"[:300]
        return {"error": runner.gemm_unusable}
    return {"tokens": len(prompt), **_logit_diff(logits["gemm"], logits["tvm"]),
            "decode": _logit_diff(logits["gemm decode"], logits["tvm decode"])}


def gemm_crossover(runner, args, batches=(1, 2, 4, 16), short=(16, 32, 64)) -> dict:
    """Prefill ms of `batch` --prompt-len prompts, and of one prompt of each `short` length, through
    batch_prefill and through the library GEMM entry (runtime/library_gemm.py MIN_TOKENS moved either
    way), the median of 3 each: where the BLAS starts to pay, i.e. what MIN_TOKENS should be."""
    import copy
    import statistics
    shapes = [(1, n) for n in short if n < args.prompt_len] + [(b, args.prompt_len) for b in batches]
    rows = {}
    for b, n in (s for s in shapes if s[0] <= runner.max_num_seqs):
        shape = copy.copy(args)
        shape.prompt_len = n
        for label, least in GEMM_OR_NOT:
            times = []
            with _gemm_from(least):
                for _ in range(4):                               # the first warms up
                    t = time.perf_counter()
                    ids = prefill_sequences(runner, b, shape)             # returns once the logits are back
                    times.append(time.perf_counter() - t)
                    for i in ids:
                        runner.remove_sequence(i)
            rows.setdefault(f"{b} x {n}", {})[f"{label}_ms"] = round(statistics.median(times[1:]) * 1e3, 2)
    return rows


def gemm_decode_crossover(runner, args, batches=(8, 16, 32, 64)) -> dict:
    """Greedy decode step ms of `batch` sequences through batch_decode (CUDA graphs, the quantized
    weights) and through the library GEMM's batch_decode_gemm (no graphs, the float weights, torch's
    BLAS), each after a --prompt-len prefill: what MIN_DECODE_ROWS should be."""
    rows = {}
    for b in (b for b in batches if b <= runner.max_num_seqs):
        ids = prefill_sequences(runner, b, args)
        for label, least in GEMM_OR_NOT:
            with _gemm_from(least, "MIN_DECODE_ROWS"):
                rows.setdefault(f"batch {b}", {})[f"{label}_ms"] = step_ms(runner, ids)
        for i in ids:
            runner.remove_sequence(i)
    return rows


def compare_logits(work: Path, tag: str, reference: str = "base") -> dict:
    """How far one 8B build's prefill and first-step logits (measure8b's npz in --work) are from
    another's, per batch: the largest difference and the rows whose argmax differs (float32
    summation order moves logits by ~1e-3; a wrong kernel by far more)."""
    a, b = np.load(work / f"8b-logits-{tag}.npz"), np.load(work / f"8b-logits-{reference}.npz")
    return {k: {**_logit_diff(a[k], b[k]), "rows": len(a[k])} for k in a.files if k in b.files}


def torch8b(args, save: Path | None = None) -> dict:
    """transformers fp16 with a static cache on the 8B checkpoint: 16 x 128 prefill and decode at 16
    and 64 sequences (what the issue compares kiln's batch-64 decode and prefill with)."""
    return torch_rows(Path(args.work) / "llama3-8b-arch", [2] if args.quick else [16, 64], args, save, "8b torch")
