"""Prometheus metrics for the server, in a registry of their own (one per app, never the global one).

Two sources:
  - per request, measured where the server consumes the delta stream (Metrics.track):
    time to first token, time per output token, prompt and generation token counters;
  - engine state, read when /metrics is scraped (_EngineCollector): running and waiting
    requests, KV pages, prefix-cache hit tokens. Nothing is pushed from the engine thread.

kiln_kv_pages_used counts the pages held by live requests (pages they share with the
prefix cache included). Pages that only the prefix cache still holds (finished
requests' KV kept for reuse, evictable at any time) are reported apart as
kiln_kv_pages_cached, so a drained server reads kiln_kv_pages_used 0.
"""

from __future__ import annotations

import time
from contextlib import aclosing, suppress
from typing import Any, AsyncIterator, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .protocol import StreamDelta

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine: Any):
        self.registry = CollectorRegistry(auto_describe=True)
        self.ttft = Histogram("kiln_time_to_first_token_seconds", "Request arrival to its first generated token.",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.tpot = Histogram("kiln_time_per_output_token_seconds",
                              "Mean time between a completion's output tokens after the first.",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.prompt_tokens = Counter("kiln_prompt_tokens", "Prompt tokens of accepted requests.",
                                     registry=self.registry)
        self.generation_tokens = Counter("kiln_generation_tokens", "Tokens generated for clients.",
                                         registry=self.registry)
        self.registry.register(_EngineCollector(engine))

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
    """Reads the scheduler's state at scrape time, tolerating small differences in its attribute names."""

    def __init__(self, engine: Any):
        self.engine = engine

    def collect(self) -> Iterable[Metric]:
        s = getattr(self.engine, "scheduler", None)
        pages = _first(s, "pages", "page_accountant", "kv_pages", "accountant")
        cache = _first(s, "prefix_cache", "cache")
        running = _count(s, "num_running", "running")
        waiting = _count(s, "num_waiting", "waiting")
        used, cached = _pages_used_and_cached(pages, cache)
        total = _number(pages, "total_pages", "num_total_pages", "num_pages")
        free = _number(pages, "free_pages", "num_free_pages")
        if total is None and used is not None and free is not None:
            total = used + (cached or 0) + free
        yield _gauge("kiln_requests_running", "Requests being prefilled or decoded.", running)
        yield _gauge("kiln_requests_waiting", "Requests queued for admission.", waiting)
        yield _gauge("kiln_kv_pages_used", "KV pages held by live requests.", used)
        yield _gauge("kiln_kv_pages_cached", "KV pages held only by the prefix cache (evictable).", cached)
        yield _gauge("kiln_kv_pages_total", "KV pages the engine manages.", total)
        hits = CounterMetricFamily("kiln_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache.")
        hits.add_metric([], _number(cache, "hit_tokens", "num_hit_tokens", "hits") or 0)
        yield hits


def _pages_used_and_cached(pages: Any, cache: Any) -> tuple[int | None, int | None]:
    """(pages held by live sequences, pages held only by prefix-cache sequences).

    A live sequence forked from a cached one shares its pages; those count as used.
    Read from the HTTP thread while the engine thread runs: a sequence freed
    meanwhile is skipped, which at worst skews one scrape.
    """
    total_used = _number(pages, "used_pages", "num_used_pages")
    if cache is None or not hasattr(pages, "seq_ids") or not hasattr(pages, "pages_of"):
        return total_used, None if cache is None else 0
    try:
        cached_ids = set(cache.seq_ids())
        live: set[int] = set()
        for seq_id in pages.seq_ids():
            if seq_id not in cached_ids:
                with suppress(KeyError):
                    live.update(pages.pages_of(seq_id))
    except Exception:  # a scrape must never fail because an engine attribute moved
        return total_used, None
    used = len(live)
    return used, None if total_used is None else max(0, total_used - used)


def _gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=0 if value is None else value)


def _first(obj: Any, *names: str) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None


def _number(obj: Any, *names: str) -> float | None:
    """The first of ``names`` on ``obj`` that is (or, called, returns) a number."""
    for name in names:
        try:
            value = getattr(obj, name, None)
            if callable(value):
                value = value()
        except Exception:  # a scrape must never fail because an engine attribute moved
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


def _count(obj: Any, *names: str) -> float | None:
    """A number attribute, or the length of a collection attribute."""
    value = _number(obj, *names)
    if value is not None:
        return value
    for name in names:
        coll = getattr(obj, name, None)
        try:
            return len(coll)
        except TypeError:
            continue
    return None
