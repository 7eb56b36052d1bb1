"""Typed messages between the runtime's stages.

    prompt -> Request (tokenized, validated) -> Engine loop -> StreamDelta* -> GenerationOutput
    AsyncEngine.generate -> AddRequest / AbortRequest -> the engine thread (between steps)
    EngineClient -> the same commands, StatsRequest, StopEngine -> the engine process -> EngineReply a turn
    Engine.stats() -> EngineStats -> metrics (read from the HTTP thread at scrape time)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    from .async_engine import RequestHandle


class ShuttingDown(Exception):
    """The server is draining and cancelled this call before it ran (answered 503)."""


class InvalidRequestError(ValueError):
    """Bad user input to the runtime (a parameter, a prompt); the message names it and the fix."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param

    def __reduce__(self):                 # crosses to an engine process and back whole
        return type(self), (str(self), self.param)


MAX_TEMPERATURE = 2.0    # OpenAI's range; higher is noise from the whole vocabulary
MAX_N = 128              # OpenAI's limit; an engine also refuses n above its max_num_seqs
MAX_CACHE_SALT = 128     # vLLM's limits on a cache_salt
CACHE_SALT_FORBIDDEN = "@/\\\x00"


# response_format's types: OpenAI's, and kiln's own for guided decoding (vLLM's guided_regex / guided_choice /
# guided_grammar: openai_api.guided_format), which runtime/grammar.py compiles too
FORMAT_TYPES = ("text", "json_object", "json_schema", "regex", "grammar", "structural_tag")


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
    min_tokens: int = 0               # no stop token or string before this many tokens (vLLM's)
    include_stop_str_in_output: bool = False   # a stop string that ends the output is kept in it (vLLM's)
    skip_special_tokens: bool = False # special tokens' text left out of the output (vLLM's; kiln shows them)
    allowed_token_ids: Sequence[int] | None = None   # the only ids it may sample (vLLM's)
    bad_words: Sequence[str] = ()     # words it may not generate (vLLM's: each word's last token banned after the rest)
    temperature_last: bool = False    # top_k / top_p / min_p choose on the untempered distribution (llama.cpp's order)
    infill: bool = False              # llama.cpp's infill sampler after those filters (sampler.infill_candidates)
    min_p: float = 0.0                # drop tokens with p < min_p * p_max
    repetition_penalty: float = 1.0   # > 1 discourages tokens already in prompt or output (HF/vLLM style)
    frequency_penalty: float = 0.0    # OpenAI: logit -= f * count in output
    presence_penalty: float = 0.0     # OpenAI: logit -= p * (count > 0)
    logit_bias: Mapping[int, float] = field(default_factory=dict)  # token id -> added to its logit
    logprobs: bool = False            # return the sampled token's logprob
    top_logprobs: int = 0             # and this many most likely alternatives (0..20)
    n: int = 1                        # completions per prompt, forked from the prompt's KV
    prompt_logprobs: int | None = None  # each prompt token's logprob and this many alternatives (None: off)
    response_format: Mapping | None = None   # {"type": "json_object"} | {"type": "json_schema", "json_schema": {...}}
    reasoning_parser: str | None = None   # with response_format: the reasoning convention ("think", "harmony") whose
                                          # thinking comes first, unconstrained; the grammar constrains the answer
    cache_salt: str | None = None     # only requests with the same salt share cached prompt prefixes (vLLM's)

    def __post_init__(self) -> None:
        least = 0 if self.prompt_logprobs is not None else 1      # 0: score the prompt only (echo)
        _check(isinstance(self.max_tokens, int) and self.max_tokens >= least,
               f"max_tokens must be an integer >= {least}, got {self.max_tokens!r}", "max_tokens")
        _check(isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= self.max_tokens,
               f"min_tokens must be an integer from 0 to max_tokens ({self.max_tokens}), got {self.min_tokens!r}",
               "min_tokens")
        rf = self.response_format
        _check(not self.min_tokens or not isinstance(rf, Mapping) or rf.get("type", "text") == "text",
               "min_tokens cannot be combined with a response_format or guided decoding (the grammar ends the value "
               "where it is complete)", "min_tokens")
        _check(self.prompt_logprobs is None or (isinstance(self.prompt_logprobs, int)
                                                and 0 <= self.prompt_logprobs <= 20),
               f"prompt_logprobs must be an integer in [0, 20], got {self.prompt_logprobs!r}", "prompt_logprobs")
        _check(_is_number(self.temperature) and 0 <= self.temperature <= MAX_TEMPERATURE,
               f"temperature must be in [0, {MAX_TEMPERATURE:g}] (0 = greedy), got {self.temperature!r}", "temperature")
        _check(_is_number(self.top_p) and 0 < self.top_p <= 1,
               f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")
        _check(isinstance(self.top_k, int) and self.top_k >= 0,
               f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}", "top_k")
        _check(self.seed is None or (isinstance(self.seed, int) and self.seed >= 0),
               f"seed must be an integer >= 0, got {self.seed!r}", "seed")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        _check(all(isinstance(s, str) and s for s in self.stop), "stop must be non-empty strings", "stop")
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        _check(not isinstance(self.bad_words, str) and all(isinstance(w, str) and w.strip() for w in self.bad_words),
               "bad_words must be a list of non-blank strings", "bad_words")
        object.__setattr__(self, "bad_words", tuple(self.bad_words))
        if self.allowed_token_ids is not None:
            _check(len(self.allowed_token_ids) > 0, "allowed_token_ids must name at least one token id",
                   "allowed_token_ids")
            object.__setattr__(self, "allowed_token_ids", tuple(sorted({int(t) for t in self.allowed_token_ids})))
        _check(_is_number(self.min_p) and 0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p!r}", "min_p")
        _check(_is_number(self.repetition_penalty) and self.repetition_penalty > 0,
               f"repetition_penalty must be > 0, got {self.repetition_penalty!r}", "repetition_penalty")
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            _check(_is_number(v) and -2 <= v <= 2, f"{name} must be in [-2, 2], got {v!r}", name)
        try:
            bias = {int(k): float(v) for k, v in dict(self.logit_bias or {}).items()}
        except (TypeError, ValueError):
            raise InvalidRequestError("logit_bias must map token ids to numbers", "logit_bias") from None
        _check(all(-100 <= v <= 100 or v == -math.inf for v in bias.values()),
               "logit_bias values must be in [-100, 100] (or -inf: never that token)", "logit_bias")
        object.__setattr__(self, "logit_bias", bias)
        _check(isinstance(self.top_logprobs, int) and 0 <= self.top_logprobs <= 20,
               f"top_logprobs must be an integer in [0, 20], got {self.top_logprobs!r}", "top_logprobs")
        _check(isinstance(self.n, int) and 1 <= self.n <= MAX_N,
               f"n must be an integer in [1, {MAX_N}], got {self.n!r}", "n")
        rf = self.response_format
        _check(rf is None or (isinstance(rf, Mapping) and rf.get("type") in FORMAT_TYPES),
               "response_format.type must be one of text, json_object, json_schema", "response_format")
        salt = self.cache_salt
        _check(salt is None or (isinstance(salt, str) and 0 < len(salt) <= MAX_CACHE_SALT
                                and not set(salt) & set(CACHE_SALT_FORBIDDEN)),
               f"cache_salt must be a non-empty string of at most {MAX_CACHE_SALT} characters without "
               f"{', '.join(map(repr, CACHE_SALT_FORBIDDEN))}, got {salt!r}", "cache_salt")
        _check(self.reasoning_parser in (None, "think", "harmony"),
               f"reasoning_parser must be think, harmony or None, got {self.reasoning_parser!r}", "reasoning_parser")

    @property
    def needs_logprobs(self) -> bool:
        return self.logprobs or self.top_logprobs > 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise InvalidRequestError(message, param)


@dataclass(frozen=True)
class TokenLogprob:
    """The sampled token's log-probability and the most likely alternatives (OpenAI's logprobs)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]      # [(token id, logprob)] best first, len = top_logprobs
    rank: int | None = None           # a prompt token's: 1 + how many tokens were likelier (vLLM's prompt_logprobs)


@dataclass
class StreamDelta:
    """New output of one request since the last delta."""

    index: int                        # which prompt (or which of n completions) of the call
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" when finished; "error" (a failed step),
                                      # "shutdown" (cancelled by a server shutting down)
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None   # on the first delta, when asked: one per
                                                               # prompt token, None for the first
    cached_tokens: int | None = None  # on the first delta: prompt tokens taken from the prefix cache
    stop_string: str | None = None    # on the last delta, when a stop string ended the request: which

    def __reduce__(self):             # a step's deltas cross to an HTTP process: fields only, ~3x less to pickle
        return StreamDelta, (self.index, self.text, self.token_ids, self.finish_reason, self.logprobs,
                             self.prompt_logprobs, self.cached_tokens, self.stop_string)


class GrowingText:
    """A reply's text as its deltas come: adding a piece is O(1), reading joins once. (`s += piece` on
    an attribute copies the whole text every token: quadratic in a long reply.)"""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[str] = []

    def add(self, piece: str) -> None:
        if piece:
            self._parts.append(piece)

    def __str__(self) -> str:
        if len(self._parts) > 1:
            self._parts[:] = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""


def merge_ready(deltas: list[StreamDelta]) -> list[StreamDelta]:
    """Deltas that arrived together (a consumer that fell behind the engine), each run of one stream's
    consecutive deltas made one: its texts, ids and logprobs joined, the last one's finish reason.
    A busy server then sends one chunk a stream per wake-up instead of one a token. The first delta
    of a run is changed in place (the caller owns them)."""
    merged: list[StreamDelta] = []
    for d in deltas:
        last = merged[-1] if merged else None
        if last is None or last.index != d.index or last.finish_reason is not None or d.prompt_logprobs is not None:
            merged.append(d)
            continue
        last.text += d.text
        last.token_ids = last.token_ids + d.token_ids
        if last.logprobs is not None or d.logprobs is not None:
            last.logprobs = (last.logprobs or []) + (d.logprobs or [])
        last.finish_reason, last.stop_string = d.finish_reason, d.stop_string
    return merged


@dataclass
class GenerationOutput:
    """A finished request: the generated ids only (no prompt), their text, why it stopped."""

    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    reasoning: str | None = None      # chat(): a reasoning model's thinking (runtime/reasoning.py), apart from
    content: str | None = None        # its answer; both None where the chat template writes no reasoning
    cached_tokens: int = 0            # prompt tokens the prefix cache held (not computed again)

    @property
    def usage(self) -> dict:
        return {"prompt_tokens": len(self.prompt_token_ids), "completion_tokens": len(self.token_ids),
                "total_tokens": len(self.prompt_token_ids) + len(self.token_ids),
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


# -- commands to the engine thread (AsyncEngine puts them on its queue; applied between steps) ------
@dataclass(frozen=True)
class AddRequest:
    """Queue one prompt. The engine thread answers through ``handle``: the requests it made
    (params.n output streams), or the error that refused the prompt."""

    prompt: str | Sequence[int]
    params: SamplingParams | None
    priority: int
    handle: RequestHandle | int       # an int: the call's number on the pipe to an engine process


@dataclass(frozen=True)
class AbortRequest:
    """Stop every output stream of an earlier AddRequest and free their KV pages (the caller left)."""

    handle: RequestHandle | int


@dataclass(frozen=True)
class EmbedRequest:
    """Embed these inputs (text or token ids) between steps; the engine thread resolves ``future``
    (on ``loop``) with Engine.embed's result, or the error that refused them."""

    inputs: Sequence[str | Sequence[int]]
    loop: object                      # asyncio.AbstractEventLoop of the caller (None on the pipe)
    future: object                    # asyncio.Future (on the pipe: the call's number)


EngineCommand = AddRequest | AbortRequest | EmbedRequest


# -- over the pipe between an HTTP process and an engine process (runtime/engine_process.py) ----------
# The commands above cross it too, a call's number (int) in place of its handle and future.
@dataclass(frozen=True)
class EngineLoaded:
    """The engine process's first message on each pipe: what it loaded, or why it could not."""

    info: dict | None                 # max_total_tokens, max_num_seqs, samples_on_device, library_gemm_note,
                                      # pid, stats (an EngineStats)
    error: BaseException | None = None


@dataclass(frozen=True)
class StatsRequest:
    """The engine's EngineStats, answered between steps (an HTTP process's /metrics)."""

    call_id: int


@dataclass(frozen=True)
class StopEngine:
    """End the engine process (sent by the process that started it, once its HTTP side has drained)."""


@dataclass(frozen=True)
class Accepted:
    """An AddRequest applied (``streams`` output streams) or refused (``error``)."""

    call_id: int
    streams: int
    error: Exception | None = None


@dataclass(frozen=True)
class Answer:
    """An EmbedRequest's or StatsRequest's result, or the error that refused it."""

    call_id: int
    result: object
    error: Exception | None = None


@dataclass
class EngineReply:
    """Everything one turn of the engine process's loop has for one HTTP process, sent as one message."""

    accepted: list[Accepted] = field(default_factory=list)
    deltas: list[tuple[int, StreamDelta]] = field(default_factory=list)    # (call id, delta), in order
    answers: list[Answer] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.accepted or self.deltas or self.answers)


# -- engine state, for metrics -------------------------------------------------------------------
@dataclass(frozen=True)
class EngineStats:
    """The engine's state at one moment (Engine.stats()). Counts are sequences (a request with n > 1
    has n), KV pages are the scheduler's page accounting. kv_pages_used + kv_pages_cached +
    kv_pages_free == kv_pages_total."""

    running: int                      # sequences admitted: being prefilled or decoded
    waiting: int                      # sequences queued for admission (new or preempted)
    kv_pages_used: int                # pages held by live sequences (pages shared with the prefix cache too)
    kv_pages_cached: int              # pages only the prefix cache holds (finished requests' KV, evictable)
    kv_pages_free: int
    kv_pages_total: int
    kv_page_size: int                 # tokens per page
    prefix_cache_seqs: int            # finished sequences whose KV the prefix cache keeps
    prefix_cache_hit_tokens: int      # prompt tokens admission found in the prefix cache (not recomputed)
    prefix_cache_queried_tokens: int  # prompt tokens admission looked up
    forwards: int = 0                 # forward passes launched (Engine steps that computed something)
    lookahead_forwards: int = 0       # of them launched before the previous one's tokens were shown (overlap)
    host_gap_seconds: float = 0.0     # the host's time from a forward's tokens coming back to the next launch,
                                      # summed over forwards launched while work remained (the device idles then)
    draft_tokens: int = 0             # speculative decoding: draft tokens checked
    accepted_draft_tokens: int = 0    # of them, kept (the model picked them itself)
