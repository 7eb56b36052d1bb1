"""Sequence: the scheduler's per-stream state (tokens, how many have KV, status).

One source of truth for a stream's tokens: the Request (runtime/request.py) reads
prompt and output ids from here, the Scheduler moves the status and num_computed,
and every other count is derived from the token lists. Plain Python, no TVM.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum


class SeqStatus(Enum):
    WAITING = "waiting"        # queued (never admitted, or preempted): holds no KV
    RUNNING = "running"        # admitted: holds KV for num_computed tokens
    FINISHED = "finished"      # finished or aborted


@dataclass(eq=False)
class Sequence:
    """The scheduler's view of one output stream. Counters are derived from the token lists."""

    seq_id: int
    prompt_ids: list[int]
    max_tokens: int
    priority: int = 0                        # lower = more urgent; used when policy == "priority"
    arrival: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)   # the engine appends sampled tokens
    num_computed: int = 0                    # tokens whose KV is in the cache
    status: SeqStatus = SeqStatus.WAITING
    fork_from: tuple[int, int] | None = None  # (parent seq id, pos): share the parent's first pos tokens
    prompt_logits: bool = False              # compute every prompt token (no prefix reuse), logits at each
    checkpoint: int | None = None            # recurrent layers: the prefill stops here once, its state cached
    cached_prompt: int = 0                   # prompt tokens its admission took from the prefix cache
    cache_salt: str | None = None            # only sequences with the same salt share cached prefixes (vLLM's)
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if self.fork_from is not None and not 0 <= self.fork_from[1] <= len(self.prompt_ids):
            raise ValueError(f"fork position {self.fork_from[1]} is outside the prompt of "
                             f"{len(self.prompt_ids)} tokens (a fork shares only prompt tokens)")

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without copying the whole history."""
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n:end - n]
        return self.prompt_ids[start:] + self.output_ids[:end - n]

    @property
    def is_prefill(self) -> bool:
        """More than the one next token to compute, or the prompt is not all in the cache yet."""
        return self.num_computed < len(self.prompt_ids) or self.num_uncomputed > 1

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED
