"""Helpers shared by the benchmark scripts in tools/ (bench_vs_transformers.py, compare_llamacpp.py,
eval_report.py, serve_load.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def read_bandwidth_gbs(size_mb: int = 512) -> float:
    """Memory read bandwidth in GB/s of every core, as a decode step reads its weights: the best of 5
    sums over a buffer much larger than the caches, through torch's threads (one per core) where torch
    is installed, else numpy's one thread (on 2 Zen 4 cores: 50 GB/s against numpy's 31, which made
    the floors quoted before 2026-11-29 too low)."""
    a = np.ones(size_mb * (1 << 20) // 8)
    best = min(_timed(a.sum) for _ in range(5))
    try:
        import torch
    except ImportError:
        return a.nbytes / best / 1e9
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        t = torch.from_numpy(a)
        best = min(best, *(_timed(t.sum) for _ in range(5)))
    finally:
        torch.set_num_threads(threads)
    return a.nbytes / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_transformers(model_arg: str, prompt_len: int, gen_len: int, runs: int) -> dict:
    """transformers float32 with its KV cache, torch threads = cores: median prefill and decode tok/s."""
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


@contextlib.contextmanager
def kiln_server(model: str, *extra: str, timeout: float = 900):
    """`kiln serve MODEL` on a free loopback port until the block ends; yields (its base URL, its
    process). Its output goes to a file (a pipe nobody reads would stall it), whose end a failed
    start quotes. -P: from the checkout, `kiln/` in the working directory must not shadow kiln."""
    import urllib.request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkdtemp(prefix="kiln-serve-")) / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-P", "-m", "kiln.cli", "serve", model, "--port", str(port), *extra],
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.time() > deadline:
                tail = " | ".join(log.read_text(errors="replace").splitlines()[-8:])
                raise RuntimeError(f"`kiln serve {model}` did not start (log {log}): {tail}")
            time.sleep(0.5)
        yield url, server
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
