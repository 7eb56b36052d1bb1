"""Serving figures for one artifact, through the real engine (scheduler, prefix cache, sampler).

    python tools/bench_serving.py ARTIFACT_OR_MODEL [--concurrency 16] [--system-len 512]

1. Aggregate decode throughput with N concurrent requests vs one request alone.
2. Time to first token for a request whose long system prompt is already in the
   prefix cache (hit) vs the same request on a cold cache (miss); with recurrent
   layers the second request to begin alike caches the state where they part.
3. Time to first token for a conversation's second turn, right after its first
   (hit: the cached conversation continued) vs on a cold cache (miss).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def decode_throughput(engine, concurrency: int, prompt_len: int, gen_len: int) -> float:
    """Generated tokens per second once every request is decoding (prefill excluded)."""
    from kiln import SamplingParams
    rng = np.random.default_rng(concurrency)
    prompts = rng.integers(100, engine.runner.vocab_size - 100, size=(concurrency, prompt_len)).tolist()
    params = SamplingParams(max_tokens=gen_len, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(p, params, index=i)
    while any(s.is_prefill for s in engine.scheduler.running) or engine.scheduler.num_waiting:
        engine.step()                                      # finish every prefill first
    start, tokens = time.perf_counter(), 0
    while engine.has_work:
        tokens += len(engine.step())
    return tokens / (time.perf_counter() - start)


def ttft(engine, prompt: list[int]) -> float:
    from kiln import SamplingParams
    start = time.perf_counter()
    stream = engine.generate_stream(prompt, SamplingParams(max_tokens=1, temperature=0.0))
    next(stream)
    elapsed = time.perf_counter() - start
    stream.close()
    return elapsed


def prefix_ttft(engine, system_len: int, runs: int) -> tuple[float, float, float]:
    """Median TTFTs of three requests that begin with the same system prompt, on a cold cache: the first
    computes it all (miss); the second begins alike (a hit, or with recurrent layers the request whose
    prefill stops once where the two part, to cache that state: a checkpoint); the third (a hit)."""
    rng = np.random.default_rng(0)
    miss, second, hit = [], [], []
    for run in range(runs):
        system = rng.integers(100, engine.runner.vocab_size - 100, size=system_len).tolist()
        _clear_cache(engine)
        miss.append(ttft(engine, system + [11, 12, 13, 14]))            # cold: full prefill
        second.append(ttft(engine, system + [21, 22, 23, 24, 25]))
        hit.append(ttft(engine, system + [31, 32, 33]))                 # starts where the system prompt ends
    return statistics.median(miss), statistics.median(second), statistics.median(hit)


def turn_ttft(engine, turn_len: int, runs: int) -> tuple[float, float]:
    """Median TTFTs of a conversation's second turn (the first turn, its 32-token answer and 8 new tokens)
    on a cold cache (miss) and right after the first turn ran (hit: it continues the cached conversation)."""
    from kiln import SamplingParams
    rng = np.random.default_rng(1)
    miss, hit = [], []
    for run in range(runs):
        first = rng.integers(100, engine.runner.vocab_size - 100, size=turn_len).tolist()
        _clear_cache(engine)
        answer = engine.generate(first, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)).token_ids
        second = first + answer + rng.integers(100, engine.runner.vocab_size - 100, size=8).tolist()
        hit.append(ttft(engine, second))
        _clear_cache(engine)
        miss.append(ttft(engine, second))
    return statistics.median(miss), statistics.median(hit)


def _clear_cache(engine) -> None:
    for seq_id in engine.scheduler.clear_prefix_cache():
        engine.runner.remove_sequence(seq_id)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--system-len", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    import kiln
    engine = kiln.load(args.model)
    decode_throughput(engine, 2, 16, 4)                                  # warm-up
    single = decode_throughput(engine, 1, args.prompt_len, args.gen_len)
    many = decode_throughput(engine, args.concurrency, args.prompt_len, args.gen_len)
    miss, second, hit = prefix_ttft(engine, args.system_len, args.runs)
    turn_miss, turn_hit = turn_ttft(engine, args.system_len, args.runs)
    print(f"{engine.artifact.name}")
    print(f"decode, 1 request:            {single:8.1f} tok/s")
    print(f"decode, {args.concurrency:2d} concurrent:       {many:8.1f} tok/s aggregate  ({many / single:.1f}x)")
    print(f"TTFT, {args.system_len}-token shared prefix: miss {miss * 1e3:7.1f} ms, second {second * 1e3:7.1f} ms, "
          f"hit {hit * 1e3:6.1f} ms ({miss / hit:.1f}x lower on a hit)")
    print(f"TTFT, a second turn after {args.system_len} + 32 tokens: miss {turn_miss * 1e3:7.1f} ms, hit "
          f"{turn_hit * 1e3:6.1f} ms ({turn_miss / turn_hit:.1f}x lower on a hit)")
    print(json.dumps({"decode_1": single, f"decode_{args.concurrency}": many, "ttft_miss_ms": miss * 1e3,
                      "ttft_second_ms": second * 1e3, "ttft_hit_ms": hit * 1e3, "turn_miss_ms": turn_miss * 1e3,
                      "turn_hit_ms": turn_hit * 1e3}))


if __name__ == "__main__":
    main()
