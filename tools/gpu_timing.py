"""How tools/gpu_checks.py times kiln and its reference: `kiln bench` rows, a decode step's kernels
as CUPTI records them (busy, idle and what the idle precedes), the host's enqueue time, whole-step
CUDA graphs, and transformers fp16 with a static cache."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import numpy as np

_STARTED = time.monotonic()          # about when this process started: recorder's lines count from it


def copy_bandwidth_gbs(device: str) -> float:
    """Bytes read plus written per second by a large device-to-device copy (torch)."""
    import torch
    n = (1 << 30) if device == "cuda" else (1 << 26)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    sync()
    return 2 * n * 10 / (time.perf_counter() - t) / 1e9


def weight_bytes(art: Path) -> int:
    """The weight bytes a batch-1 decode step reads (runtime/bench.py decode_read_bytes): the floor's
    divisor. Before 2026-11-29 every parameter file counted, the 8B's embedding table (0.30 GB a step
    gathers one row of) included: the 8B's H200 floor read 750 tok/s where it is 791."""
    from kiln.runtime.bench import decode_read_bytes
    return decode_read_bytes(art)


def bench_runner(art: Path, batch: int, args, verify: bool = True, **options):
    """A runner for `batch` sequences of the benchmark's lengths; options: ModelRunner's (step_graphs).
    verify=False: the files' hashes not checked (the 8B's 5.65 GB read once more at every load)."""
    from kiln.runtime import Artifact
    from kiln.runtime.bench import kv_tokens_needed
    from kiln.runtime.memory_budget import default_kv_tokens
    from kiln.runtime.model_runner import ModelRunner
    artifact = Artifact.load(art, verify=verify)
    kv = kv_tokens_needed(artifact.config.kv_cache.page_size, args.prompt_len, args.gen_len, batch)
    return ModelRunner(artifact, max_num_seqs=batch, max_total_tokens=max(kv, default_kv_tokens(artifact, batch)),
                       **options)


def kiln_bench(art: Path, batch: int, args, runner=None) -> dict:
    """`kiln bench` at `batch` sequences (on `runner` if given: one loaded for at least that many)."""
    from kiln.runtime.bench import bench
    r = bench(runner or bench_runner(art, batch, args), prompt_len=args.prompt_len, gen_len=args.gen_len, batch=batch,
              runs=args.runs)
    return {"prefill_tok_s": round(r.prefill_tok_s), "decode_tok_s": round(r.decode_tok_s, 1),
            "tpot_ms": round(r.tpot_ms, 3)}


def step_graph_rows(runner, art: Path, args) -> dict:
    """`runner` at batch 1 with its decode steps replayed as whole CUDA graphs (runtime/step_graph.py),
    then as it was: the bench row, the kernels' and the host's time a step, and the graphs' counts
    (a capture that failed turns them off: "off" says why); "vs plain": a prompt's first STEP_CHECK
    greedy steps' logits with the graphs against without, which must be bit-equal (the same kernels
    in the same order) for the graphs to ship on by default."""
    plain = _greedy_logits(runner, args)
    try:
        graphs = runner.start_step_graphs()
    except Exception as e:                     # noqa: BLE001 - a row that says why, the rows after it kept
        return {"error": f"{type(e).__name__}: {e}"}
    ids: list[int] = []
    try:
        replayed = _greedy_logits(runner, args)
        row = kiln_bench(art, 1, args, runner)
        row["vs plain"] = {"bit_equal": bool(np.array_equal(replayed, plain)),
                           "max_diff": float(np.abs(replayed - plain).max())}
        ids = prefill_sequences(runner, 1, args)
        times = gpu_kernel_times(runner, ids)
        row.update({k: times[k] for k in ("wall_ms", "busy_ms", "host_enqueue_ms", "host_wait_ms")})
        row["covered_ms"] = times["idle"]["covered_ms"]
        row["graphs"] = graphs.stats()
        return row
    except Exception as e:                     # noqa: BLE001 - as above
        return {"error": f"{type(e).__name__}: {e}", "graphs": graphs.stats()}
    finally:
        for i in ids:
            runner.remove_sequence(i)
        with contextlib.suppress(Exception):
            runner.stop_step_graphs()


STEP_CHECK = 6


def _greedy_logits(runner, args) -> np.ndarray:
    """The logits of STEP_CHECK greedy decode steps after one --prompt-len prompt, stacked."""
    ids = prefill_sequences(runner, 1, args)
    try:
        rows, token = [], 5
        for _ in range(STEP_CHECK):
            logits = runner.decode(ids, [token])
            rows.append(logits)
            token = int(logits[0].argmax())
        return np.stack(rows)
    finally:
        for i in ids:
            runner.remove_sequence(i)


def kernel_profile(art: Path, batch: int, args, top: int = 12) -> dict:
    """Where a decode step's time goes (`kiln bench --profile`): the slowest kernels, ms per step."""
    from kiln.runtime.bench import profile_kernels
    p = profile_kernels(bench_runner(art, batch, args), prompt_len=args.prompt_len, gen_len=min(args.gen_len, 16),
                        batch=batch).decode
    return {"wall_ms": round(p.wall_ms, 3), "wall_ms_uninstrumented": round(p.wall_ms_uninstrumented, 3),
            "calls_per_step": p.calls_per_step, "outside_ms": round(p.outside_ms, 3),
            "kernels": [(k.name, round(k.ms_per_step, 4), round(k.calls_per_step, 1)) for k in p.kernels[:top]]}


def prefilled(art: Path, batch: int, args):
    """A runner for `batch` sequences, each holding a --prompt-len prompt; (runner, sequence ids)."""
    runner = bench_runner(art, batch, args)
    return runner, prefill_sequences(runner, batch, args)


def prefill_sequences(runner, batch: int, args) -> list[int]:
    """Sequences 0 .. batch-1 added to `runner`, each holding a --prompt-len prompt; their ids."""
    ids = list(range(batch))
    for i in ids:
        runner.add_sequence(i)
    runner.prefill(ids, prompts_for(ids, args))
    return ids


def step_ms(runner, ids: list[int], steps: int = 8) -> float:
    """Wall ms per greedy decode step of sequences `ids` (where no CUPTI is at hand)."""
    tokens = runner.decode_greedy(ids, [5] * len(ids))
    t = time.perf_counter()
    for _ in range(steps):
        tokens = runner.decode_greedy(ids, [int(x) for x in tokens])
    return round((time.perf_counter() - t) / steps * 1e3, 3)


def prompts_for(ids: list[int], args) -> list[list[int]]:
    """A --prompt-len prompt for each sequence, each its own tokens."""
    return [list(range(3 + i, 3 + i + args.prompt_len)) for i in ids]


def gpu_kernel_times(runner, ids: list[int], steps: int = 16, top: int = 14) -> dict:
    """GPU time per greedy decode step of sequences `ids` (a runner from prefilled), kernel by
    kernel, as CUPTI records it (torch.profiler sees every kernel in the process, TVM's inside CUDA
    graphs included), against the step's wall time: busy_ms well under wall_ms means the host, not
    the GPU, sets the pace."""
    tokens = [5] * len(ids)

    def step() -> None:
        nonlocal tokens
        tokens = [int(t) for t in runner.decode_greedy(ids, tokens)]

    for _ in range(4):                                     # warm-up: CUDA graphs captured
        step()
    return {**_cupti_times(step, steps, top), **host_enqueue(runner, ids, tokens, steps)}


def host_enqueue(runner, ids: list[int], tokens: list[int], steps: int = 16) -> dict:
    """A greedy decode step split at the token's copy back (ModelRunner.decode_greedy's own calls):
    the host's ms until the step's last kernel is queued, then its ms waiting for the GPU (median
    of `steps`). A step whose enqueue time nears the GPU's busy time is the host's to shorten;
    waiting most of the step, the GPU's. `host_calls_ms`: the enqueue's host ms in each call the
    runner makes (the ids staged and embedded, the KV cache's begin and end, the decode entry, the
    argmax), medians: which of them sits between the last step's token and this step's first layer
    (the GPU's idle time before layer 0's norm)."""
    import statistics

    from kiln.runtime import kv_caches
    spent: dict[str, float] = {}

    def timed(name: str, fn):
        def call(*a):
            t = time.perf_counter()
            try:
                return fn(*a)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return call

    kv, fns = dict(kv_caches._KV), dict(runner._fn)
    kv_caches._KV.update({k: timed(k.removeprefix("kv_state_"), f) for k, f in kv.items()
                             if k in ("kv_state_begin_forward", "kv_state_end_forward")})
    runner._fn.update({k: timed(k, f) for k, f in fns.items()})
    enqueue, wait, calls = [], [], {}
    try:
        for _ in range(steps):
            spent.clear()
            t0 = time.perf_counter()
            picked = runner._decode(ids, tokens, "greedy")[1]
            t1 = time.perf_counter()
            tokens = [int(t) for t in picked.numpy()]
            enqueue.append(t1 - t0)
            wait.append(time.perf_counter() - t1)
            for k, v in spent.items():
                calls.setdefault(k, []).append(v)
    finally:
        kv_caches._KV.update(kv)
        runner._fn.clear()
        runner._fn.update(fns)
    return {"host_enqueue_ms": round(statistics.median(enqueue) * 1e3, 3),
            "host_wait_ms": round(statistics.median(wait) * 1e3, 3),
            "host_calls_ms": {k: round(statistics.median(v) * 1e3, 3) for k, v in calls.items()}}


def prefill_kernel_times(art: Path, batch: int, args, runner=None, steps: int = 4, top: int = 14) -> dict:
    """The same for a prefill of `batch` sequences of --prompt-len tokens (each step adds the
    sequences, prefills them and drops them): which kernels the issue's 16 x 128 prefill spends."""
    runner = runner or bench_runner(art, batch, args)
    ids = list(range(batch))
    prompts = prompts_for(ids, args)

    def step() -> None:
        for i in ids:
            runner.add_sequence(i)
        runner.prefill(ids, prompts)
        for i in ids:
            runner.remove_sequence(i)

    step()
    return _cupti_times(step, steps, top)


def _cupti_times(step, steps: int, top: int) -> dict:
    """step() `steps` times under torch.profiler (CUPTI): wall and GPU-busy ms a step, the matmul and
    decode attention kernels' share, and the `top` kernels (name, ms a step, calls a step)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / steps
    rows = [(e.key, e.device_time_total / steps / 1e3, e.count / steps) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start]
    return {"wall_ms": round(wall * 1e3, 3), "busy_ms": round(sum(r[1] for r in rows), 3),
            "matmul_ms": round(sum(r[1] for r in rows if "matmul" in r[0] or "gemm" in r[0].lower()), 3),
            "attention_ms": round(sum(r[1] for r in rows if "batch_decode_paged_kv" in r[0]), 3),
            "kernels": [(name[:90], round(ms, 4), round(calls, 1)) for name, ms, calls in rows[:top]],
            "idle": idle_gaps(kernels, steps, top=6)}


def idle_gaps(kernels: list[tuple[str, float, float]], steps: int, min_us: float = 2.0, top: int = 6) -> dict:
    """Where the GPU waits for the host: over the (name, start us, end us) of every GPU activity,
    the idle time between one ending and the next starting (gaps under `min_us` are launch
    spacing, counted apart), a step's share, grouped by the kernel the gap precedes. A gap before
    the step's first kernel (the embedding) is the host between steps (token copied back, the next
    step prepared); gaps before the attention kernels are the host launching what the CUDA graphs
    leave out. `covered_ms`: a step's time with at least one activity on the GPU (overlaps counted
    once): the busy time where kernels overlap (programmatic dependent launch: a kernel's time then
    includes its wait for the one before, so busy_ms, their sum, counts that twice)."""
    idle, small, by_next, end, covered = 0.0, 0.0, {}, None, 0.0
    for name, start, stop in sorted(kernels, key=lambda k: k[1]):
        covered += max(0.0, stop - max(start, end if end is not None else start))
        if end is not None and start > end:
            gap = start - end
            if gap < min_us:
                small += gap
            else:
                idle += gap
                total, count = by_next.get(name, (0.0, 0))
                by_next[name] = (total + gap, count + 1)
        end = stop if end is None else max(end, stop)
    worst = sorted(by_next.items(), key=lambda kv: -kv[1][0])[:top]
    return {"idle_ms": round(idle / steps / 1e3, 3), "launch_spacing_ms": round(small / steps / 1e3, 3),
            "covered_ms": round(covered / steps / 1e3, 3), "activities_per_step": round(len(kernels) / steps, 1),
            "before": [(name[:90], round(total / steps / 1e3, 4), round(count / steps, 1))
                       for name, (total, count) in worst]}


def transformers_model(src: Path, dtype, device: str):
    import torch
    import transformers
    kw = {"gguf_file": src.name} if src.suffix == ".gguf" else {}
    root = str(src.parent if src.suffix == ".gguf" else src)
    # A GGUF is dequantized to float32 first; a checkpoint loads in `dtype` (an 8B one in float32 is 32 GB).
    model = transformers.AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32 if kw else dtype, **kw)
    return model.to(device=device, dtype=dtype).eval()


def torch_bench(model, batch: int, args) -> dict:
    """transformers generate() with a static cache: decode tok/s from (G tokens - 1 token) time.

    On CUDA, transformers (5.x, generation/utils.py `_valid_auto_compile_criteria`) compiles the
    decoding forward with torch.compile by itself when the cache is static, so these are the
    "static cache + torch.compile" figures; wrapping forward in torch.compile once more made
    generate() fail ("accessing tensor output of CUDAGraphs that has been overwritten", H100)."""
    import torch
    ids = torch.randint(0, model.config.vocab_size, (batch, args.prompt_len), device=args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    def run(n: int) -> float:
        sync()
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, cache_implementation="static")
        sync()
        return time.perf_counter() - t

    run(args.gen_len)                                       # warm-up (and compile)
    one = min(run(1) for _ in range(args.runs))
    full = min(run(args.gen_len) for _ in range(args.runs))
    return {"prefill_tok_s": round(batch * args.prompt_len / one),
            "decode_tok_s": round(batch * (args.gen_len - 1) / (full - one), 1)}


def torch_rows(src: Path, batches, args, save: Path | None = None, label: str = "torch") -> dict:
    """transformers fp16 with a static cache on `src` (torch_bench) at each of `batches`, the model
    loaded once and freed after (its GPU memory back for what runs next); `save`: rows kept as they
    come (recorder)."""
    import gc

    import torch
    t = time.perf_counter()
    model = transformers_model(src, torch.float16, args.device)
    result = {"load_s": round(time.perf_counter() - t, 1)}
    record = recorder(result, save, label)
    for b in batches:
        record(f"batch {b}", torch_bench(model, b, args))
    del model
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return result


def recorder(result: dict, save: Path | None, label: str):
    """record(key, value): result[key] = value, printed, and `result` rewritten to `save` (if any) at
    once, so that a process cut short or failing keeps the rows it measured. Each printed line
    starts with the seconds since the process started (where a slow process spends them)."""
    def record(key: str, value) -> None:
        result[key] = value
        print(f"[{time.monotonic() - _STARTED:.0f} s]", label, key, json.dumps(value, default=str), flush=True)
        if save is not None:
            save.write_text(json.dumps(result, indent=1, default=str))
    return record
