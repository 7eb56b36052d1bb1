"""llama.cpp's own server routes, for the clients written against llama-server (llama.vim, llama.vscode, scripts):

    POST /completion (/completions)  a prompt (text, token ids, or both mixed; several prompts answer an array),
                                     llama.cpp's sampling fields and defaults, streamed as llama-server streams
                                     (`data:` events of content and tokens, the last one `stop: true`, no [DONE])
    POST /infill                     code infilling: input_prefix, input_suffix, input_extra and prompt laid out as
                                     llama-server's format_prompt_infill lays them out (repository-level where the
                                     vocabulary has <|fim_repo|> / <|file_sep|>)
    POST /apply-template             a chat rendered by the model's template, as /v1/chat/completions renders it
                                     (tools, template variables, generation prompt): {"prompt": text}
    GET /props                       the server's properties (context size, default sampling, slots, chat template,
                                     BOS / EOS, modalities); they are set when kiln starts: POST /props (llama-server's
                                     with --props) is a 405

Every field llama-server reads is implemented, or refused with a 400 naming it where it asks for what kiln does not
do (Mirostat, DRY, XTC, typical-p, dynamic temperature, ... set away from their disabled values; presence and
frequency penalties, which llama.cpp counts over the last repeat_last_n tokens, prompt included). Fields that only
tune a sampler left off, or llama.cpp's own cache bookkeeping (cache_prompt, n_keep, n_cache_reuse, id_slot: kiln's
prefix cache is automatic and an over-long prompt is refused, never shifted), change no output and are accepted, as
is t_max_prompt_ms, which llama-server reads and does not act on yet.
Sampling follows llama.cpp's chain: top-k, top-p and min-p choose on the untempered distribution, temperature
applies to what they kept (SamplingParams.temperature_last; the OpenAI routes temper first, as vLLM does); a
`samplers` list sets the chain (what it leaves out is off; `infill` adds llama.cpp's infill sampler,
sampler.infill_candidates). ignore_eos bans the end-of-generation tokens, as llama-server does.
What the code editors send (llama.vim, llama.vscode) is served: n_indent and t_max_predict_ms end a middle early
(llama_fields.editor_limits), response_fields picks the result's fields. The fields llama-server's OpenAI routes read
too are runtime/llama_fields.py's, shared with kiln's OpenAI routes."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, ConfigDict, StrictInt, model_validator

from .. import __version__
from . import reply_models as rm
from . import tools
from .http_errors import FAILED
from .openai_api import (APIError, ChatPrompt, chat_messages, constraint_format, error_body, render_options,
                         template_variables)
from .llama_fields import LlamaServerFields, limits_of, sampling_overrides, timings
from .protocol import SamplingParams, StreamDelta, TokenLogprob
from .reply_stream import event

N_BATCH = 2048          # llama-server's default --batch-size: what /infill's prefix and suffix are cut to fit
REPO_TOKENS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")   # llama.cpp's FIM_REP names
FILE_SEP_TOKENS = ("<|file_sep|>",)                                                      # its FIM_SEP
SNIPPET = "\n\n--- snippet ---\n\n"     # what separates input_extra's chunks where the vocabulary has no FIM_SEP

class LlamaCompletionRequest(LlamaServerFields):
    """llama-server's /completion body (its defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05; a field sent
    as null is its default, as llama-server reads it); the fields its OpenAI routes share are llama_fields'."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    prompt: str | list[StrictInt | str] | list[str | list[StrictInt | str]] = ""
    model: str | None = None
    stream: bool = False
    n_predict: int | None = None                  # -1: until the context is full
    max_tokens: int | None = None                 # n_predict's aliases
    max_completion_tokens: int | None = None
    n_cmpl: int | None = None                     # completions per prompt (alias n)
    n: int | None = None
    temperature: float = 0.8                      # <= 0: greedy
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = -1                                # -1: random
    stop: list[str] = []
    ignore_eos: bool = False
    n_probs: int | None = None                    # the top n_probs tokens of each generated one (alias logprobs)
    logprobs: int | None = None
    return_tokens: bool = False
    logit_bias: list[list[Any]] | dict[str, float | bool] | None = None   # [[id or text, bias or false]] or a map
    grammar: str | None = None                    # GBNF (xgrammar reads llama.cpp's grammar format)
    json_schema: dict[str, Any] | None = None
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    response_fields: list[str] = []               # only these fields of the result ("timings/prompt_n": nested)

    @property
    def predict(self) -> int:
        """n_predict, else its aliases max_tokens, max_completion_tokens (-1 when none is given)."""
        return next((v for v in (self.n_predict, self.max_tokens, self.max_completion_tokens) if v is not None), -1)


class InfillRequest(LlamaCompletionRequest):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[dict[str, str]] = []        # [{"filename": ..., "text": ...}], before the FIM prefix


class AppliedTemplate(BaseModel):
    prompt: str


class Props(BaseModel):
    default_generation_settings: dict[str, Any]
    total_slots: int
    model_alias: str
    model_path: str
    modalities: dict[str, bool]
    chat_template: str
    bos_token: str
    eos_token: str
    build_info: str
    endpoint_slots: bool
    endpoint_props: bool
    endpoint_metrics: bool
    is_sleeping: bool


class LlamaTopProb(BaseModel):
    id: int
    token: str
    bytes: list[int]
    logprob: float


class LlamaTokenProb(LlamaTopProb):
    top_logprobs: list[LlamaTopProb]


class LlamaCompletion(BaseModel):
    index: int
    content: str
    tokens: list[int]
    id_slot: int
    stop: bool
    model: str
    tokens_predicted: int
    tokens_evaluated: int
    generation_settings: dict[str, Any]
    prompt: str
    has_new_line: bool
    truncated: bool
    stop_type: str
    stopping_word: str
    tokens_cached: int
    timings: dict[str, float]
    completion_probabilities: list[LlamaTokenProb] | None = None


def sampling(req: LlamaCompletionRequest, prompt_len: int, context_window: int, tokenizer) -> SamplingParams:
    """The request's SamplingParams (a 400 naming the field where it asks for what kiln does not do)."""
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            raise APIError(400, f"{name}: llama.cpp counts it over the last repeat_last_n tokens, prompt included, "
                                "kiln over the generated tokens only (OpenAI's rule): send it to /v1/completions", name)
    over = sampling_overrides(req, req.top_k, req.repeat_penalty, context_window)
    if req.seed < -1 or req.seed >= 1 << 32:
        raise APIError(400, f"seed must be -1 (random) or from 0 to 4294967295, got {req.seed}", "seed")
    n_predict = req.predict
    if n_predict < -1:
        raise APIError(400, f"n_predict must be -1 (until the context is full) or >= 0, got {n_predict}", "n_predict")
    if n_predict == -1:
        n_predict = max(1, context_window - prompt_len)
    n_probs = next((v for v in (req.n_probs, req.logprobs) if v is not None), 0)
    if not 0 <= n_probs <= 20:
        raise APIError(400, f"n_probs must be from 0 to 20 (the alternatives kiln returns a token), got {n_probs}",
                       "n_probs")
    if req.grammar is not None and req.json_schema is not None:
        raise APIError(400, "send one of grammar and json_schema", "json_schema")
    kw = dict(max_tokens=n_predict, prompt_logprobs=0 if n_predict == 0 else None,
              # top_k, top_p and min_p clamped into their ranges, as llama-server clamps them (top_p 0: the likeliest)
              temperature=max(req.temperature, 0.0), top_k=max(req.top_k, 0), top_p=min(max(req.top_p, 1e-9), 1.0),
              min_p=min(max(req.min_p, 0.0), 1.0),
              seed=None if req.seed == -1 else req.seed, stop=req.stop, ignore_eos=req.ignore_eos,
              n=next((v for v in (req.n_cmpl, req.n) if v is not None), 1), repetition_penalty=req.repeat_penalty,
              logit_bias=logit_bias(req.logit_bias, tokenizer), logprobs=n_probs > 0, top_logprobs=n_probs,
              response_format=_format(req), temperature_last=True)
    return SamplingParams(**{**kw, **over})


def _format(req: LlamaCompletionRequest) -> dict[str, Any] | None:
    if req.json_schema is not None:                   # llama.cpp: an empty schema is any object
        return constraint_format("json", req.json_schema or {"type": "object"}, "json_schema")
    if req.grammar:
        return constraint_format("grammar", req.grammar, "grammar")
    return None


def logit_bias(given, tokenizer) -> dict[int, float]:
    """llama.cpp's logit_bias: [[token id or text, bias]] pairs or a {"id or text": bias} map; a text biases each of
    its tokens, and a bias of false bans the token (-inf)."""
    pairs = list(given.items()) if isinstance(given, dict) else list(given or ())
    out: dict[int, float] = {}
    for pair in pairs:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise APIError(400, f"logit_bias entries are [token id or text, bias] pairs, got {pair!r}", "logit_bias")
        key, bias = pair
        if bias is False:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise APIError(400, f"a logit_bias bias is a number or false, got {bias!r}", "logit_bias")
        if isinstance(key, str) and key.lstrip("-").isdigit():
            key = int(key)
        if isinstance(key, int) and not isinstance(key, bool):
            ids = [key]
        elif isinstance(key, str) and tokenizer is not None:
            ids = tokenizer.encode(key, add_special_tokens=False)
        else:
            raise APIError(400, f"a logit_bias key is a token id or a text, got {key!r}", "logit_bias")
        out.update(dict.fromkeys(ids, float(bias)))
    return out


def prompt_ids(prompt, tokenizer) -> list[list[int]]:
    """llama.cpp's prompt shapes: a text, token ids, ids and texts mixed (one prompt: a text first gets the BOS), or a
    list of those (several prompts: any list without a bare id in it)."""
    if isinstance(prompt, list) and not any(isinstance(p, int) for p in prompt):
        if not prompt:
            raise APIError(400, "prompt must not be empty", "prompt")
        return [_one_prompt(p, tokenizer) for p in prompt]
    return [_one_prompt(prompt, tokenizer)]


def _one_prompt(prompt, tokenizer, special: bool = True) -> list[int]:
    """One prompt's ids; ``special``: a text first is encoded with the tokenizer's BOS (llama.cpp's add_special)."""
    parts = [prompt] if isinstance(prompt, str) else prompt
    if not all(isinstance(p, (int, str)) for p in parts):
        raise APIError(400, "a prompt is a text, token ids, or both in one list (here: one prompt, not several)",
                       "prompt")
    if any(isinstance(p, str) for p in parts) and tokenizer is None:
        raise APIError(400, "this artifact has no tokenizer; send the prompt as token ids", "prompt")
    ids: list[int] = []
    for i, part in enumerate(parts):
        ids += [part] if isinstance(part, int) else tokenizer.encode(part, add_special_tokens=special and i == 0)
    return ids


def infill_ids(req: InfillRequest, tokenizer, n_predict: int, context_window: int) -> list[int]:
    """llama-server's format_prompt_infill: [FIM_REP "myproject\\n"] each input_extra chunk after FIM_SEP and its
    filename (or a snippet line), [FIM_SEP "filename\\n"], then BOS?, FIM_PRE, the prefix's last 3/4 batch of tokens,
    the prompt's, FIM_SUF, the suffix's first tokens that fit the batch's last quarter, FIM_MID; of the extra context
    the last tokens the context leaves past a batch and twice n_predict (none in a context of 2048 or fewer)."""
    marks = tokenizer.fim_marks() if tokenizer is not None else None
    if marks is None:
        raise APIError(400, "/infill needs a code model whose vocabulary marks a prefix, a suffix and a middle "
                            "(<|fim_prefix|>, <fim_prefix>, <｜fim▁begin｜>, <PRE>, ...); this model's has no such "
                            "tokens: use /completion", "input_prefix")
    pre, suf, mid = marks
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)      # noqa: E731
    repo, sep = tokenizer.token_id_of(REPO_TOKENS), tokenizer.token_id_of(FILE_SEP_TOKENS)
    extra: list[int] = [repo, *encode("myproject\n")] if repo is not None else []
    for chunk in req.input_extra:
        if "text" not in chunk:
            raise APIError(400, 'each input_extra chunk is {"filename": ..., "text": ...}; one has no "text"',
                           "input_extra")
        extra += [sep, *encode(chunk.get("filename", "tmp") + "\n")] if sep is not None else encode(SNIPPET)
        extra += encode(chunk.get("text", ""))
    if sep is not None:
        extra += [sep, *encode("filename\n")]
    prefix, suffix = encode(req.input_prefix), encode(req.input_suffix)
    middle = _one_prompt(req.prompt, tokenizer, special=False)
    batch = min(N_BATCH, context_window)                 # llama.cpp's batch is never more than its context
    prefix = prefix[len(prefix) - min(len(prefix), 3 * (batch // 4)):]
    suffix = suffix[:max(0, batch // 4 - (2 + len(middle)))]
    n_extra = min(max(0, context_window - batch - 2 * n_predict), len(extra))
    bos = [tokenizer.bos_token_id] if tokenizer.adds_bos else []
    return [*extra[len(extra) - n_extra:], *bos, pre, *prefix, *middle, suf, *suffix, mid]


@dataclass
class LlamaReply:
    """One /completion call's reply: llama-server's partial results as a stream, its final result(s) at the end."""

    model: str
    prompts: list[list[int]]
    prompt_texts: list[str]
    n: int
    settings: dict[str, Any]
    token_text: Any                     # token id -> (text, bytes)
    stream: bool
    return_tokens: bool
    arrival: float = field(default_factory=time.monotonic)
    id_slot: int = -1
    fields: list[str] = field(default_factory=list)     # response_fields: only these of the final results
    timings_per_token: bool = False                      # timings on every partial result too
    choices: dict[int, dict[str, Any]] = field(default_factory=dict)
    include_usage = False               # reply_stream's protocol

    def add(self, delta: StreamDelta) -> list[dict]:
        """Record a delta; returns its stream events (a partial result, and the final one when it finishes)."""
        c = self.choices.setdefault(delta.index, {"text": [], "ids": [], "probs": [], "cached": 0, "first": None})
        now = time.monotonic()
        if delta.token_ids and c["first"] is None:
            c["first"] = now
        c["text"].append(delta.text)
        c["ids"] += delta.token_ids
        c["cached"] = delta.cached_tokens or c["cached"]
        probs = [self._prob(lp) for lp in delta.logprobs or ()]
        c["probs"] += probs
        c["end"], c["reason"], c["word"] = now, delta.finish_reason, delta.stop_string
        events: list[dict] = []
        if not self.stream:                 # collected: final() answers at the end
            return events
        if delta.text or delta.token_ids:
            partial = {"index": delta.index, "content": delta.text, "tokens": delta.token_ids, "stop": False,
                       "id_slot": self.id_slot, "tokens_predicted": len(c["ids"]),
                       "tokens_evaluated": len(self.prompts[delta.index // self.n])}
            if probs:
                partial["completion_probabilities"] = probs
            if self.timings_per_token:
                partial["timings"] = self._timings(delta.index)
            events.append(partial)
        if delta.finish_reason is not None:
            events.append(self._final(delta.index))
        return events

    def _timings(self, index: int) -> dict[str, float]:
        c = self.choices[index]
        return timings(self.arrival, c["first"], c["end"], len(self.prompts[index // self.n]), c["cached"],
                       len(c["ids"]))

    def _prob(self, lp: TokenLogprob) -> dict:
        def one(token_id: int, logprob: float) -> dict:
            raw = self.token_text(token_id)[1]       # its text: the whole UTF-8 characters of its bytes (llama.cpp's)
            return {"id": token_id, "token": raw.decode("utf-8", "ignore"), "bytes": list(raw), "logprob": logprob}
        return {**one(lp.token_id, lp.logprob), "top_logprobs": [one(t, v) for t, v in lp.top]}

    def _final(self, index: int) -> dict:
        c, prompt = self.choices[index], index // self.n
        text, n_prompt, n_out = "".join(c["text"]), len(self.prompts[prompt]), len(c["ids"])
        stop_type = ("word" if c["word"] is not None else "eos") if c["reason"] == "stop" else "limit"
        out = {"index": index, "content": "" if self.stream else text,
               "tokens": [] if self.stream or not self.return_tokens else c["ids"], "id_slot": self.id_slot,
               "stop": True,
               "model": self.model, "tokens_predicted": n_out, "tokens_evaluated": n_prompt,
               "generation_settings": self.settings, "prompt": self.prompt_texts[prompt], "has_new_line": "\n" in text,
               "truncated": False, "stop_type": stop_type, "stopping_word": c["word"] or "",
               "tokens_cached": c["cached"], "timings": self._timings(index)}
        if not self.stream and c["probs"]:
            out["completion_probabilities"] = c["probs"]
        return nested_values(out, self.fields) if self.fields else out

    def final(self) -> dict | list[dict]:
        """The non-streaming answer: one result, or an array (several prompts, or n_cmpl > 1), as llama-server's."""
        results = [self._final(i) for i in sorted(self.choices)]
        return results[0] if len(results) == 1 else results


def nested_values(result: dict, paths: list[str]) -> dict:
    """llama-server's response_fields: {path: value} for each "a/b" path the result has (others left out)."""
    out = {}
    for path in paths:
        value: Any = result
        for key in path.split("/"):
            if not (isinstance(value, dict) and key in value):
                break
            value = value[key]
        else:
            out[path] = value
    return out


async def events(reply: LlamaReply, first: StreamDelta, deltas: AsyncIterator[StreamDelta]) -> AsyncIterator[str]:
    """llama-server's stream: its results as `data:` events, an error as one, and no [DONE] after them."""
    delta: StreamDelta | None = first
    while delta is not None:
        if delta.finish_reason in FAILED:
            _, message, _, type_, code = FAILED[delta.finish_reason]
            yield event(error_body(message, type_, code=code))
            return
        for chunk in reply.add(delta):
            yield event(chunk)
        delta = await anext(deltas, None)


def install(app: FastAPI, state, auth: list[Depends]) -> None:
    """Add the routes; `state` is the server's _ServerState."""

    async def complete(body: LlamaCompletionRequest, request: Request, prompts: list[list[int]]):
        arrival = time.monotonic()
        engine = state.engine.engine
        for ids in prompts:
            engine.check_tokens(ids)
        params = sampling(body, max(map(len, prompts)), state.context_window, engine.tokenizer)
        # llama.cpp's end-of-generation tokens: EOS and FIM's ends stop a generation, or with ignore_eos are never taken
        fim_ends = engine.tokenizer.fim_end_ids if engine.tokenizer is not None else ()
        params = replace(params, logit_bias={**params.logit_bias,
                                             **dict.fromkeys((*engine.eos_token_ids, *fim_ends), -math.inf)}) \
            if body.ignore_eos else replace(params, stop_token_ids=(*params.stop_token_ids, *fim_ends))
        params = await state.compile_grammar(params)
        settings = {**body.model_dump(exclude={"prompt", "input_prefix", "input_suffix", "input_extra"}),
                    "n_predict": params.max_tokens, "n_ctx": state.context_window, "model": state.model_name}
        reply = LlamaReply(state.model_name, prompts, [state.decode(p) for p in prompts], params.n, settings,
                           state.token_text, body.stream, body.return_tokens, arrival, body.id_slot,
                           body.response_fields, body.timings_per_token)
        return await state.respond(request, reply, prompts, params, 0, body.stream, arrival, events=events,
                                   limits=limits_of(body, len(prompts) * params.n))

    documented = dict(dependencies=auth, response_model=LlamaCompletion | list[LlamaCompletion],
                      responses=rm.with_stream("llama-server's result (an array for several), or its stream"))

    @app.post("/completion", **documented)
    @app.post("/completions", include_in_schema=False, **documented)
    async def completion(body: LlamaCompletionRequest, request: Request):
        state.check_model(body.model)
        return await complete(body, request, prompt_ids(body.prompt, state.engine.engine.tokenizer))

    @app.post("/apply-template", dependencies=auth, response_model=AppliedTemplate)
    async def apply_template(body: ChatPrompt) -> dict:
        """The chat's prompt as /v1/chat/completions renders it (its sampling fields have no use here: refused)."""
        state.check_model(body.model)
        tool_req = tools.ToolRequest.parse(body.tools, body.tool_choice, body.parallel_tool_calls)
        text, _ = await asyncio.to_thread(tools.render_text, state.engine.engine, chat_messages(body.messages),
                                          tool_req, template_variables(body), **render_options(body))
        return {"prompt": text}

    @app.get("/props", dependencies=auth, response_model=Props)
    async def props() -> dict:
        """llama-server's /props: what its clients read before they send (n_ctx, the defaults, the template)."""
        front = state.engine.engine
        tok, path = front.tokenizer, front.artifact.path.resolve()
        template = tok.chat_template if tok is not None else None
        defaults = LlamaCompletionRequest().model_dump(exclude={"prompt", "model", "response_fields"})
        return {"default_generation_settings": {"params": defaults, "n_ctx": state.context_window},
                "total_slots": state.max_num_seqs, "model_alias": state.model_name, "model_path": str(path),
                "modalities": {"vision": False, "video": False, "audio": False},
                "chat_template": template if isinstance(template, str) else "",
                "bos_token": (tok.bos_token or "") if tok is not None else "",
                "eos_token": (tok.eos_token or "") if tok is not None else "",
                "build_info": f"kiln {__version__}", "endpoint_slots": False, "endpoint_props": False,
                "endpoint_metrics": True, "is_sleeping": False}

    @app.post("/infill", **documented)
    async def infill(body: InfillRequest, request: Request):
        state.check_model(body.model)
        ids = infill_ids(body, state.engine.engine.tokenizer, body.predict, state.context_window)
        return await complete(body, request, [ids])
