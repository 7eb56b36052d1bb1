"""The CUDA issue's checks and benchmarks, in a few calls on a lent GPU machine.

Set up with tools/gpu_session.py first (`. .gpu/env.sh`). Each command prints a table and writes
DIR/<command>.json (--out, e.g. $OUT) so the figures come back with the call:

    python3 tools/gpu_checks.py numerics --out $OUT   # ~5 min: facts, the `gpu` tests, SmolLM2 numerics
    python3 tools/gpu_checks.py bench --out $OUT      # ~5 min: SmolLM2 kiln vs torch fp16, batch 1..256
    python3 tools/gpu_checks.py bench8b --out $OUT    # ~8 min: a random Llama-3-8B-architecture model, q4f16

numerics: the tiny-model CUDA tests (tests/numerics/test_cuda_variants.py, marker `gpu`), then
SmolLM2 compiled for --target with as-stored (float32 compute), q0f16 and as-stored-f16: max
|logit - transformers fp32| over 3 chat prompts (every position) against transformers fp16's
own, and greedy tokens against transformers fp16 up to the first near-tie (top-2 gap < 0.5).
The issue asks for float16 within 2x of transformers fp16's error.

bench: `kiln bench` (prompt 128, gen 128) at batch 1, 16, 64 and 256 for q4f16 and
as-stored-f16, against transformers fp16 generate() with a static cache (batch 1 also with
torch.compile), and the batch-1 floor: the artifact's weight bytes over the device-to-device
copy bandwidth torch measures.

bench8b: writes a random-init Llama-3-8B-architecture checkpoint (fp16 safetensors), compiles it
q4f16 (compile and weight-conversion time), and measures batch-1 decode against the floor (and
its slowest kernels), batch-64 decode and 16 x 128-token prefill.

`--target cpu --device cpu --quick` runs the same code on a CPU machine (a dry run: small batches,
few tokens, no torch.compile), which is how this file is tested without a GPU.

This file is the commands; what they run lives beside it: gpu_builds.py (the models, VARIANTS,
the prebuilt libraries), gpu_timing.py (bench rows, CUPTI kernel times, the host's enqueue, the
torch reference), gpu_rows.py (facts, the `gpu` tests, numerics, variants, sampling, serving),
gpu_8b.py (the 8B-architecture rows) and gpu_all.py (`all` within its budget).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))     # its modules beside it (-P leaves the folder out)

from gpu_8b import lever8b, measure8b, prep8b, torch8b  # noqa: E402
from gpu_all import run_all  # noqa: E402
from gpu_builds import ROOT, compile_timed, prebuild, smollm2_gguf  # noqa: E402
from gpu_rows import facts, gpu_tests, references, sampled_decode, scheme_numerics, serving_limits, variants  # noqa: E402
from gpu_timing import (  # noqa: E402
    bench_runner, copy_bandwidth_gbs, kiln_bench, step_graph_rows, torch_bench, transformers_model, weight_bytes)


def numerics(args) -> dict:
    result = {"facts": facts(args)}
    if not args.quick:
        result["gpu_tests"] = gpu_tests(args)
        print("gpu tests:", result["gpu_tests"], flush=True)
    src = smollm2_gguf()
    refs = references(src, args)
    for quant in ("as-stored", "q0f16", "as-stored-f16"):
        result[quant] = scheme_numerics(src, quant, refs, args)
        print(quant, json.dumps(result[quant]), flush=True)
    return result


def bench_cmd(args) -> dict:
    import torch
    src = smollm2_gguf()
    bw = copy_bandwidth_gbs(args.device)
    result = {"facts": facts(args), "copy_bandwidth_gbs": round(bw)}
    batches = [1, 4] if args.quick else [1, 16, 64, 256]
    arts = {}
    for quant in ("q4f16", "as-stored-f16"):
        art, seconds = arts[quant] = compile_timed(src, quant, args, max_batch_size=max(batches))
        floor = bw * 1e9 / weight_bytes(art)
        rows = {b: kiln_bench(art, b, args) for b in batches}
        result[f"kiln {quant}"] = {"compile_s": round(seconds, 1), "batch1_floor_tok_s": round(floor),
                                   "batch1_pct_of_floor": round(100 * rows[1]["decode_tok_s"] / floor, 1),
                                   **{f"batch {b}": r for b, r in rows.items()}}
        print(quant, json.dumps(result[f"kiln {quant}"]), flush=True)
    if args.device == "cuda":               # overhead-bound at this size: what a step as one launch gives
        q4 = arts["q4f16"][0]
        result["kiln q4f16 step graphs"] = {"batch 1": step_graph_rows(bench_runner(q4, 1, args), q4, args)}
        print("step graphs", json.dumps(result["kiln q4f16 step graphs"]), flush=True)
    result["sampled decode"] = {f"batch {b}": sampled_decode(arts["q4f16"][0], b, args)
                                for b in dict.fromkeys((batches[0], *batches[-2:]))}
    print("sampled decode", json.dumps(result["sampled decode"]), flush=True)
    result["serving limits"] = serving_limits(art)
    print("serving limits", json.dumps(result["serving limits"]), flush=True)
    model = transformers_model(src, torch.float16, args.device)
    result["torch fp16 static"] = {f"batch {b}": torch_bench(model, b, args) for b in batches[:3]}
    print("torch", json.dumps(result["torch fp16 static"]), flush=True)
    return result


def bench8b(args) -> dict:
    prep = prep8b(args)
    print("8b compile", json.dumps(prep), flush=True)
    art = Path(prep["artifact"])
    result = {"facts": facts(args), **prep, **measure8b(art, args)}
    print(json.dumps(result), flush=True)
    return result


def _result_file(args) -> Path:
    """Where a command writes its result: --out/<--json-name or the command>.json."""
    return Path(args.out) / f"{args.json_name or args.command}.json"


def torch8b_cmd(args) -> dict:
    """torch8b in a process of its own (`all`: its rows kept if the call's time runs out in it)."""
    return torch8b(args, save=_result_file(args))


def measure8b_cmd(args) -> dict:
    """measure8b of --artifact (its build named --tag), without transformers: how `all` measures a
    build whose kernels have never run, in a process of its own."""
    return measure8b(Path(args.artifact), args, torch_too=False, tag=args.tag, save=_result_file(args))


def lever8b_cmd(args) -> dict:
    """lever8b: the LEVERS_8B build --tag of the 8B artifact --artifact (prep8b's) at batch 1, in a
    process of its own (`all`: a lever's kernels that fault cost only its row)."""
    return lever8b(Path(args.artifact), args.tag, args, save=_result_file(args))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["all", "numerics", "bench", "bench8b", "variants", "prep8b", "prebuild",
                                        "measure8b", "torch8b", "lever8b"])
    ap.add_argument("--out", default=".", help="where <command>.json goes (on the device: $OUT)")
    ap.add_argument("--work", default=str(ROOT / ".gpu" / "work"), help="artifacts and checkpoints [.gpu/work]")
    ap.add_argument("--target", default="cuda-sm90")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where torch runs the reference")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--greedy", type=int, default=8, help="greedy tokens compared per prompt (numerics)")
    ap.add_argument("--budget", type=float, default=540, help="seconds `all` may take [540]")
    ap.add_argument("--quick", action="store_true", help="a dry run: small batches and models, no gpu tests")
    ap.add_argument("--artifact", help="measure8b, lever8b: the 8B artifact to measure")
    ap.add_argument("--tag", default="base", help="measure8b: the build's name in its results; lever8b: the "
                                                  "LEVERS_8B build [base]")
    ap.add_argument("--json-name", help="the result's file name in --out, without .json [the command's]")
    args = ap.parse_args()
    if args.command in ("measure8b", "lever8b") and not args.artifact:
        ap.error(f"{args.command} measures an artifact: pass --artifact DIR (an 8B q4f16 artifact, e.g. prep8b's)")
    if args.quick:
        args.prompt_len, args.gen_len, args.runs = min(args.prompt_len, 16), min(args.gen_len, 8), 1
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    result = {"all": run_all, "numerics": numerics, "bench": bench_cmd, "bench8b": bench8b, "variants": variants,
              "prep8b": prep8b, "prebuild": prebuild, "measure8b": measure8b_cmd,
              "torch8b": torch8b_cmd, "lever8b": lever8b_cmd}[args.command](args)
    _result_file(args).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
