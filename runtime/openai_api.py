"""OpenAI's HTTP schema for kiln's server: request bodies, their SamplingParams, and reply shapes.

Pure translation, no I/O. server.py parses a body into one of the request
models below, turns it into prompt ids and SamplingParams here, runs
AsyncEngine.generate, and feeds every StreamDelta to a Reply:

    ChatCompletionRequest | CompletionRequest -> chat_params / completion_params -> SamplingParams
    StreamDelta* -> Reply.add(delta) -> a chunk per delta (streaming) or Reply.final() (non-streaming)

Both modes go through Reply.add, so the non-streaming reply is the collected stream.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, StrictInt

from .protocol import InvalidRequestError, SamplingParams, StreamDelta, TokenLogprob


class APIError(Exception):
    """An error the server answers in OpenAI's format: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# -- request bodies ------------------------------------------------------------------------
class StreamOptions(BaseModel):
    include_usage: bool = False


class _GenerationRequest(BaseModel):
    """Fields shared by both routes. Unknown fields are ignored; None means "the default"."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None              # must name the served model when given
    max_tokens: int | None = None
    temperature: float | None = None      # default 1.0; 0 = greedy
    top_p: float | None = None
    top_k: int | None = None              # extension
    min_p: float | None = None            # extension
    n: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None   # extension
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False              # extension
    priority: int = 0                     # extension: used by the "priority" scheduling policy
    user: str | None = None               # accepted and ignored


class ChatCompletionRequest(_GenerationRequest):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class CompletionRequest(_GenerationRequest):
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    logprobs: int | None = None           # number of alternatives per token (0 = only the sampled one)
    echo: bool = False
    suffix: str | None = None


# -- requests -> prompt and SamplingParams ------------------------------------------------
def chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages with content-part lists ([{"type": "text", "text": ...}]) flattened to strings."""
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise APIError(400, f"messages[{i}].content: only text parts are supported", "messages")
            m = {**m, "content": "".join(p["text"] for p in content)}
        out.append(m)
    return out


def completion_prompt(req: CompletionRequest) -> str | list[int]:
    """The one prompt of a completions request: text or token ids (a list of several is refused)."""
    if req.echo or req.suffix:
        raise APIError(400, "echo and suffix are not supported", "echo" if req.echo else "suffix")
    p = req.prompt
    if isinstance(p, str) or all(isinstance(t, int) for t in p):
        return p
    if len(p) != 1:
        raise APIError(400, f"a list of {len(p)} prompts is not supported; send one request per prompt", "prompt")
    return p[0]


def chat_params(req: ChatCompletionRequest, prompt_len: int, context_window: int) -> SamplingParams:
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if max_tokens is None:                 # OpenAI: as long as the context allows
        max_tokens = max(1, context_window - prompt_len)
    return _params(req, max_tokens, bool(req.logprobs), req.top_logprobs or 0)


def completion_params(req: CompletionRequest) -> SamplingParams:
    max_tokens = 16 if req.max_tokens is None else req.max_tokens   # OpenAI's default for completions
    return _params(req, max_tokens, req.logprobs is not None, req.logprobs or 0)


def _params(req: _GenerationRequest, max_tokens: int, logprobs: bool, top_logprobs: int) -> SamplingParams:
    def pick(value, default):
        return default if value is None else value

    if req.seed is not None and req.seed < 0:
        raise InvalidRequestError(f"seed must be an integer >= 0, got {req.seed}", "seed")
    return SamplingParams(
        max_tokens=max_tokens, temperature=pick(req.temperature, 1.0), top_p=pick(req.top_p, 1.0),
        top_k=pick(req.top_k, 0), min_p=pick(req.min_p, 0.0), n=pick(req.n, 1), seed=req.seed,
        stop=pick(req.stop, ()), ignore_eos=req.ignore_eos,
        presence_penalty=pick(req.presence_penalty, 0.0), frequency_penalty=pick(req.frequency_penalty, 0.0),
        repetition_penalty=pick(req.repetition_penalty, 1.0), logit_bias=_logit_bias(req.logit_bias),
        logprobs=logprobs, top_logprobs=top_logprobs, response_format=req.response_format)


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI sends token ids as string keys."""
    out = {}
    for k, v in (bias or {}).items():
        try:
            out[int(k)] = v
        except ValueError:
            raise InvalidRequestError(f"logit_bias keys must be token ids, got {k!r}", "logit_bias") from None
    return out


# -- replies ------------------------------------------------------------------------------
TokenText = Callable[[int], tuple[str, bytes]]   # token id -> its text and bytes, for logprobs


def chat_logprobs(lps: list[TokenLogprob], text: TokenText) -> dict:
    """{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}, as OpenAI's chat API."""
    def entry(token_id: int, logprob: float) -> dict:
        t, raw = text(token_id)
        return {"token": t, "logprob": logprob, "bytes": list(raw)}

    return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(i, l) for i, l in lp.top]}
                        for lp in lps]}


def completion_logprobs(lps: list[TokenLogprob], text: TokenText, offset: int) -> dict:
    """{"tokens", "token_logprobs", "top_logprobs", "text_offset"}, as OpenAI's completions API."""
    tokens = [text(lp.token_id)[0] for lp in lps]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [{text(i)[0]: l for i, l in lp.top} for lp in lps], "text_offset": offsets}


@dataclass
class _Choice:
    text: str = ""
    num_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    text_offset: int = 0                  # completions logprobs: where the next token starts


@dataclass
class Reply:
    """One request's reply, built delta by delta: the chunks of a stream, or the collected response."""

    kind: Literal["chat", "completion"]
    model: str
    prompt_tokens: int
    token_text: TokenText
    logprobs: bool = False
    include_usage: bool = False           # streaming: usage null on every chunk, then a usage chunk
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    choices: dict[int, _Choice] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.id = self.id or ("chatcmpl-" if self.kind == "chat" else "cmpl-") + secrets.token_hex(12)

    @property
    def object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def add(self, delta: StreamDelta) -> dict | None:
        """Record a delta; returns its stream chunk (None when it carries nothing to show)."""
        first = delta.index not in self.choices
        choice = self.choices.setdefault(delta.index, _Choice())
        choice.text += delta.text
        choice.num_tokens += len(delta.token_ids)
        choice.finish_reason = delta.finish_reason
        lps = (delta.logprobs or []) if self.logprobs else []
        choice.logprobs += lps
        if not (first or delta.text or delta.finish_reason or lps):
            return None
        if self.kind == "chat":
            body: dict[str, Any] = {"delta": {"role": "assistant", "content": delta.text} if first
                                    else {"content": delta.text},
                                    "logprobs": chat_logprobs(lps, self.token_text) if lps else None}
        else:
            body = {"text": delta.text,
                    "logprobs": completion_logprobs(lps, self.token_text, choice.text_offset) if lps else None}
        choice.text_offset += sum(len(self.token_text(lp.token_id)[0]) for lp in lps)
        chunk = self._envelope("chat.completion.chunk" if self.kind == "chat" else "text_completion",
                               [{"index": delta.index, **body, "finish_reason": delta.finish_reason}])
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def usage(self) -> dict:
        completion = sum(c.num_tokens for c in self.choices.values())
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}

    def usage_chunk(self) -> dict:
        return {**self._envelope("chat.completion.chunk" if self.kind == "chat" else "text_completion", []),
                "usage": self.usage()}

    def final(self) -> dict:
        """The non-streaming response: every choice's collected text, logprobs and finish reason."""
        choices = []
        for index, c in sorted(self.choices.items()):
            if self.kind == "chat":
                body: dict[str, Any] = {"message": {"role": "assistant", "content": c.text},
                                        "logprobs": chat_logprobs(c.logprobs, self.token_text)
                                        if self.logprobs else None}
            else:
                body = {"text": c.text,
                        "logprobs": completion_logprobs(c.logprobs, self.token_text, 0) if self.logprobs else None}
            choices.append({"index": index, **body, "finish_reason": c.finish_reason})
        return {**self._envelope(self.object, choices), "usage": self.usage()}

    def _envelope(self, object: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": object, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}
