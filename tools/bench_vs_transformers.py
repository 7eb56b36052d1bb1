"""kiln vs transformers fp32 on the same model, same machine, same run.

    python tools/bench_vs_transformers.py smollm2 --prompt-len 128 --gen-len 64

Compiles (timed) unless given an artifact, runs `kiln bench` in-process, then
transformers in float32 with its KV cache (torch threads = cores), and prints
one table with ratios and the batch-1 decode bandwidth floor
(weight bytes / read bandwidth, measured here with numpy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np


def read_bandwidth_gbs(size_mb: int = 512) -> float:
    a = np.ones(size_mb * (1 << 20) // 8)
    best = min(_timed(a.sum) for _ in range(5))
    return a.nbytes / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_transformers(model_arg: str, prompt_len: int, gen_len: int, runs: int) -> dict:
    import torch
    import transformers
    from kiln import models
    path = models.resolve(model_arg)
    kw = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
    root = str(path.parent if path.suffix == ".gguf" else path)
    model = transformers.AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32, **kw).eval()
    torch.set_num_threads(os.cpu_count() or 1)
    rng = np.random.default_rng(0)
    prefill, steps = [], []
    for run in range(runs + 1):
        ids = torch.tensor(rng.integers(0, model.config.vocab_size, size=(1, prompt_len)))
        with torch.no_grad():
            t = time.perf_counter()
            out = model(ids, use_cache=True)
            p = time.perf_counter() - t
            past, tok, times = out.past_key_values, out.logits[:, -1:].argmax(-1), []
            for _ in range(gen_len):
                t = time.perf_counter()
                out = model(tok, past_key_values=past, use_cache=True)
                times.append(time.perf_counter() - t)
                past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        if run:
            prefill.append(p)
            steps.append(statistics.median(times))
    return {"prefill_tok_s": prompt_len / statistics.median(prefill), "decode_tok_s": 1 / statistics.median(steps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="model (compiled q0f32 for the CPU) or artifact dir")
    ap.add_argument("--quant", default="q0f32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    import kiln
    from kiln.runtime.bench import bench
    compile_s = None
    art = args.model
    if not kiln.is_artifact(art):
        t = time.perf_counter()
        art = kiln.compile(args.model, quant=args.quant, output=f"dist/bench-{args.quant}-cpu")
        compile_s = time.perf_counter() - t
    engine = kiln.Engine(art)
    k = bench(engine.runner, args.prompt_len, args.gen_len, 1, args.runs).as_dict()
    src = engine.artifact.config["model"]["source"]["path"]
    hf = bench_transformers(src, args.prompt_len, args.gen_len, args.runs)
    weight_bytes = sum((engine.artifact.path / "params" / f).stat().st_size
                       for f in os.listdir(engine.artifact.path / "params") if f.endswith(".bin"))
    bw = read_bandwidth_gbs()
    floor = bw * 1e9 / weight_bytes
    print(f"\n{engine.artifact.name}  (prompt {args.prompt_len}, gen {args.gen_len}, median of {args.runs}, "
          f"{os.cpu_count()} cores)")
    if compile_s is not None:
        print(f"compile time: {compile_s:.1f} s")
    print(f"{'':24}{'kiln':>10}{'transformers fp32':>20}{'kiln / hf':>12}")
    for key, label in (("prefill_tok_s", "prefill tok/s"), ("decode_tok_s", "decode tok/s (batch 1)")):
        print(f"{label:24}{k[key]:10.1f}{hf[key]:20.1f}{k[key] / hf[key]:12.2f}")
    print(f"bandwidth floor: {weight_bytes / 1e6:.0f} MB of weights at {bw:.1f} GB/s read -> {floor:.0f} tok/s "
          f"batch-1 decode; kiln reaches {100 * k['decode_tok_s'] / floor:.0f}% of it")
    print(json.dumps({"kiln": k, "transformers": hf, "floor_tok_s": floor, "compile_s": compile_s}))


if __name__ == "__main__":
    main()
