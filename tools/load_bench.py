"""Open-loop load test of a running kiln (or any OpenAI-compatible) server.

    kiln serve dist/smollm2-q0f32-cpu --port 8000 &
    python tools/load_bench.py --url http://127.0.0.1:8000 --rate 4 --num-requests 64 \
        --prompt-len 128 --output-len 64 --output-dist exponential

Requests arrive as a Poisson process at --rate per second (open loop: arrivals
never wait for earlier replies), each a streaming /v1/completions call with
`ignore_eos` so it generates exactly its drawn output length. Prompts are
random words, so their token count is approximate; the usage chunk
(stream_options.include_usage) gives the real counts. Prints a table and one
JSON line: request and token throughput, TTFT and TPOT p50/p99.

Bounded: --num-requests requests and --max-duration seconds at most (requests
still running then are cancelled and counted as failed). Only --url is contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass

import httpx

_WORDS = ("the quick brown fox jumps over a lazy dog while seven small birds sing about "
          "rivers mountains cities and bright summer evenings").split()


@dataclass
class Outcome:
    ok: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft: float | None = None          # seconds from send to the first generated text
    tpot: float | None = None          # mean seconds per output token after the first
    latency: float = 0.0
    error: str = ""


def draw_length(rng: random.Random, mean: int, dist: str) -> int:
    if dist == "fixed":
        return max(1, mean)
    if dist == "uniform":
        return rng.randint(max(1, mean // 2), max(1, mean + mean // 2))
    return max(1, round(rng.expovariate(1 / mean)))      # exponential


async def one_request(client: httpx.AsyncClient, url: str, model: str | None, prompt: str,
                      max_tokens: int) -> Outcome:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    if model:
        body["model"] = model
    start = time.perf_counter()
    first: float | None = None
    usage: dict = {}
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                return Outcome(False, error=f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return Outcome(False, error=str(chunk["error"].get("message")))
                if first is None and any(c.get("text") for c in chunk.get("choices") or []):
                    first = time.perf_counter()
                usage = chunk.get("usage") or usage
    except httpx.HTTPError as e:
        return Outcome(False, error=f"{type(e).__name__}: {e}")
    end = time.perf_counter()
    n = int(usage.get("completion_tokens", 0))
    tpot = (end - first) / (n - 1) if first is not None and n > 1 else None
    return Outcome(True, int(usage.get("prompt_tokens", 0)), n, None if first is None else first - start, tpot,
                   end - start)


async def run(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.num_requests, max_keepalive_connections=64)
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(args.max_duration), limits=limits) as client:
        model = args.model or await served_model(client, args.url)
        tasks: list[asyncio.Task] = []
        start = time.perf_counter()
        deadline = start + args.max_duration
        for _ in range(args.num_requests):
            if time.perf_counter() >= deadline:
                break
            prompt = " ".join(rng.choice(_WORDS) for _ in range(draw_length(rng, args.prompt_len, args.prompt_dist)))
            max_tokens = draw_length(rng, args.output_len, args.output_dist)
            tasks.append(asyncio.create_task(one_request(client, args.url, model, prompt, max_tokens)))
            await asyncio.sleep(min(rng.expovariate(args.rate), max(0.0, deadline - time.perf_counter())))
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - start
    outcomes = [t.result() if t in done else Outcome(False, error="cancelled at --max-duration") for t in tasks]
    outcomes += [Outcome(False, error="not sent before --max-duration")] * (args.num_requests - len(tasks))
    return summarize(outcomes, wall, args)


async def served_model(client: httpx.AsyncClient, url: str) -> str | None:
    resp = await client.get(f"{url}/v1/models")
    resp.raise_for_status()
    data = resp.json().get("data") or []
    return data[0]["id"] if data else None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if q < 100 else max(values)


def summarize(outcomes: list[Outcome], wall: float, args: argparse.Namespace) -> dict:
    ok = [o for o in outcomes if o.ok]
    ttft = [o.ttft for o in ok if o.ttft is not None]
    tpot = [o.tpot for o in ok if o.tpot is not None]
    out_tokens = sum(o.completion_tokens for o in ok)
    in_tokens = sum(o.prompt_tokens for o in ok)
    ms = lambda v: None if v is None else round(v * 1000, 2)  # noqa: E731
    return {
        "url": args.url, "rate": args.rate, "requests": len(outcomes), "completed": len(ok),
        "failed": len(outcomes) - len(ok), "duration_s": round(wall, 3),
        "request_throughput": round(len(ok) / wall, 3),
        "output_token_throughput": round(out_tokens / wall, 2),
        "total_token_throughput": round((in_tokens + out_tokens) / wall, 2),
        "mean_prompt_tokens": round(in_tokens / len(ok), 1) if ok else None,
        "mean_output_tokens": round(out_tokens / len(ok), 1) if ok else None,
        "ttft_p50_ms": ms(percentile(ttft, 50)), "ttft_p99_ms": ms(percentile(ttft, 99)),
        "tpot_p50_ms": ms(percentile(tpot, 50)), "tpot_p99_ms": ms(percentile(tpot, 99)),
        "first_error": next((o.error for o in outcomes if not o.ok), None),
    }


def print_table(result: dict) -> None:
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server root (without /v1)")
    p.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--rate", type=float, default=2.0, help="mean arrivals per second (Poisson)")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64, help="mean prompt length in words (~tokens)")
    p.add_argument("--prompt-dist", choices=("fixed", "uniform", "exponential"), default="fixed")
    p.add_argument("--output-len", type=int, default=32, help="mean output tokens")
    p.add_argument("--output-dist", choices=("fixed", "uniform", "exponential"), default="fixed")
    p.add_argument("--max-duration", type=float, default=300.0, help="stop (cancel what runs) after this long")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.rate <= 0 or args.num_requests < 1 or args.max_duration <= 0:
        p.error("--rate, --num-requests and --max-duration must be positive")
    args.url = args.url.rstrip("/")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = asyncio.run(run(args))
    print_table(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
