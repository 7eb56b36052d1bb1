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
import time

from _bench_common import bench_transformers, read_bandwidth_gbs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="model (compiled q0f32 for the CPU) or artifact dir")
    ap.add_argument("--source", help="the model transformers loads, when MODEL is an artifact (artifacts record "
                                     "only their source's file name)")
    ap.add_argument("--quant", default="q0f32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    import kiln
    from kiln.runtime.bench import bench, decode_read_bytes
    compile_s = None
    art = args.model
    if not kiln.is_artifact(art):
        t = time.perf_counter()
        art = kiln.compile(args.model, quant=args.quant, output=f"dist/bench-{args.quant}-cpu", force=True)
        compile_s = time.perf_counter() - t
    engine = kiln.Engine(art)
    k = bench(engine.runner, args.prompt_len, args.gen_len, 1, args.runs).as_dict()
    src = args.model if art is not args.model else args.source
    if src is None:
        raise SystemExit("MODEL is an artifact: pass --source with the model it was compiled from")
    hf = bench_transformers(src, args.prompt_len, args.gen_len, args.runs)
    weight_bytes = decode_read_bytes(engine.artifact.path)
    bw = read_bandwidth_gbs()
    floor = bw * 1e9 / weight_bytes
    print(f"\n{engine.artifact.name}  (prompt {args.prompt_len}, gen {args.gen_len}, median of {args.runs}, "
          f"{os.cpu_count()} cores)")
    if compile_s is not None:
        print(f"compile time: {compile_s:.1f} s")
    print(f"{'':24}{'kiln':>10}{'transformers fp32':>20}{'kiln / hf':>12}")
    for key, label in (("prefill_tok_s", "prefill tok/s"), ("decode_tok_s", "decode tok/s (batch 1)")):
        print(f"{label:24}{k[key]:10.1f}{hf[key]:20.1f}{k[key] / hf[key]:12.2f}")
    print(f"bandwidth floor: {weight_bytes / 1e6:.0f} MB of weights a step at {bw:.1f} GB/s read -> {floor:.0f} tok/s "
          f"batch-1 decode; kiln reaches {100 * k['decode_tok_s'] / floor:.0f}% of it")
    print(json.dumps({"kiln": k, "transformers": hf, "floor_tok_s": floor, "compile_s": compile_s}))


if __name__ == "__main__":
    main()
