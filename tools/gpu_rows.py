"""tools/gpu_checks.py's rows beside the benchmarks: the machine's facts, the `gpu` tests, SmolLM2's
numerics against transformers, the kernel variants side by side, sampling on the device, `kiln
serve` under load, speculative decoding and the serving limits."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from gpu_builds import (
    ROOT, VARIANT_BATCHES, VARIANT_LAYERS, VARIANTS, compile_timed, llama8b_checkpoint, load_state, save_state)
from gpu_timing import bench_runner, gpu_kernel_times, prefill_sequences, prefilled, step_ms, transformers_model


PROMPTS = ["Name the largest planet in the solar system.", "What is the chemical symbol for gold?",
           "What is the capital of Japan?"]


def facts(args) -> dict:
    import torch
    import tvm
    from importlib.metadata import version

    from kiln.targets.gpu import tensorize_works
    out = {"tvm": tvm.__version__, "tvm_ffi": version("apache-tvm-ffi"), "torch": torch.__version__,
           "transformers": version("transformers"),
           "python": sys.version.split()[0], "tensor_cores": tensorize_works()}
    if args.device == "cuda":
        dev = tvm.cuda(0)
        out.update(gpu=torch.cuda.get_device_name(0), compute=dev.compute_version if dev.exist else None)
        out["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
    return out


GPU_TESTS = "tests/numerics/test_cuda_variants.py"


GPU_TESTS_S = 100           # `all`'s seconds for the gpu tests (each builds its kernels: ~15-20 s a test)


# Processes the gpu tests run in where pytest-xdist is there (gpu_session.py stages it): their time
# is mostly TVM's single-threaded builds of tiny models (2026-11-28, one process: 5 of 30 tests in 100 s).
GPU_TEST_WORKERS = 6


# The `gpu` tests, those that decide what ships first (the candidate's: dependent launch against the
# plain build; the levers' fusions, glu and norm, against the plain build; then the kernels against
# numpy: MMA GEMV, split-K tiles, the library GEMM prefill; then the attention kernels, Gemma 2; then
# the sink families, whose GPU attention over the KV cache kiln owns no GPU has run yet), the slow
# whole-preset comparisons (a compile of each CUDA preset) and the other families last: a run cut short
# has the first.
GPU_TEST_ORDER = ("step_graphs", "dependent_launch", "mma_gemv", "fusions_match", "tensor_core_matmul", "library_gemm",
                  "decode_attention_kernel", "prefill_attention_kernel", "gemma2", "[gpt-oss]", "[granite-swa]",
                  "[flint]", "q4_gemv", "sample_tokens", "speculative", "row_branches", "preset_matches",
                  "family_matches")


def gpu_tests(args, seconds: float | None = None) -> dict:
    """The `gpu`-marked tiny-model tests (GPU_TESTS), in GPU_TEST_ORDER, within `seconds`; the log
    goes to --out."""
    # -P: the checkout's kiln/ must not shadow the package laid out in .gpu/site (gpu_session.py).
    pytest = [sys.executable, "-P", "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider"]
    listed = subprocess.run([*pytest, "--co", "-q", GPU_TESTS], cwd=ROOT, capture_output=True, text=True).stdout
    ids = [line.strip() for line in listed.splitlines() if line.startswith(GPU_TESTS + "::")]
    rank = lambda i: next((n for n, key in enumerate(GPU_TEST_ORDER) if key in i), len(GPU_TEST_ORDER))  # noqa: E731
    ids = sorted(ids, key=rank) or [GPU_TESTS]
    import importlib.util
    workers = min(GPU_TEST_WORKERS, max(1, (os.cpu_count() or 1) - 2))
    parallel = ["-n", str(workers)] if workers > 1 and importlib.util.find_spec("xdist") is not None else []
    log = Path(args.out) / "gpu_tests.log"
    with log.open("w") as f:
        # A session of its own: at the time limit its workers go too, not on beside the next steps' timings.
        proc = subprocess.Popen([*pytest, "-q", *parallel, *ids], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = f"timed out after {seconds:.0f} s"
    return {"rc": rc, "tests": len(ids), "processes": int(parallel[1]) if parallel else 1,
            "tail": log.read_text().strip().splitlines()[-1:]}


def references(src: Path, args) -> tuple:
    """transformers fp32 and fp16 on --device: the reference and the error the issue allows twice of."""
    import torch
    return transformers_model(src, torch.float32, args.device), transformers_model(src, torch.float16, args.device)


def scheme_numerics(src: Path, quant: str, refs: tuple, args, compiled: dict | None = None) -> dict:
    """One scheme's max |logit - transformers fp32| over PROMPTS (every position) beside transformers
    fp16's own, and its greedy agreement with transformers fp16 up to the first near-tie.
    `compiled`: {"artifact", "compile_s"} of a compile already done."""
    import torch

    from kiln import Engine, EngineConfig
    from kiln.runtime import Artifact
    from kiln.runtime.model_runner import ModelRunner
    ref32, ref16 = refs

    def last(model, seq):
        with torch.no_grad():
            return model(torch.tensor([seq], device=args.device)).logits[0].float().cpu().numpy()

    if compiled and "artifact" in compiled:
        art, seconds = Path(compiled["artifact"]), compiled["compile_s"]
    else:
        art, seconds = compile_timed(src, quant, args)
    engine, rows = Engine(art, EngineConfig(max_num_seqs=1)), []      # its chat template only
    for prompt in PROMPTS:
        ids = engine.render_chat([{"role": "user", "content": prompt}])
        runner = ModelRunner(Artifact.load(art), max_num_seqs=1)
        runner.add_sequence(0)
        got = runner.verify(0, ids)
        f32, f16 = last(ref32, ids), last(ref16, ids)
        seq, logits, agreed = list(ids), got[-1], 0
        for _ in range(args.greedy):
            expected = last(ref16, seq)[-1]
            top2 = np.sort(expected)[-2:]
            if top2[1] - top2[0] < 0.5 or int(np.argmax(logits)) != int(np.argmax(expected)):
                break
            agreed += 1
            seq.append(int(np.argmax(expected)))
            logits = runner.decode([0], [seq[-1]])[0]
        rows.append({"error_vs_fp32": float(np.abs(got - f32).max()),
                     "last_position_error": float(np.abs(got[-1] - f32[-1]).max()),
                     "transformers_fp16_error": float(np.abs(f16 - f32).max()), "greedy_agreed": agreed})
    worst = max(r["error_vs_fp32"] for r in rows)
    allowed = 2 * max(r["transformers_fp16_error"] for r in rows)
    return {"compile_s": round(seconds, 1), "max_error": worst, "within_2x_fp16": worst <= allowed, "prompts": rows}


def variants(args, deadline: float | None = None) -> dict:
    """The GPU matmuls' row-count branches (VARIANTS) side by side on the 2-layer 8B-shaped model, the
    same weights in each: per decode step at VARIANT_BATCHES sequences, the GPU time of the matmul
    kernels, the busy and wall time (CUPTI; on a CPU the step time), and the largest logit
    difference from `base` (a wrong schedule shows here, not only in the timing). variants.json is
    rewritten after each variant (a run cut short keeps the ones done); by default within --budget.
    The variants measured (and base's logits) are kept in --work: run again on the same machine, it
    measures only the others."""
    import gc
    if deadline is None:
        deadline = time.monotonic() + args.budget
    src, _ = llama8b_checkpoint(args, layers=VARIANT_LAYERS)
    batches = (1, 2) if args.quick else VARIANT_BATCHES
    kept, logits_file = Path(args.work) / "variants-state.json", Path(args.work) / "variants-base-logits.npz"
    result = {v: rows for v, rows in load_state(kept, args).get("variants", {}).items() if "skipped" not in rows}
    reference = {int(k): v for k, v in np.load(logits_file).items()} if result and logits_file.is_file() else {}
    for variant, spec in VARIANTS.items():
        if variant in result and (reference or variant != "base"):
            print(variant, "measured by an earlier call", flush=True)
            continue
        if deadline is not None and time.monotonic() > deadline - 45:
            result[variant] = {"skipped": "out of time"}
            continue
        art, seconds = compile_timed(src, "q4f16", args, variant)
        rows = {"compile_s": round(seconds, 1)}
        wanted = batches if args.quick else spec.get("batches", batches)
        options = spec.get("runner", {}) if args.device == "cuda" else {}      # step graphs: CUDA's
        runner = bench_runner(art, max(wanted), args, **options)   # one per variant: loading it cost more than a row
        for b in (b for b in batches if b in wanted):
            t = time.perf_counter()
            ids = prefill_sequences(runner, b, args)
            logits = runner.decode(ids, [5] * b)
            if variant == "base":
                reference[b] = logits
            row = {"max_diff_vs_base": float(np.abs(logits - reference[b]).max()) if b in reference else None}
            if args.device == "cuda":
                times = gpu_kernel_times(runner, ids, top=4)
                row.update({k: times[k] for k in ("wall_ms", "busy_ms", "matmul_ms", "attention_ms", "kernels")})
                row["covered_ms"] = times["idle"]["covered_ms"]
            else:
                row["tpot_ms"] = step_ms(runner, ids)
            for i in ids:
                runner.remove_sequence(i)
            row["row_s"] = round(time.perf_counter() - t, 1)
            rows[f"batch {b}"] = row
            print(variant, f"batch {b}", json.dumps(row), flush=True)
        del runner
        gc.collect()
        result[variant] = rows
        shutil.rmtree(art, ignore_errors=True)
        if variant == "base":
            np.savez(logits_file, **{str(b): v for b, v in reference.items()})
        (Path(args.out) / "variants.json").write_text(json.dumps(result, indent=1, default=str))
        save_state(kept, args, variants=result)
    return result


def sampled_decode(art: Path, batch: int, args) -> dict:
    """ms per sampled decode step (temperature 0.7, top-p 0.9, top-k 50) at `batch` sequences: the
    logits copied back to the host Sampler, against sample_tokens drawing on the device
    (models/sampling.py), and how often the two paths' tokens agree on the same logits."""
    from types import SimpleNamespace

    import tvm

    from kiln.runtime import SamplingParams
    from kiln.runtime.sampler import Sampler, device_params
    sys.path.insert(0, str(ROOT / "tests"))
    from sampling_cases import host_tokens                  # the host Sampler's token for a params row
    runner, ids = prefilled(art, batch, args)
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=50)
    steps = max(2, min(16, args.gen_len // 2))
    sampler, result = Sampler(), {}
    for path in ("host", "device"):
        reqs = [SimpleNamespace(params=params, rng=np.random.default_rng(i), grammar=None, prompt_ids=[],
                                output_ids=[]) for i in ids]
        tokens = [5] * batch
        for n in range(steps + 2):                          # two warm-up steps
            if n == 2:
                runner.device.sync()
                t = time.perf_counter()
            if path == "host":
                tokens = sampler.sample(runner.decode(ids, tokens), sampler.prepare(reqs)).tokens
            else:
                tokens = [int(x) for x in runner.decode_sampled(ids, tokens, device_params(reqs))]
        result[f"{path}_ms"] = round((time.perf_counter() - t) / steps * 1e3, 3)
    logits_dev = runner._decode(ids, tokens)[0]
    rows = device_params([SimpleNamespace(params=params, rng=np.random.default_rng(i)) for i in ids])
    on_device = runner._fn["sample_tokens"](logits_dev, tvm.runtime.tensor(rows, runner.device)).numpy()
    host = host_tokens(logits_dev.numpy(), rows)
    result["same_token_rows"] = f"{int(np.sum(on_device == host))}/{batch}"
    return result


def served(art: Path, streams: list[int], args) -> dict:
    """`kiln serve` on the artifact under each count of streamed completions: tokens a second once
    all are decoding (beside `kiln bench`'s decode rows), the server's host CPU a token (event loop;
    the engine and the rest) and the device's wait between forwards (host_gap_us_per_forward);
    then at the fewest and the most streams with `--overlap off` (what the overlapped step wins) and
    with `--engine-process off` (what the engine's own process wins), and at the most with
    `--stream-interval 4` (what the event loop's chunks cost) and `--api-processes 2` (whether one HTTP
    process's Python bounds the rate)."""
    from serve_load import serve_and_load
    gen_len = 32 if args.quick else 128
    on = ("--overlap", "on", "--engine-process", "on")

    def rows(counts: list[int], *flags: str) -> list[dict]:
        return serve_and_load(str(art), counts, gen_len=gen_len, start_timeout=180, extra=flags)["rows"]
    result = serve_and_load(str(art), streams, gen_len=gen_len, start_timeout=180, extra=on)
    ends = list(dict.fromkeys((streams[0], streams[-1])))
    result["overlap off"] = rows(ends, "--overlap", "off", "--engine-process", "on")
    result["engine thread"] = rows(ends, "--overlap", "on", "--engine-process", "off")
    result["stream interval 4"] = rows(streams[-1:], *on, "--stream-interval", "4")
    result["2 HTTP processes"] = rows(streams[-1:], *on, "--api-processes", "2")
    return result


def speculative(art: Path, args) -> dict:
    """Speculative decoding by prompt lookup against plain decoding, task by task
    (tools/bench_speculative.py): whether a batch_verify forward of k + 1 tokens costs about one decode
    step on the GPU (on a CPU it costs 1.4x at 2 tokens and 2.3x at 6), i.e. which K to recommend."""
    from bench_speculative import measure
    return measure(str(art), [3, 5], rounds=1 if args.quick else 2, max_tokens=32 if args.quick else 128)


def draft_model(art: Path, draft: Path, args) -> dict:
    """Speculative decoding with a draft model against plain decoding (tools/bench_speculative.py):
    SmolLM2 q0f16 served, its q4f16 build drafting (the same tokenizer). Both are overhead-bound on a
    GPU at this size, so the row says what a draft step costs beside a checking forward, and how many
    drafted tokens a 4-bit copy of the model gets kept; an 8B's gain follows from its step time."""
    from bench_speculative import measure
    return measure(str(art), [], rounds=1 if args.quick else 2, max_tokens=32 if args.quick else 128,
                   draft_model=str(draft), draft_tokens=[2, 4])


def serving_limits(art: Path) -> dict:
    """What an engine (`kiln serve`) takes from the machine by default, and its one-line refusal of
    more sequences than the artifact was compiled for."""
    import gc

    from kiln.runtime import Engine, EngineConfig
    engine = Engine(art)
    runner, layout = engine.runner, engine.artifact.config.kv_cache
    result = {"max_num_seqs": runner.max_num_seqs, "kv_tokens": runner.max_total_tokens,
              "kv_gib": round(runner.max_total_tokens * layout.bytes_per_token / 2**30, 2),
              "activation_gib": round(engine.artifact.config.activation_bytes / 2**30, 3)}
    over = runner.max_batch_size + 1
    del engine, runner
    gc.collect()
    try:
        Engine(art, EngineConfig(max_num_seqs=over))
        result["over_limit"] = "accepted (a defect)"
    except ValueError as e:
        result["over_limit"] = str(e)
    return result
