"""`kiln serve` under N concurrent streamed completions: what the server delivers beside what the
engine can, and the host CPU it spends a token.

    python tools/serve_load.py ARTIFACT_OR_MODEL [--concurrency 1,64,256] [--prompt-len 16]
                               [--gen-len 128] [--json OUT]

Starts `kiln serve` on loopback (a process of its own, KV cache sized for the load), then for each
concurrency sends that many /v1/completions at once (random prompt ids, ignore_eos, streamed with
continuous usage, so each chunk says how many tokens its stream has so far: a server that fell
behind sends several tokens a chunk). The client is raw asyncio sockets that only look for the
usage count, so it takes little of the CPU the server needs. Per concurrency:

- decode_tok_s: tokens a second over the window in which every stream is decoding (all have their
  first token, none has finished): `kiln bench`'s decode figure at that batch, through HTTP;
- overall_tok_s: all generated tokens over the whole call, admission and ramp included;
- loop_us_per_token: CPU the server's main thread (uvicorn's event loop: HTTP, SSE, JSON) spent
  per generated token; other_us_per_token: the rest of the process and its children (the engine
  thread, or with `--engine-process on` the engine's process: scheduling, detokenizing, launching the
  device's work; on a CPU also the kernels). Both from /proc (Linux).
  On a GPU these two, which share one GIL, are what can hold the device back at high concurrency.
- chunks_per_token: SSE chunks sent a token (below 1: the server merged tokens of streams that fell
  behind, or tokens that end inside a multi-byte character waited for the next).
- host_gap_us_per_forward: from the server's /metrics, the engine thread's time from a forward's
  tokens coming back to the next forward's launch, a forward (on a GPU the device idles then), and
  lookahead_share: the forwards launched before the previous one's tokens were shown (`kiln serve
  --overlap`; `--overlap off` here passes it on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import time
from pathlib import Path

from _bench_common import kiln_server

_TOKENS = re.compile(rb'"completion_tokens": ?(\d+)')


def _thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds per thread of process `pid` and of its children (an engine process) (Linux /proc;
    {} elsewhere)."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rpartition(")")[2].split()
            children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
        for child in children:
            out.update(_thread_cpu(int(child)))
    return out


async def _stream(port: int, model: str, prompt: list[int], gen_len: int, t0: float) -> tuple[list, int]:
    """One streamed completion: (seconds since t0, tokens so far) at each read that moved the count,
    and the number of chunks that carried tokens (every chunk has the usage; the last, usage only)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": gen_len, "temperature": 0,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True, "continuous_usage_stats": True}}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    marks, carry, last, chunks = [], b"", 0, -1
    while chunk := await reader.read(1 << 16):
        data = carry + chunk
        cut = data.rfind(b"\n\n") + 2            # whole events only; the rest waits for the next read
        found = _TOKENS.findall(data[:cut])
        carry, chunks = data[cut:], chunks + len(found)
        if found and int(found[-1]) != last:
            last = int(found[-1])
            marks.append((time.perf_counter() - t0, last))
    writer.close()
    if not marks:
        raise RuntimeError(f"a stream returned no tokens: {carry[:300]!r}")
    return marks, chunks


_COUNTERS = ("kiln_forwards_total", "kiln_lookahead_forwards_total", "kiln_host_gap_seconds_total")


def _engine_counters(port: int) -> dict[str, float]:
    """The engine's forward counters from the server's /metrics."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = dict(re.findall(r"^(kiln_\w+_total) ([0-9.e+-]+)$", text, re.M))
    return {name: float(found.get(name, 0.0)) for name in _COUNTERS}


def load(port: int, model: str, pid: int, concurrency: int, prompt_len: int, gen_len: int, vocab: int) -> dict:
    """One burst of `concurrency` streamed completions against a running server."""
    import numpy as np
    rng = np.random.default_rng(concurrency)
    prompts = rng.integers(100, vocab - 100, size=(concurrency, prompt_len)).tolist()
    counters = _engine_counters(port)
    before, t0 = _thread_cpu(pid), time.perf_counter()

    async def burst():
        return await asyncio.gather(*[_stream(port, model, p, gen_len, t0) for p in prompts])

    streams, chunks = zip(*asyncio.run(burst()))
    wall, after = time.perf_counter() - t0, _thread_cpu(pid)
    tokens = sum(m[-1][1] for m in streams)
    start = max(m[0][0] for m in streams)                 # every stream has its first token
    end = min(m[-1][0] for m in streams)                  # the first stream is done
    between = sum(_count_at(m, end) - _count_at(m, start) for m in streams)
    spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    loop_s = spent.pop(pid, 0.0)
    row = {"concurrency": concurrency, "tokens": tokens, "wall_s": round(wall, 2),
           "overall_tok_s": round(tokens / wall, 1),
           "decode_tok_s": round(between / (end - start), 1) if end > start and between else None,
           "chunks_per_token": round(sum(chunks) / tokens, 3), "loop_us_per_token": None,
           "other_us_per_token": None}
    if after:                                             # Linux: /proc has the threads' CPU times
        row["loop_us_per_token"] = round(1e6 * loop_s / tokens, 2)
        row["other_us_per_token"] = round(1e6 * sum(spent.values()) / tokens, 2)
    forwards, lookahead, gap_s = (b - a for a, b in zip(counters.values(), _engine_counters(port).values()))
    row["forwards"] = int(forwards)
    row["host_gap_us_per_forward"] = round(1e6 * gap_s / forwards, 1) if forwards else None
    row["lookahead_share"] = round(lookahead / forwards, 3) if forwards else None
    return row


def _count_at(marks: list[tuple[float, int]], t: float) -> int:
    """A stream's token count at time t (its last mark at or before t)."""
    count = 0
    for when, n in marks:
        if when > t:
            break
        count = n
    return count


def _settle(pid: int, quiet_s: float = 1.0, at_most_s: float = 60.0) -> None:
    """Wait until the server's threads stop using the CPU (its start-up work beside the engine, e.g.
    structured output's vocabulary table, would otherwise be timed with the first row)."""
    deadline, last = time.monotonic() + at_most_s, sum(_thread_cpu(pid).values())
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = sum(_thread_cpu(pid).values())
        if now - last < 0.05 * quiet_s:
            return
        last = now


def serve_and_load(model: str, concurrency: list[int], prompt_len: int = 16, gen_len: int = 128,
                   start_timeout: float = 600.0, extra: tuple[str, ...] = ()) -> dict:
    """Start `kiln serve MODEL`, run each concurrency against it, stop it; {"rows": [...], ...}."""
    import kiln
    from kiln.runtime.bench import kv_tokens_needed
    path = Path(model) if kiln.is_artifact(model) else kiln.ensure_artifact(model)
    art = kiln.Artifact.load(path, verify=False)
    most = max(concurrency)
    kv = kv_tokens_needed(art.config.kv_cache.page_size, prompt_len, gen_len, most)
    name = "load"
    with kiln_server(str(path), "--model-name", name, "--max-num-seqs", str(most), "--max-total-tokens", str(kv),
                     *extra, timeout=start_timeout) as (url, server):
        port = int(url.rsplit(":", 1)[1])
        load(port, name, server.pid, min(4, most), prompt_len, 32, art.config.vocab_size)     # warm-up
        _settle(server.pid)
        rows = []
        for c in concurrency:
            rows.append(load(port, name, server.pid, c, prompt_len, gen_len, art.config.vocab_size))
            print(json.dumps(rows[-1]), flush=True)
    return {"artifact": str(path), "prompt_len": prompt_len, "gen_len": gen_len, "rows": rows,
            "event_loop": _event_loop()}


def _event_loop() -> str:
    """What uvicorn picks here for its loop and HTTP parser (loop="auto", http="auto")."""
    import importlib.util
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"{loop}+{http}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="an artifact, or a model kiln compiles for the CPU")
    ap.add_argument("--concurrency", default="1,64,256", help="comma-separated stream counts")
    ap.add_argument("--prompt-len", type=int, default=16,
                    help="short, so that every stream is admitted long before the first one ends")
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--overlap", choices=("auto", "on", "off"), default="auto", help="`kiln serve --overlap`")
    ap.add_argument("--stream-interval", type=int, default=1, help="`kiln serve --stream-interval`")
    ap.add_argument("--engine-process", choices=("auto", "on", "off"), default="auto",
                    help="`kiln serve --engine-process`")
    ap.add_argument("--api-processes", type=int, default=1, help="`kiln serve --api-processes` (the event "
                    "loops are then in child processes: their CPU is in other_us_per_token)")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args()
    result = serve_and_load(args.model, [int(c) for c in args.concurrency.split(",")], args.prompt_len, args.gen_len,
                            extra=("--overlap", args.overlap, "--stream-interval", str(args.stream_interval),
                                   "--engine-process", args.engine_process, "--api-processes", str(args.api_processes)))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(f"{result['artifact']} ({result['event_loop']}), prompt {args.prompt_len}, gen {args.gen_len}")
    for r in result["rows"]:
        print(f"  {r['concurrency']:4d} streams: decode {r['decode_tok_s']} tok/s, overall {r['overall_tok_s']} tok/s;"
              f" event loop {r['loop_us_per_token']} us/token, rest {r['other_us_per_token']} us/token,"
              f" {r['chunks_per_token']} chunks/token; host gap {r['host_gap_us_per_forward']} us/forward,"
              f" {r['lookahead_share']} of forwards lookahead")


if __name__ == "__main__":
    main()
