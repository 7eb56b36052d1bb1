"""Offline benchmark of one artifact: prefill and decode throughput, TTFT, TPOT, peak RSS.

Each run prefills `batch` prompts of `prompt_len` random tokens in one ragged
call, then decodes `gen_len` tokens for all of them, timing each call. Medians
over `runs` after one warm-up run.
"""

from __future__ import annotations

import resource
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from .model_runner import ModelRunner


@dataclass(frozen=True)
class BenchResult:
    prefill_tok_s: float       # prompt tokens per second (all sequences)
    decode_tok_s: float        # generated tokens per second (all sequences)
    ttft_ms: float             # time to first token: the prefill call
    tpot_ms: float             # time per output token step (one batch_decode)
    peak_rss_mb: float
    prompt_len: int
    gen_len: int
    batch: int
    runs: int

    def as_dict(self) -> dict:
        return asdict(self)


def bench(runner: ModelRunner, prompt_len: int = 128, gen_len: int = 64, batch: int = 1, runs: int = 3,
          seed: int = 0) -> BenchResult:
    if prompt_len + gen_len > runner.context_window:
        raise ValueError(f"prompt_len + gen_len ({prompt_len + gen_len}) exceeds the context window "
                         f"({runner.context_window})")
    if batch > runner.max_num_seqs:
        raise ValueError(f"batch {batch} exceeds the engine's max_num_seqs ({runner.max_num_seqs})")
    rng = np.random.default_rng(seed)
    prefill_s, step_s = [], []
    for run in range(runs + 1):                                   # run 0 warms up
        seqs = list(range(run * batch, (run + 1) * batch))
        prompts = rng.integers(0, runner.vocab_size, size=(batch, prompt_len)).tolist()
        for s in seqs:
            runner.add_sequence(s)
        t0 = time.perf_counter()
        logits = runner.prefill(seqs, prompts)
        t1 = time.perf_counter()
        steps = []
        for _ in range(gen_len):
            tokens = logits.argmax(-1).tolist()
            t = time.perf_counter()
            logits = runner.decode(seqs, tokens)
            steps.append(time.perf_counter() - t)
        for s in seqs:
            runner.remove_sequence(s)
        if run:
            prefill_s.append(t1 - t0)
            step_s.append(statistics.median(steps))
    p, d = statistics.median(prefill_s), statistics.median(step_s)
    return BenchResult(prefill_tok_s=batch * prompt_len / p, decode_tok_s=batch / d, ttft_ms=p * 1e3,
                       tpot_ms=d * 1e3, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                       prompt_len=prompt_len, gen_len=gen_len, batch=batch, runs=runs)
