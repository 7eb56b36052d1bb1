"""Prometheus metrics for the server, in a registry of their own (one per app, never the global one).

Two sources:
  - per request, measured where the server consumes the delta stream (Metrics.track):
    time to first token, time per output token, prompt and generation token counters;
  - engine state, read when /metrics is scraped (_EngineCollector): Engine.stats(), a typed
    EngineStats (running and waiting sequences, KV pages, prefix-cache hit tokens). Nothing is
    pushed from the engine thread; stats() is safe to call while it steps.

kiln_kv_pages_used counts the pages held by live requests (pages they share with the
prefix cache included). Pages that only the prefix cache still holds (finished
requests' KV kept for reuse, evictable at any time) are reported apart as
kiln_kv_pages_cached, so a drained server reads kiln_kv_pages_used 0.
"""

from __future__ import annotations

import os
import struct
import time
from contextlib import aclosing
from typing import AsyncIterator, Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .protocol import EngineStats, StreamDelta

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _SharedCollector(Collector):
    """The request metrics every HTTP process writes to PROMETHEUS_MULTIPROC_DIR, summed when scraped.

    prometheus_client's reader fails (struct.error) on a file another process has just created and not
    yet sized: at startup, when the HTTP processes start together (one of them died so, 'unpack_from
    requires a buffer of at least 4 bytes', a kiln serve --api-processes 2 test in CI). So registering
    reads nothing (describe), and a scrape that meets such a file reads the directory again."""

    TRIES = 50                                  # 2 ms apart: a file is sized right after it is created

    def describe(self) -> list:
        return []

    def collect(self) -> Iterable[Metric]:
        from prometheus_client import multiprocess
        files = multiprocess.MultiProcessCollector(None)
        for _ in range(self.TRIES - 1):
            try:
                return files.collect()
            except struct.error:
                time.sleep(0.002)
        return files.collect()


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, stats: Callable[[], EngineStats]):
        """``stats``: the engine's state at scrape time (Engine.stats).

        With PROMETHEUS_MULTIPROC_DIR set (`kiln serve --api-processes N` sets it for its HTTP processes
        before they import prometheus_client) the request metrics live in files there, and every
        process's /metrics reports the sum over all of them."""
        self.registry = CollectorRegistry(auto_describe=True)
        shared = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        own = None if shared else self.registry          # shared: written to the directory, read back below
        self.ttft = Histogram("kiln_time_to_first_token_seconds", "Request arrival to its first generated token.",
                              buckets=_LATENCY_BUCKETS, registry=own)
        self.tpot = Histogram("kiln_time_per_output_token_seconds",
                              "Mean time between a completion's output tokens after the first.",
                              buckets=_LATENCY_BUCKETS, registry=own)
        self.prompt_tokens = Counter("kiln_prompt_tokens", "Prompt tokens of accepted requests.", registry=own)
        self.generation_tokens = Counter("kiln_generation_tokens", "Tokens generated for clients.", registry=own)
        if shared:
            self.registry.register(_SharedCollector())
        self.registry.register(_EngineCollector(stats))

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)

    async def track(self, deltas: AsyncIterator[StreamDelta], prompt_tokens: int,
                    arrival: float) -> AsyncIterator[StreamDelta]:
        """Pass ``deltas`` through, timing them. Closing this iterator closes ``deltas`` (aborts the request)."""
        first_at: dict[int, float] = {}       # choice index -> time of its first token
        counts: dict[int, int] = {}
        async with aclosing(deltas):
            async for delta in deltas:
                now = time.monotonic()
                if not first_at and not counts:
                    self.prompt_tokens.inc(prompt_tokens)   # the request was accepted
                if delta.token_ids:
                    if not first_at:
                        self.ttft.observe(now - arrival)
                    first_at.setdefault(delta.index, now)
                    counts[delta.index] = counts.get(delta.index, 0) + len(delta.token_ids)
                    self.generation_tokens.inc(len(delta.token_ids))
                else:
                    counts.setdefault(delta.index, 0)
                n = counts.get(delta.index, 0)
                if delta.finish_reason is not None and n > 1:
                    self.tpot.observe((now - first_at[delta.index]) / (n - 1))
                yield delta


class _EngineCollector(Collector):
    """Engine.stats() as gauges and counters, read at scrape time."""

    def __init__(self, stats: Callable[[], EngineStats]):
        self.stats = stats

    def collect(self) -> Iterable[Metric]:
        s = self.stats()
        yield _gauge("kiln_requests_running", "Sequences being prefilled or decoded.", s.running)
        yield _gauge("kiln_requests_waiting", "Sequences queued for admission.", s.waiting)
        yield _gauge("kiln_kv_pages_used", "KV pages held by live requests.", s.kv_pages_used)
        yield _gauge("kiln_kv_pages_cached", "KV pages held only by the prefix cache (evictable).", s.kv_pages_cached)
        yield _gauge("kiln_kv_pages_free", "KV pages free.", s.kv_pages_free)
        yield _gauge("kiln_kv_pages_total", "KV pages the engine manages.", s.kv_pages_total)
        yield _counter("kiln_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache.",
                       s.prefix_cache_hit_tokens)
        yield _counter("kiln_forwards", "Forward passes the engine launched.", s.forwards)
        yield _counter("kiln_lookahead_forwards", "Forward passes launched before the previous one's tokens were "
                       "shown (the host's per-token work overlapped with the device).", s.lookahead_forwards)
        yield _counter("kiln_host_gap_seconds", "Host time from a forward's tokens coming back to the next "
                       "forward's launch, while work remained: what the device waits for between steps.",
                       s.host_gap_seconds)
        yield _counter("kiln_spec_decode_draft_tokens", "Speculative decoding: draft tokens (prompt lookup) "
                       "checked by the model.", s.draft_tokens)
        yield _counter("kiln_spec_decode_accepted_tokens", "Speculative decoding: draft tokens kept (the "
                       "model picked them itself).", s.accepted_draft_tokens)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc)
    family.add_metric([], value)
    return family
