"""OpenAI's HTTP schema for kiln's server: request bodies, their SamplingParams, and reply shapes.

Pure translation, no I/O. server.py parses a body into one of the request
models below, turns it into prompt ids and SamplingParams here, runs
AsyncEngine.generate, and feeds every StreamDelta to a Reply:

    ChatCompletionRequest | CompletionRequest -> chat_params / completion_params -> SamplingParams
    StreamDelta* -> Reply.add(delta) -> a chunk per delta (streaming) or Reply.final() (non-streaming)

Both modes go through Reply.add, so the non-streaming reply is the collected stream.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from .protocol import GrowingText, InvalidRequestError, SamplingParams, StreamDelta, TokenLogprob
from .llama_fields import LlamaServerFields, sampling_overrides, timings
from .reasoning import FIELDS as REASONING_FIELDS
from .tokenizer import piece_bytes


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
    continuous_usage_stats: bool = False   # vLLM's extension: usage on every chunk


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs (its guided_* fields since v0.12): one constraint of json, regex, choice, grammar,
    json_object, structural_tag (xgrammar's, legacy structures-and-triggers or its format tree)."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    disable_any_whitespace: bool = False      # kiln's JSON is always compact: true is what it does, and false allows
                                              # whitespace it does not need to write
    disable_additional_properties: bool = False   # objects without additionalProperties get false
    disable_fallback: bool = False            # one grammar backend (xgrammar): nothing to fall back from
    whitespace_pattern: str | None = None     # refused (vLLM's xgrammar backend refuses it too)


class _GenerationRequest(LlamaServerFields):
    """Fields shared by both routes (llama-server's own among them, as its clients send them: llama_fields). An
    unknown field is refused (400 naming it), never ignored; None means "the default"."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None              # must name the served model when given
    max_tokens: int | None = None
    temperature: float | None = None      # default 1.0; 0 = greedy
    top_p: float | None = None
    top_k: int | None = None              # extension
    min_p: float | None = None            # extension
    n: int | None = None
    best_of: int | None = None            # only best_of == n is accepted (no server-side ranking)
    use_beam_search: bool = False         # vLLM's: the n best of a beam search n wide (runtime/beam_search.py)
    length_penalty: float | None = None   # beam search's score: cumulative logprob / length ** length_penalty
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None   # extension
    repeat_penalty: float | None = None   # llama-server's name for it (with repeat_last_n covering the context)
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    # vLLM's extensions: token ids that end a choice as EOS does, and guided decoding (one at most, not beside a
    # response_format): a JSON schema, a regular expression, one of some strings, or an EBNF grammar (xgrammar's)
    stop_token_ids: list[StrictInt] | None = None
    min_tokens: int | None = None         # no stop before this many tokens
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool | None = None   # special tokens' text left out (kiln's default: shown)
    allowed_token_ids: list[StrictInt] | None = None
    bad_words: list[str] | None = None    # words never generated (tokenized as vLLM does, with and without a space)
    truncate_prompt_tokens: int | None = Field(default=None, ge=1)   # only the prompt's last this-many tokens
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)   # vLLM's: each prompt token's logprob and rank,
                                                                     # and this many likelier alternatives
    return_tokens_as_token_ids: bool = False   # logprobs' tokens as "token_id:N" (exact ids for RL trainers)
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    grammar: str | None = None            # llama-server's names on its OpenAI routes: a GBNF grammar (xgrammar
    json_schema: dict[str, Any] | str | None = None   # reads it) and a JSON schema
    structured_outputs: StructuredOutputs | None = None
    cache_salt: str | None = None         # vLLM's: only requests with the same salt share cached prompt prefixes
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False              # extension
    priority: int = 0                     # extension: used by the "priority" scheduling policy
    user: str | None = None               # OpenAI's end-user tag: accepted; it changes no output
    metadata: dict[str, str] | None = None   # OpenAI's tags for stored completions: accepted; no output change
    store: Literal[False] | None = None   # kiln stores nothing: store=true is refused


class ChatMessageParam(BaseModel):
    """One chat message. Other fields a client sends back (an SDK's refusal, audio, ...) are passed
    through to the chat template."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None    # text, or text parts [{"type": "text", "text": ...}]
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None        # an assistant's calls (its content may be null)
    tool_call_id: str | None = None                       # the call a tool message answers


class ChatPrompt(BaseModel):
    """What renders a chat into its prompt (the chat route's fields; llama-server's /apply-template takes these
    alone)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None              # must name the served model when given
    messages: list[ChatMessageParam] = Field(min_length=1)
    tools: list[Any] | None = None        # runtime/tools.py validates them
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's extensions: the template's generation prompt left out, or the last (assistant) message continued
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None      # a jinja chat template in place of the model's, for this request
    # The chat template's variable of that name (gpt-oss's "Reasoning: low"); refused where it reads none.
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None   # extension (vLLM's): more variables of the template
    documents: list[dict[str, str]] | None = None   # vLLM's: the template's `documents` (RAG templates read them)


class ChatCompletionRequest(_GenerationRequest, ChatPrompt):
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    echo: bool = False                    # vLLM's: the reply's content begins with the last message's, an assistant's
    add_special_tokens: bool = False      # vLLM's: the rendered chat tokenized with the tokenizer's BOS (the template
                                          # writes its own)


def render_options(req: ChatPrompt) -> dict[str, bool]:
    """render_text's add_generation_prompt and continue_final from the request (vLLM's rules: continuing the final
    message takes no generation prompt, and the final message must be the assistant's)."""
    if req.continue_final_message:
        if req.add_generation_prompt:
            raise APIError(400, "continue_final_message continues the last message, so it needs add_generation_prompt "
                                "false (a new turn's prompt would come after it)", "continue_final_message")
        if req.messages[-1].role != "assistant":
            raise APIError(400, "continue_final_message continues an assistant's message; the last message is a "
                                f"{req.messages[-1].role}'s", "continue_final_message")
    return {"add_generation_prompt": req.add_generation_prompt, "continue_final": req.continue_final_message,
            "template": req.chat_template}


# The chat template's own inputs, which a request's own fields fill (chat_template_kwargs may not set them).
TEMPLATE_INPUTS = ("messages", "tools", "add_generation_prompt", "documents", "bos_token", "eos_token")


def template_variables(req: ChatPrompt) -> dict[str, Any]:
    """The chat template variables a request sets (reasoning_effort, documents, chat_template_kwargs)."""
    variables = dict(req.chat_template_kwargs or {})
    for name in variables:
        if name in TEMPLATE_INPUTS:
            raise APIError(400, f"chat_template_kwargs may not set {name!r}: the request's own fields do",
                           "chat_template_kwargs")
    if req.reasoning_effort is not None:
        variables["reasoning_effort"] = req.reasoning_effort
    if req.documents is not None:
        variables["documents"] = req.documents
    return variables


class CompletionRequest(_GenerationRequest):
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    logprobs: int | None = None           # number of alternatives per token (0 = only the sampled one)
    echo: bool = False
    suffix: str | None = None
    add_special_tokens: bool = True       # vLLM's: a text prompt tokenized with the tokenizer's BOS (false: without)


# -- requests -> prompt and SamplingParams ------------------------------------------------
def chat_messages(messages: list[ChatMessageParam]) -> list[dict[str, Any]]:
    """OpenAI messages as the dicts a chat template reads, content-part lists flattened to strings."""
    out = []
    for i, m in enumerate(messages):
        m = m.model_dump(exclude_unset=True)
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise APIError(400, f"messages[{i}].content: only text parts are supported", "messages")
            m = {**m, "content": "".join(p["text"] for p in content)}
        if m["role"] == "assistant":
            m = with_reasoning(m)
        out.append(m)
    return out


# The names chat templates read a past assistant turn's reasoning under: Qwen3's and DeepSeek's
# reasoning_content, gpt-oss's thinking, and vLLM's reasoning; a client sends back any one of them.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def with_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message with its reasoning under every name a template may read it by."""
    reasoning = next((message[k] for k in _REASONING_KEYS if isinstance(message.get(k), str) and message[k]), None)
    return message if reasoning is None else {**message, **dict.fromkeys(_REASONING_KEYS, reasoning)}


def completion_prompts(req: CompletionRequest) -> list[str | list[int]]:
    """The prompts of a completions request: one string or token-id list, or a list of them (each
    answered as its own choices, `n` per prompt, indices prompt * n + k). With a suffix each is the text before
    the hole (fill_in_the_middle)."""
    p = req.prompt
    if req.suffix is not None:
        if req.echo:
            raise APIError(400, "echo cannot be used with suffix (fill-in-the-middle); leave one out", "echo")
        if not (isinstance(p, str) or (isinstance(p, list) and p and all(isinstance(x, str) for x in p))):
            raise APIError(400, "suffix (fill-in-the-middle) takes the text before the hole as prompt: a string or "
                                "a list of strings, not token ids", "prompt")
    if isinstance(p, str):
        return [p]
    if not p:
        raise APIError(400, "prompt is an empty list; pass a string, token ids, or a list of them", "prompt")
    if all(isinstance(t, int) for t in p):
        return [list(p)]
    return list(p)


def fill_in_the_middle(tokenizer, prefix: str, suffix: str, bos: bool = True) -> list[int]:
    """A completions request's prompt (the text before the hole) and suffix (after it) as the model's FIM prompt
    (Tokenizer.fim_prompt; ``bos`` False: without the BOS encode adds), or a 400 naming what the model lacks."""
    ids = tokenizer.fim_prompt(prefix, suffix, bos)
    if ids is None:
        raise APIError(400, "suffix (fill-in-the-middle) needs a code model whose vocabulary marks a prefix, a suffix "
                            "and a middle (<|fim_prefix|>, <fim_prefix>, <｜fim▁begin｜>, <PRE>, ...); this model's "
                            "has no such tokens: leave suffix out", "suffix")
    return ids


def chat_params(req: ChatCompletionRequest, prompt_len: int, context_window: int) -> SamplingParams:
    if req.top_logprobs and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if max_tokens is None:                 # OpenAI: as long as the context allows
        max_tokens = max(1, context_window - prompt_len)
    return _params(req, max_tokens, bool(req.logprobs), req.top_logprobs or 0, context_window,
                   prompt_logprobs=req.prompt_logprobs)


def completion_params(req: CompletionRequest, context_window: int) -> SamplingParams:
    """With echo and logprobs the prompt's tokens are scored too (how lm-eval computes loglikelihoods);
    max_tokens 0 (score only) needs echo, as in OpenAI's API."""
    max_tokens = 16 if req.max_tokens is None else req.max_tokens   # OpenAI's default for completions
    if max_tokens == 0 and not req.echo:
        raise APIError(400, "max_tokens 0 generates nothing; it needs echo: true (to score the prompt)", "max_tokens")
    scored = req.echo and (req.logprobs is not None or max_tokens == 0)
    if scored and req.prompt_logprobs is not None and req.prompt_logprobs != (req.logprobs or 0):
        raise APIError(400, f"prompt_logprobs ({req.prompt_logprobs}) and echo's logprobs ({req.logprobs or 0}) ask "
                            "for different numbers of alternatives a prompt token; send one of them", "prompt_logprobs")
    return _params(req, max_tokens, req.logprobs is not None, req.logprobs or 0, context_window,
                   prompt_logprobs=(req.logprobs or 0) if scored else req.prompt_logprobs)


def _params(req: _GenerationRequest, max_tokens: int, logprobs: bool, top_logprobs: int, context_window: int,
            prompt_logprobs: int | None = None) -> SamplingParams:
    def pick(value, default):
        return default if value is None else value

    if None not in (req.repeat_penalty, req.repetition_penalty) and req.repeat_penalty != req.repetition_penalty:
        raise InvalidRequestError("repeat_penalty is llama-server's name for repetition_penalty; send one of them",
                                  "repeat_penalty")
    penalty = pick(req.repetition_penalty, pick(req.repeat_penalty, 1.0))
    # llama-server's window applies to its repeat_penalty, and to repetition_penalty where repeat_last_n is sent
    windowed = penalty if req.repeat_penalty is not None or "repeat_last_n" in req.model_fields_set else 1.0
    over = sampling_overrides(req, pick(req.top_k, 0), windowed, context_window)

    if req.best_of is not None and req.best_of != pick(req.n, 1):
        raise InvalidRequestError(f"best_of {req.best_of} is not supported: kiln does not rank candidates; "
                                  "leave best_of out or set it equal to n", "best_of")
    if req.seed is not None and req.seed < 0:
        raise InvalidRequestError(f"seed must be an integer >= 0, got {req.seed}", "seed")
    if req.prompt_logprobs is not None and req.stream:
        raise InvalidRequestError("prompt_logprobs are not available when streaming (as in vLLM); leave out one of "
                                  "them", "prompt_logprobs")
    kw = dict(
        max_tokens=max_tokens, temperature=pick(req.temperature, 1.0), top_p=pick(req.top_p, 1.0),
        top_k=pick(req.top_k, 0), min_p=pick(req.min_p, 0.0), n=pick(req.n, 1), seed=req.seed,
        stop=pick(req.stop, ()), stop_token_ids=pick(req.stop_token_ids, ()), ignore_eos=req.ignore_eos,
        min_tokens=pick(req.min_tokens, 0), include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=bool(req.skip_special_tokens), allowed_token_ids=req.allowed_token_ids,
        bad_words=pick(req.bad_words, ()),
        presence_penalty=pick(req.presence_penalty, 0.0), frequency_penalty=pick(req.frequency_penalty, 0.0),
        repetition_penalty=penalty, logit_bias=_logit_bias(req.logit_bias),
        logprobs=logprobs, top_logprobs=top_logprobs, response_format=guided_format(req),
        prompt_logprobs=prompt_logprobs, cache_salt=req.cache_salt)
    return SamplingParams(**{**kw, **over})


GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "grammar", "json_schema",
          "structured_outputs")
BEAM_REFUSES = ("stop", "stop_token_ids", "min_tokens", "top_p", "top_k", "min_p", "presence_penalty",
                "frequency_penalty", "repetition_penalty", "logit_bias", "response_format", *GUIDED, "bad_words",
                "allowed_token_ids", "logprobs", "top_logprobs", "echo", "suffix", "tools", "samplers",
                "repeat_penalty")


def beam_search_of(req: _GenerationRequest) -> float | None:
    """The request's length_penalty when it asks for beam search (None when not); what a beam search cannot honour
    is a 400 naming it (vLLM's beam search reads none of these)."""
    if not req.use_beam_search:
        if req.length_penalty is not None:
            raise APIError(400, "length_penalty scores beams: it needs use_beam_search: true", "length_penalty")
        return None
    given = [name for name in BEAM_REFUSES if (v := getattr(req, name, None)) is not None and v is not False
             and v != [] and v != {}]
    if given:
        raise APIError(400, f"{given[0]} cannot be used with use_beam_search (the search ranks whole beams by their "
                            "logprobs); leave it out", given[0])
    if (req.n or 1) > 10:
        raise APIError(400, f"use_beam_search keeps n beams and reads 2 x n alternatives a step (20 at most): n must "
                            f"be 10 or less, got {req.n}", "n")
    return 1.0 if req.length_penalty is None else req.length_penalty


def truncated(req: _GenerationRequest, ids: list[int]) -> list[int]:
    """A prompt's ids, only its last truncate_prompt_tokens where the request says (vLLM's extension)."""
    n = req.truncate_prompt_tokens
    return ids if n is None else ids[-n:]


def guided_format(req: _GenerationRequest) -> dict[str, Any] | None:
    """The request's response_format (OpenAI's types, and vLLM's structural_tag), or its vLLM guided_* field or
    structured_outputs constraint as one: json a json_schema, regex and choice (its strings, any one whole) kiln's
    "regex" and "grammar", grammar kiln's "grammar", structural_tag xgrammar's (runtime/grammar.py compiles each;
    "param" names the field an error is about)."""
    rf = req.response_format
    if rf is not None and rf.get("type") not in ("text", "json_object", "json_schema", "structural_tag"):
        raise APIError(400, f"response_format.type must be text, json_object, json_schema or structural_tag, got "
                            f"{rf.get('type')!r}", "response_format")
    if rf is not None and rf.get("type") == "structural_tag":
        return {"type": "structural_tag", "structural_tag": dict(rf), "param": "response_format"}
    given = [name for name in GUIDED if getattr(req, name) is not None]
    if not given:
        return rf
    if len(given) > 1 or (rf is not None and rf.get("type") != "text"):
        other = given[1] if len(given) > 1 else "response_format"
        raise APIError(400, f"{given[0]} cannot be combined with {other}: send one constraint", other)
    name, value = given[0], getattr(req, given[0])
    if name == "structured_outputs":
        return _structured_outputs(value)
    kind = name.removeprefix("guided_")
    return constraint_format("json" if kind == "json_schema" else kind, value, name)


def constraint_format(kind: str, value: Any, param: str) -> dict[str, Any]:
    """One guided-decoding constraint (json, regex, choice, grammar, json_object, structural_tag) as a
    response_format."""
    if kind == "json_object":
        return {"type": "json_object", "param": param}
    if kind in ("json", "structural_tag"):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise APIError(400, f"{param} is not valid JSON: {e}", param) from None
        if not isinstance(value, dict):
            raise APIError(400, f"{param} must be a JSON object, got {type(value).__name__}", param)
        if kind == "structural_tag":
            return {"type": "structural_tag", "structural_tag": value, "param": param}
        return {"type": "json_schema", "json_schema": {"name": param, "schema": value}, "param": param}
    if kind == "choice":
        if not value or not all(value):
            raise APIError(400, f"{param} needs one or more non-empty strings", param)
        grammar = "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in value)
        return {"type": "grammar", "grammar": grammar, "param": param}
    if not value:
        raise APIError(400, f"{param} is empty", param)
    return {"type": kind, kind: value, "param": param}


def _structured_outputs(so: StructuredOutputs) -> dict[str, Any]:
    """vLLM's structured_outputs as a response_format: exactly one constraint, its options applied or refused."""
    kinds = {"json": so.json_, "regex": so.regex, "choice": so.choice, "grammar": so.grammar,
             "json_object": so.json_object or None, "structural_tag": so.structural_tag}
    given = [k for k, v in kinds.items() if v is not None]
    if len(given) != 1:
        raise APIError(400, "structured_outputs takes exactly one of json, regex, choice, grammar, json_object and "
                            f"structural_tag; got {', '.join(given) or 'none'}", "structured_outputs")
    if so.whitespace_pattern is not None:
        raise APIError(400, "structured_outputs.whitespace_pattern is not supported (kiln's JSON is compact, as "
                            "vLLM's xgrammar backend refuses a pattern too); leave it out", "structured_outputs")
    out = constraint_format(given[0], kinds[given[0]], f"structured_outputs.{given[0]}")
    if so.disable_additional_properties and out["type"] == "json_schema":
        out["json_schema"]["schema"] = closed_objects(out["json_schema"]["schema"])
    return out


def closed_objects(schema: Any) -> Any:
    """The schema with additionalProperties: false on each object schema that does not say (vLLM's
    disable_additional_properties)."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed_objects(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


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
    """{"tokens", "token_logprobs", "top_logprobs", "text_offset"}, as OpenAI's completions API. An echoed
    prompt's first token has no logprob: its TokenLogprob is `unscored(token_id)` (logprob NaN)."""
    tokens = [text(lp.token_id)[0] for lp in lps]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    first = [lp.logprob != lp.logprob for lp in lps]          # NaN: an unscored first prompt token
    return {"tokens": tokens, "token_logprobs": [None if f else lp.logprob for lp, f in zip(lps, first)],
            "top_logprobs": [None if f else {text(i)[0]: l for i, l in lp.top} for lp, f in zip(lps, first)],
            "text_offset": offsets}


def unscored(token_id: int) -> TokenLogprob:
    return TokenLogprob(token_id, float("nan"), [])


@dataclass
class _Choice:
    shown: GrowingText = field(default_factory=GrowingText)
    num_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    text_offset: int = 0                  # completions logprobs: where the next token starts
    thought: GrowingText = field(default_factory=GrowingText)   # chat: the reasoning, apart from the text
    parser: Any = None                    # chat: its reasoning.ReasoningParser, when the reply has one
    cached_tokens: int = 0                # its prompt's tokens the prefix cache held
    stop_reason: str | None = None        # the stop string that ended it (vLLM's stop_reason)
    first: float | None = None            # when its first token came (llama-server's timings)
    end: float = 0.0                      # when its last delta came

    @property
    def text(self) -> str:
        return str(self.shown)


@dataclass(frozen=True)
class Echo:
    """What `echo` puts before each choice of one prompt: its text and token ids."""
    text: str
    ids: list[int]


def chat_echo(req: ChatCompletionRequest) -> list[Echo] | None:
    """vLLM's chat `echo`: the reply (an assistant's) begins with the last message's content where that message is an
    assistant's too (text parts joined by newlines, as vLLM joins them); after any other message nothing is echoed."""
    last = req.messages[-1]
    if not req.echo or last.role != "assistant":
        return None
    content = last.content or ""
    if not isinstance(content, str):
        content = "\n".join(part.get("text", "") for part in content)
    return [Echo(content, [])]


@dataclass
class Reply:
    """One request's reply, built delta by delta: the chunks of a stream, or the collected response.
    With `echo` (completions), a choice starts with its prompt's text, and its logprobs with the
    prompt tokens' (from the first delta of the prompt's first choice: prompt_logprobs); a chat's echo (no ids, no
    logprobs) starts its content, after any reasoning."""

    kind: Literal["chat", "completion"]
    model: str
    prompt_tokens: int
    token_text: TokenText
    logprobs: bool = False
    include_usage: bool = False           # streaming: usage null on every chunk, then a usage chunk
    continuous_usage: bool = False        # streaming: the usage so far on every chunk instead of null
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    choices: dict[int, _Choice] = field(default_factory=dict)
    echo: list[Echo] | None = None        # per prompt; choice index // n picks it
    n: int = 1
    reasoning: Callable[[], Any] | None = None   # chat: a new reasoning.ReasoningParser for each choice
    prompt_logprobs: bool = False         # vLLM's prompt_logprobs: a completion's choices (a chat's reply) carry them
    timings: bool = False                 # llama-server's timings_per_token: timings on every chunk and the response
    arrival: float = field(default_factory=time.monotonic)
    _scored: dict[int, list] = field(default_factory=dict)   # prompt -> its prompt logprobs

    def __post_init__(self) -> None:
        self.id = self.id or ("chatcmpl-" if self.kind == "chat" else "cmpl-") + secrets.token_hex(12)

    @property
    def object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def add(self, delta: StreamDelta) -> dict | None:
        """Record a delta; returns its stream chunk (None when it carries nothing to show)."""
        first = delta.index not in self.choices
        choice = self.choices.setdefault(delta.index, _Choice())
        choice.end = time.monotonic()
        if delta.token_ids and choice.first is None:
            choice.first = choice.end
        text, lps = delta.text, (delta.logprobs or []) if self.logprobs else []
        if delta.prompt_logprobs is not None:
            self._scored[delta.index // self.n] = delta.prompt_logprobs
        echoed = ""
        if first and self.echo is not None:
            echoed, lps = self._echoed(delta), self._echoed_logprobs(delta) + lps
        if self.kind == "completion":
            text, echoed = echoed + text, ""
        thought = ""
        if self.reasoning is not None:
            thought, text = self._reason(choice, text, delta.finish_reason is not None)
        text = echoed + text
        choice.shown.add(text)
        choice.num_tokens += len(delta.token_ids)
        choice.cached_tokens = delta.cached_tokens or choice.cached_tokens
        choice.finish_reason, choice.stop_reason = delta.finish_reason, delta.stop_string
        choice.logprobs += lps
        if not (first or text or thought or delta.finish_reason or lps):
            return None
        if self.kind == "chat":
            body: dict[str, Any] = {"delta": chat_message(text, thought, role=first),
                                    "logprobs": chat_logprobs(lps, self.token_text) if lps else None}
        else:
            body = {"text": text,
                    "logprobs": completion_logprobs(lps, self.token_text, choice.text_offset) if lps else None}
        choice.text_offset += sum(len(self.token_text(lp.token_id)[0]) for lp in lps)
        chunk = self._envelope("chat.completion.chunk" if self.kind == "chat" else "text_completion",
                               [{"index": delta.index, **body, "finish_reason": delta.finish_reason,
                                 **({"stop_reason": delta.stop_string} if delta.finish_reason else {})}])
        if self.include_usage or self.continuous_usage:
            chunk["usage"] = self.usage() if self.continuous_usage else None
        return chunk

    def _reason(self, choice: _Choice, text: str, last: bool) -> tuple[str, str]:
        """(reasoning, content) of a choice's new text, and the held-back rest at its end."""
        if choice.parser is None:
            choice.parser = self.reasoning()
        thought, text = choice.parser.read(text, last)
        choice.thought.add(thought)
        return thought, text

    def _echoed(self, delta: StreamDelta) -> str:
        return self.echo[delta.index // self.n].text

    def _echoed_logprobs(self, delta: StreamDelta) -> list[TokenLogprob]:
        if not self.logprobs:
            return []
        prompt = delta.index // self.n
        scored = self._scored.get(prompt) or [None] * len(self.echo[prompt].ids)
        return [lp if lp is not None else unscored(t) for t, lp in zip(self.echo[prompt].ids, scored)]

    def usage(self) -> dict:
        """OpenAI's usage: the prompt's tokens once (whatever n), those of it the prefix cache held as
        prompt_tokens_details.cached_tokens (each prompt's first choice's: the others fork it)."""
        completion = sum(c.num_tokens for c in self.choices.values())
        cached = sum(c.cached_tokens for i, c in self.choices.items() if i % self.n == 0)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion, "prompt_tokens_details": {"cached_tokens": cached}}

    def timings_of(self, index: int) -> dict[str, float]:
        """llama-server's timings of a choice (its prompt's evaluation, then its tokens)."""
        c = self.choices[index]
        return timings(self.arrival, c.first, c.end, self.prompt_tokens, c.cached_tokens, c.num_tokens)

    def usage_chunk(self) -> dict:
        return {**self._envelope("chat.completion.chunk" if self.kind == "chat" else "text_completion", []),
                "usage": self.usage()}

    def final(self) -> dict:
        """The non-streaming response: every choice's collected text, logprobs and finish reason."""
        choices = []
        for index, c in sorted(self.choices.items()):
            if self.kind == "chat":
                body: dict[str, Any] = {"message": chat_message(c.text, str(c.thought), role=True, whole=True),
                                        "logprobs": chat_logprobs(c.logprobs, self.token_text)
                                        if self.logprobs else None}
            else:
                body = {"text": c.text,
                        "logprobs": completion_logprobs(c.logprobs, self.token_text, 0) if self.logprobs else None}
                if self.prompt_logprobs:
                    body["prompt_logprobs"] = self._prompt_logprobs(index // self.n)
            choices.append({"index": index, **body, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
        out = {**self._envelope(self.object, choices), "usage": self.usage()}
        if self.timings and self.choices:
            out["timings"] = self.timings_of(min(self.choices))
        if self.prompt_logprobs and self.kind == "chat":
            out["prompt_logprobs"] = self._prompt_logprobs(0)
        return out

    def _prompt_logprobs(self, prompt: int) -> list[dict | None]:
        """vLLM's prompt_logprobs: None for the first token, then a map of token id (a string) to its logprob, rank and
        text: the prompt token's own, and its likelier alternatives' (ranked by their place)."""
        def entry(token_id: int, logprob: float, rank: int | None) -> dict:
            return {"logprob": logprob, "rank": rank, "decoded_token": self.token_text(token_id)[0]}
        out: list[dict | None] = []
        for lp in self._scored.get(prompt, []):
            if lp is None:
                out.append(None)
                continue
            ranked = {str(t): entry(t, v, i + 1) for i, (t, v) in enumerate(lp.top)}
            out.append({**ranked, str(lp.token_id): entry(lp.token_id, lp.logprob, lp.rank)})
        return out

    def _envelope(self, object: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": object, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}


def chat_message(content: str, reasoning: str, role: bool, whole: bool = False) -> dict[str, Any]:
    """A chat message (whole) or a chunk's delta: content, and the reasoning under both names
    (reasoning.FIELDS) where there is some. Content is null where a reply's text was all reasoning; a
    delta carrying only reasoning has none."""
    out: dict[str, Any] = {"role": "assistant"} if role else {}
    if content or not reasoning:
        out["content"] = content
    elif whole:
        out["content"] = None
    if reasoning:
        out.update(dict.fromkeys(REASONING_FIELDS, reasoning))
    return out


# -- token texts for logprobs --------------------------------------------------------------
def token_id_text(token_id: int) -> tuple[str, bytes]:
    """A token as vLLM's return_tokens_as_token_ids writes it in logprobs: "token_id:N" (its bytes and text offsets
    that string's)."""
    label = f"token_id:{token_id}"
    return label, label.encode()


def token_text(tokenizer: Any, token_id: int) -> tuple[str, bytes]:
    """(text, bytes) of one token. A byte-level BPE piece that ends inside a UTF-8 character decodes
    to U+FFFD; its bytes come from the piece itself, and its text is "bytes:\\xNN..." as OpenAI writes it."""
    if tokenizer is None:
        return f"<token {token_id}>", b""
    text = tokenizer.decode([token_id])
    if "\ufffd" not in text:
        return text, text.encode("utf-8")
    raw = piece_bytes(tokenizer.id_to_token(token_id) or "")
    if raw is None:
        return text, text.encode("utf-8")
    try:
        return raw.decode("utf-8"), raw
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), raw


