"""Typed messages between the runtime's stages.

    prompt -> Request (tokenized, validated) -> Engine loop -> StreamDelta* -> GenerationOutput
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence


class InvalidRequestError(ValueError):
    """Bad user input to the runtime (a parameter, a prompt); the message names it and the fix."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. Validated on construction."""

    max_tokens: int = 256
    temperature: float = 1.0          # 0 = greedy
    top_p: float = 1.0                # nucleus mass in (0, 1]
    top_k: int = 0                    # 0 = disabled
    seed: int | None = None           # same seed, same output
    stop: Sequence[str] = ()          # stop strings (not included in the output)
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        _check(isinstance(self.max_tokens, int) and self.max_tokens >= 1,
               f"max_tokens must be an integer >= 1, got {self.max_tokens!r}", "max_tokens")
        _check(_is_number(self.temperature) and self.temperature >= 0,
               f"temperature must be a number >= 0, got {self.temperature!r}", "temperature")
        _check(_is_number(self.top_p) and 0 < self.top_p <= 1,
               f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")
        _check(isinstance(self.top_k, int) and self.top_k >= 0,
               f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}", "top_k")
        _check(self.seed is None or isinstance(self.seed, int), f"seed must be an integer, got {self.seed!r}", "seed")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        _check(all(isinstance(s, str) and s for s in self.stop), "stop must be non-empty strings", "stop")
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise InvalidRequestError(message, param)


@dataclass
class StreamDelta:
    """New output of one request since the last delta."""

    index: int                        # which prompt of the call
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" when finished


@dataclass
class GenerationOutput:
    """A finished request: the generated ids only (no prompt), their text, why it stopped."""

    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_token_ids: list[int] = field(default_factory=list)

    @property
    def usage(self) -> dict:
        return {"prompt_tokens": len(self.prompt_token_ids), "completion_tokens": len(self.token_ids),
                "total_tokens": len(self.prompt_token_ids) + len(self.token_ids)}
