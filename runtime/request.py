"""Request: one output stream's state while it generates.

The token history lives in the scheduler's Sequence (one source of truth);
the Request adds what the engine needs on top: sampling state, the
detokenizer and stop matching. Counters are derived, not kept by hand.
append() is the only mutation: it takes a sampled token and returns the
StreamDelta it produces (in two halves, take() and show(), for the engine's
overlapped step).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from . import reasoning
from .protocol import GrowingText, InvalidRequestError, SamplingParams, StreamDelta, TokenLogprob
from .sequence import Sequence
from .tokenizer import IncrementalDetokenizer, StopStringMatcher, Tokenizer, bad_word_ids


def check_fits(prompt_len: int, max_tokens: int, context_window: int) -> None:
    """InvalidRequestError where the prompt and max_tokens together exceed the context window."""
    if prompt_len + max_tokens > context_window:
        raise InvalidRequestError(
            f"the prompt ({prompt_len} tokens) plus max_tokens ({max_tokens}) exceeds the context "
            f"window of {context_window} tokens; shorten the prompt or lower max_tokens", "max_tokens")


@dataclass(eq=False)
class Request:
    index: int                          # which prompt (or which of n completions) of the caller's call
    seq: Sequence
    params: SamplingParams
    context_window: int
    eos_token_ids: frozenset[int]
    tokenizer: Tokenizer | None = None
    grammar: object | None = None       # runtime.grammar.GrammarState when response_format asks for JSON
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None   # per prompt token (None for the first)
    drafting: object | None = None      # speculative decoding's state for it (speculative.Drafting)
    _rng_seed_offset: int = field(default=0, repr=False)
    _first_sent: bool = field(default=False, repr=False)
    _taken: tuple = field(default=(None, None), repr=False)     # (token, logprob) take() recorded for show()
    _thinking: object | None = field(default=None, repr=False)  # while the reply reasons: its ReasoningParser

    def __post_init__(self) -> None:
        n = len(self.seq.prompt_ids)
        if n == 0:
            raise InvalidRequestError("the prompt is empty; pass some text or token ids", "prompt")
        check_fits(n, self.params.max_tokens, self.context_window)
        if self.params.infill and self.tokenizer is None:
            raise InvalidRequestError("the infill sampler compares token texts; this artifact has no tokenizer",
                                      "samplers")
        seed = self.params.seed
        self.rng = np.random.default_rng(None if seed is None else (seed, self._rng_seed_offset))
        self._detok = IncrementalDetokenizer(self.tokenizer, self.params.skip_special_tokens) if self.tokenizer \
            else None
        self._stops = StopStringMatcher(self.params.stop)
        self._text = GrowingText()
        eos = set() if self.params.ignore_eos else set(self.eos_token_ids)
        self._stop_ids = set(self.params.stop_token_ids) | eos
        self._bad_words = bad_word_ids(self.tokenizer, self.params.bad_words)
        if self.params.needs_logprobs:
            self.logprobs = []
        if self.grammar is not None and self.params.reasoning_parser and self.tokenizer is not None:
            parser = reasoning.start(self.params.reasoning_parser, self.tokenizer.decode(self.seq.prompt_ids[-64:]))
            self._thinking = None if parser.answering else parser
        if self.seq.prompt_logits:
            self.prompt_logprobs = [None] * n

    @property
    def text(self) -> str:
        """Everything the deltas have shown so far."""
        return str(self._text)

    @property
    def active_grammar(self):
        """The grammar that constrains the next token: None while a reasoning model still reasons (its
        answer, not its thinking, is what response_format shapes: the token after the reasoning ends
        is the grammar's first)."""
        return self.grammar if self._thinking is None else None

    @property
    def seq_id(self) -> int:
        return self.seq.seq_id

    @property
    def prompt_ids(self) -> list[int]:
        return self.seq.prompt_ids

    @property
    def output_ids(self) -> list[int]:
        return self.seq.output_ids

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining(self) -> int:
        return self.params.max_tokens - len(self.output_ids)

    def score_prompt(self, start: int, logits: np.ndarray) -> None:
        """Record prompt logprobs from the logits at positions start.. (row j predicts token j + 1)."""
        from .sampler import token_logprobs
        prompt = self.seq.prompt_ids
        rows = min(len(logits), len(prompt) - 1 - start)        # the last prompt row predicts the output
        if rows <= 0 or self.prompt_logprobs is None:
            return
        targets = np.asarray(prompt[start + 1:start + 1 + rows])
        top = np.full(rows, self.params.prompt_logprobs, np.int64)
        x = logits[:rows]
        ranks = (x > x[np.arange(rows), targets][:, None]).sum(axis=1) + 1
        self.prompt_logprobs[start + 1:start + 1 + rows] = [
            replace(lp, rank=int(r)) for lp, r in zip(token_logprobs(x, targets, top), ranks)]

    def finish_scored(self) -> StreamDelta:
        """A max_tokens=0 request (score the prompt, generate nothing): done once its prompt is computed."""
        self.finish_reason = "length"
        return self._delta(StreamDelta(self.index, "", [], "length"))

    def _delta(self, delta: StreamDelta) -> StreamDelta:
        """The first delta of a request carries its prompt logprobs, when it asked for them, and how much of its
        prompt the prefix cache held."""
        if not self._first_sent:
            self._first_sent = True
            delta.prompt_logprobs = self.prompt_logprobs
            delta.cached_tokens = self.seq.cached_prompt
        return delta

    def append(self, token: int, logprob: TokenLogprob | None = None) -> StreamDelta:
        """Record a sampled token; returns the new text (held back across stop-string prefixes)."""
        self.take(token, logprob)
        return self.show()

    def take(self, token: int, logprob: TokenLogprob | None = None) -> None:
        """append()'s first half: the token joins the sequence (the scheduler can plan its decode);
        show() then makes its delta. The engine's overlapped step launches the next forward between."""
        self.output_ids.append(token)
        if logprob is not None and self.logprobs is not None:
            self.logprobs.append(logprob)
        self._taken = (token, logprob)

    @property
    def before_min_tokens(self) -> bool:
        """Fewer than min_tokens generated: its next token may not be a stop token (the sampler masks them).
        (A stop string may end only in a token after the first min_tokens: show() tells the matcher.)"""
        return len(self.output_ids) < self.params.min_tokens

    @property
    def masked_next(self) -> frozenset[int]:
        """The ids its next token may not be (the sampler masks them): the stop ids while min_tokens is not yet
        reached, and each bad word's last token where the output ends with the tokens before it."""
        if not self._bad_words and not self.before_min_tokens:     # most requests, every step: nothing to build
            return frozenset()
        masked = set(self._stop_ids) if self.before_min_tokens else set()
        out = self.output_ids
        for word in self._bad_words:
            if len(word) == 1 or (len(word) - 1 <= len(out) and out[len(out) - len(word) + 1:] == list(word[:-1])):
                masked.add(word[-1])
        return frozenset(masked)

    @property
    def end_reason(self) -> str | None:
        """How the token just taken ends the request whatever its text ("stop": a stop token; "length":
        the last of max_tokens), else None. (A stop string or a finished JSON value ends it only when
        show() finds it.)"""
        if self.output_ids[-1] in self._stop_ids:
            return "stop"
        return "length" if self.remaining == 0 else None

    def show(self) -> StreamDelta:
        """append()'s second half: the taken token's text, stop strings and grammar; its delta."""
        token, logprob = self._taken
        text, hit = "", False
        grammar = self.active_grammar
        stop_token = token in self._stop_ids or (grammar is not None and token in grammar.stop_token_ids)
        if self._detok is not None and not stop_token:   # a stop token's text is never shown
            piece = self._detok.push(token)              # a stop string ends after the first min_tokens (vLLM's)
            text, hit = self._stops.feed(piece, match=len(self.output_ids) > self.params.min_tokens)
        grammar_done = grammar is not None and self._grammar_accepts(token)
        if self._thinking is not None:
            self._thinking.feed(text)
            if self._thinking.answering:
                self._thinking = None
        if stop_token or hit or grammar_done:
            self.finish_reason = "stop"
        elif self.remaining == 0:
            self.finish_reason = "length"
        if self.finished and not hit:
            text += self._release_held_text()
        elif hit and self.params.include_stop_str_in_output:
            text += self._stops.matched
        self._text.add(text)
        delta = StreamDelta(self.index, text, [token], self.finish_reason,
                            [logprob] if logprob is not None and self.logprobs is not None else None)
        if self.finish_reason == "stop":
            delta.stop_string = self._stops.matched
        return self._delta(delta)

    def abort(self) -> StreamDelta:
        self.finish_reason = "abort"
        return StreamDelta(self.index, "", [], "abort")

    def _grammar_accepts(self, token: int) -> bool:
        """Advance the grammar; True once it has terminated (the JSON value is complete)."""
        if not self.grammar.is_terminated():
            self.grammar.accept(token)
        return self.grammar.is_terminated()

    def _release_held_text(self) -> str:
        """At the end: a partial character, a prefix of a stop string that never completed."""
        if self._detok is None:
            return ""
        tail, hit = self._stops.feed(self._detok.flush())
        if hit:
            self.finish_reason = "stop"
            return tail + (self._stops.matched if self.params.include_stop_str_in_output else "")
        return tail + self._stops.flush()
