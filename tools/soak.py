"""Soak `kiln serve` with faults: many concurrent streaming clients, dropped streams and bad requests.

    python tools/soak.py ARTIFACT_OR_MODEL [--clients 64] [--minutes 10] [--json]

Starts `kiln serve` on a free loopback port and runs --clients client loops for --minutes. Each
loop picks, at random: a streamed chat read to the end (70%), a stream dropped after a few chunks
(15%), a non-streamed completion (5%), or a bad request (10%: malformed JSON, an unknown field
type, temperature -1, a prompt past the context window). Then it reports, and exits non-zero
when one fails:

- 5xx answers (must be 0) and answers per status;
- KV pages used once the load stops (kiln_kv_pages_used from /metrics; must return to 0);
- server RSS, sampled every 2 s: the median of the minute after warm-up (the first minute, or a
  tenth of the run) against the median of the load's last minute (must stay within --rss-slack-mb,
  default 50; a median, since one request's buffers, e.g. tokenizing a 500 KB body, come and go
  within seconds), and the peak;
- SIGTERM sent while the load still runs: the server must exit 0 within 30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


async def client_loop(client: httpx.AsyncClient, rng: random.Random, stop_at: float, statuses: Counter) -> None:
    chat = {"model": None, "max_tokens": 48, "temperature": 0.7, "stream": True}
    while time.monotonic() < stop_at:
        kind = rng.random()
        msgs = [{"role": "user", "content": f"tell me about item {rng.randrange(10_000)}"}]
        try:
            if kind < 0.70:
                async with client.stream("POST", "/v1/chat/completions", json={**chat, "messages": msgs}) as r:
                    statuses[r.status_code] += 1
                    async for _ in r.aiter_lines():
                        pass
            elif kind < 0.85:
                async with client.stream("POST", "/v1/chat/completions", json={**chat, "messages": msgs}) as r:
                    statuses[r.status_code] += 1
                    n = 0
                    async for _ in r.aiter_lines():
                        n += 1
                        if n >= rng.randrange(1, 6):
                            break                                   # the client drops the stream
            elif kind < 0.90:
                r = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 16})
                statuses[r.status_code] += 1
            else:
                bad = rng.choice([
                    ("content", b"{not json"),
                    ("json", {"messages": "not a list"}),
                    ("json", {"messages": msgs, "temperature": -1}),
                    ("json", {"messages": [{"role": "user", "content": "word " * 100_000}]}),
                ])
                if bad[0] == "content":
                    r = await client.post("/v1/chat/completions", content=bad[1],
                                          headers={"content-type": "application/json"})
                else:
                    r = await client.post("/v1/chat/completions", json=bad[1])
                statuses[r.status_code] += 1
        except httpx.HTTPError as e:
            statuses[f"client error {type(e).__name__}"] += 1


async def load(url: str, clients: int, seconds: float, seed: int) -> Counter:
    statuses: Counter = Counter()
    stop_at = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        await asyncio.gather(*(client_loop(client, random.Random(seed + i), stop_at, statuses)
                               for i in range(clients)))
    return statuses


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rss-slack-mb", type=float, default=50.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "kiln.cli", "serve", args.model, "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 900
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.time() > deadline:
                print("the server did not start", file=sys.stderr)
                return 1
            time.sleep(0.5)
        seconds = args.minutes * 60
        warmup = min(60.0, seconds / 10)
        window = min(60.0, (seconds - warmup) / 3)
        samples, done = [], threading.Event()

        def sample() -> None:
            start = time.monotonic()
            while not done.wait(2.0):
                samples.append((time.monotonic() - start, rss_mb(server.pid)))
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        statuses = asyncio.run(load(url, args.clients, seconds, args.seed))
        done.set()
        sampler.join()
        rss_warm = statistics.median(r for t, r in samples if warmup <= t < warmup + window)
        rss_end = statistics.median(r for t, r in samples if t >= seconds - window)
        rss_peak = max(r for t, r in samples if t >= warmup)
        time.sleep(2)
        pages = metric(url, "kiln_kv_pages_used")

        # SIGTERM under load: a short burst of clients, the signal in the middle of it.
        async def burst_and_term() -> tuple[Counter, int, float]:
            task = asyncio.create_task(load(url, args.clients, 10, args.seed + 20_000))
            await asyncio.sleep(3)
            server.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            code = await asyncio.to_thread(server.wait, 30)
            return await task, code, time.monotonic() - sent
        term_statuses, code, exit_seconds = asyncio.run(burst_and_term())
        report = {
            "clients": args.clients, "minutes": args.minutes,
            "statuses": {str(k): v for k, v in sorted(statuses.items(), key=str)},
            "5xx": sum(v for k, v in statuses.items() if isinstance(k, int) and k >= 500),
            "kv_pages_used_after": pages, "rss_mb_after_warmup": round(rss_warm, 1), "rss_mb_end": round(rss_end, 1),
            "rss_mb_peak": round(rss_peak, 1), "rss_window_s": window,
            "sigterm_exit_code": code, "sigterm_exit_seconds": round(exit_seconds, 1),
            "sigterm_statuses": {str(k): v for k, v in term_statuses.items()},
        }
    finally:
        if server.poll() is None:
            server.kill()
    ok = (report["5xx"] == 0 and pages == 0 and rss_end - rss_warm <= args.rss_slack_mb and code == 0)
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))
    print("PASS" if ok else "FAIL", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
