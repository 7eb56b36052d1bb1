"""Request: one prompt's state while it generates.

Counters are derived (num_tokens, remaining), not kept by hand; invariants are
checked where a request is built. append() is the only mutation: it takes a
sampled token and returns the StreamDelta it produces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .protocol import InvalidRequestError, SamplingParams, StreamDelta
from .tokenizer import IncrementalDetokenizer, StopStringMatcher, Tokenizer


@dataclass
class Request:
    index: int                          # position in the caller's list of prompts
    seq_id: int                         # KV-cache sequence id
    prompt_ids: list[int]
    params: SamplingParams
    context_window: int
    eos_token_ids: frozenset[int]
    tokenizer: Tokenizer | None = None
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    text: str = ""

    def __post_init__(self) -> None:
        n = len(self.prompt_ids)
        if n == 0:
            raise InvalidRequestError("the prompt is empty; pass some text or token ids", "prompt")
        if n + self.params.max_tokens > self.context_window:
            raise InvalidRequestError(
                f"the prompt ({n} tokens) plus max_tokens ({self.params.max_tokens}) exceeds the context "
                f"window of {self.context_window} tokens; shorten the prompt or lower max_tokens", "max_tokens")
        self.rng = np.random.default_rng(self.params.seed)
        self._detok = IncrementalDetokenizer(self.tokenizer) if self.tokenizer else None
        self._stops = StopStringMatcher(self.params.stop)
        self._stop_ids = set(self.params.stop_token_ids) | (set() if self.params.ignore_eos else set(self.eos_token_ids))

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining(self) -> int:
        return self.params.max_tokens - len(self.output_ids)

    def append(self, token: int) -> StreamDelta:
        """Record a sampled token; returns the new text (held back across stop-string prefixes)."""
        self.output_ids.append(token)
        text, hit = "", False
        stop_token = token in self._stop_ids
        if self._detok is not None and not stop_token:   # a stop token's text is never shown
            text, hit = self._stops.feed(self._detok.push(token))
        if stop_token or hit:
            self.finish_reason = "stop"
        elif self.remaining == 0:
            self.finish_reason = "length"
        if self.finished and not hit and self._detok is not None:
            # release what was held back: a partial character, a prefix of a stop string
            tail, hit = self._stops.feed(self._detok.flush())
            text += tail if hit else tail + self._stops.flush()
            self.finish_reason = "stop" if hit else self.finish_reason
        self.text += text
        return StreamDelta(self.index, text, [token], self.finish_reason)
