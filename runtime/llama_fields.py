"""llama-server's request fields beyond OpenAI's, as its clients send them both to its own /completion and /infill
(runtime/llama_cpp_api.py) and to its OpenAI routes (llama.cpp's web UI, llama.vim, llama.vscode, scripts written
against llama-server): one set of fields, read the same way on kiln's routes.

    samplers            the chain's order (names, or letters as "edkypmxt"): a sampler it leaves out is off, temperature
                        comes before the filters or after them, `infill` adds llama.cpp's infill sampler
    repeat_penalty      with repeat_last_n covering the context (-1, or the context or more): kiln's repetition penalty
                        counts every prompt and generated token; 0 turns it off, as llama.cpp's
    n_indent            a line after the first indented less ends the generation there (editor_limits)
    t_max_predict_ms    past this since the first token, a token with a newline ends it
    timings_per_token   llama-server's `timings` on every streamed chunk (timings())
    cache_prompt, n_keep, n_discard, n_cache_reuse, id_slot, t_max_prompt_ms
                        llama-server's cache and slot bookkeeping: kiln's prefix cache is automatic, an over-long prompt
                        is refused (never shifted), and llama-server reads t_max_prompt_ms without acting on it yet:
                        accepted, no output changes
    OFF's fields        samplers and behaviours kiln does not implement (Mirostat, DRY, XTC, typical-p, dynamic
                        temperature, ...): accepted at the value that leaves them off, a 400 naming the field otherwise;
                        the fields that only tune them are accepted
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator

from pydantic import BaseModel

from .protocol import InvalidRequestError, StreamDelta

# Fields that turn on a sampler or a behaviour kiln does not implement: accepted at the value that leaves it off.
OFF = {"typical_p": 1.0, "typ_p": 1.0, "dynatemp_range": 0.0, "mirostat": 0, "dry_multiplier": 0.0,
       "xtc_probability": 0.0, "min_keep": 0, "return_progress": False, "post_sampling_probs": False,
       "backend_sampling": False, "verbose": False, "grammar_lazy": False, "reasoning_budget_tokens": -1}

# llama.cpp's sampler names (common_sampler_types_from_names: canonical, kebab-case, without the underscore, and its
# aliases) and letters (common_sampler_types_from_chars)
SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature", "infill",
            "adaptive_p")
SAMPLER_NAMES = {**{n: n for n in SAMPLERS}, **{n.replace("_", "-"): n for n in SAMPLERS},
                 **{n.replace("_", ""): n for n in SAMPLERS}, "nucleus": "top_p", "temp": "temperature",
                 "typ": "typ_p"}
SAMPLER_CHARS = dict(zip("edskypmxtia", SAMPLERS))
FILTERS = ("top_k", "top_p", "min_p", "infill")   # the order kiln's sampler applies them in (llama.cpp's default)
INFILL_TOP_K = 1000     # the infill sampler compares every candidate's text with every other's: top_k bounds them


class LlamaServerFields(BaseModel):
    """The fields (their llama.cpp defaults); the routes' models inherit them."""

    cache_prompt: bool = True                     # kiln's prefix cache is always on: no output change
    n_keep: int = 0                               # context shifting: kiln refuses an over-long prompt instead
    n_discard: int = 0
    n_cache_reuse: int = 0
    id_slot: int = -1                             # llama-server's slot: kiln's prefix cache serves every request
    t_max_prompt_ms: int = -1                     # llama-server reads it and does nothing yet (its TODO): nor kiln
    n_indent: int = 0                             # a line after the first indented less: the generation ends there
    t_max_predict_ms: int = -1                    # past this since the first token, a newline ends it
    samplers: list[str] | str | None = None       # the chain's order (names, or letters as "kpt")
    timings_per_token: bool = False               # llama-server's timings on every streamed chunk
    repeat_last_n: int = 64                       # the repeat penalty's window (-1: the context; 0: no penalty)
    # set away from OFF's values: refused
    typical_p: float = 1.0
    typ_p: float = 1.0                            # what llama.cpp's web UI sends for typical_p
    dynatemp_range: float = 0.0
    mirostat: int = 0
    dry_multiplier: float = 0.0
    xtc_probability: float = 0.0
    min_keep: int = 0
    return_progress: bool = False
    post_sampling_probs: bool = False
    backend_sampling: bool = False
    verbose: bool = False
    grammar_lazy: bool = False
    reasoning_budget_tokens: int = -1
    # tune only samplers OFF leaves off: accepted
    dynatemp_exponent: float = 1.0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: list[str] | None = None
    xtc_threshold: float = 0.1
    top_n_sigma: float = -1.0                     # < 0: off (refused otherwise)


def sampling_overrides(req: LlamaServerFields, top_k: int, repeat_penalty: float,
                       context_window: int) -> dict[str, Any]:
    """What the request's llama-server fields change in its SamplingParams (chain()'s, and the repeat penalty turned
    off where repeat_last_n is 0); a 400 naming the field where they ask for what kiln does not do."""
    for name, off in OFF.items():
        if getattr(req, name) != off:
            raise InvalidRequestError(f"{name} {getattr(req, name)!r} asks for a llama.cpp sampler or behaviour kiln "
                                      f"does not implement; leave it out (or {off!r})", name)
    if req.top_n_sigma >= 0:
        raise InvalidRequestError("top_n_sigma (top-n-sigma sampling) is not implemented by kiln; leave it out",
                                  "top_n_sigma")
    over = chain(req.samplers, top_k, repeat_penalty)
    if req.repeat_last_n == 0:
        over["repetition_penalty"] = 1.0                          # llama.cpp: a window of no tokens penalizes none
    penalized = repeat_penalty != 1.0 and "repetition_penalty" not in over
    if penalized and -1 < req.repeat_last_n < context_window:      # -1: the context (older servers')
        raise InvalidRequestError(f"repeat_penalty with repeat_last_n {req.repeat_last_n}: kiln penalizes every "
                                  f"prompt and generated token; set repeat_last_n to the context ({context_window}) or "
                                  "more, or -1", "repeat_last_n")
    return over


def chain(samplers: list[str] | str | None, top_k: int, repeat_penalty: float) -> dict[str, Any]:
    """What a `samplers` chain changes in the SamplingParams: a sampler left out of it is off (top_k 0, top_p 1, min_p
    0, repeat_penalty 1; no temperature: the draw at temperature 1), llama.cpp's infill sampler on where named, and
    temperature before the filters or after them. Orders kiln's sampler cannot follow, unknown names and samplers kiln
    does not implement are a 400."""
    if samplers is None:
        return {}
    if isinstance(samplers, str):
        names = [SAMPLER_CHARS.get(c) for c in samplers]
        unknown = [c for c, n in zip(samplers, names) if n is None]
    else:
        names = [SAMPLER_NAMES.get(n.lower()) for n in samplers]
        unknown = [n for n, c in zip(samplers, names) if c is None]
    if unknown:
        raise InvalidRequestError(f"samplers: unknown sampler {unknown[0]!r}; llama.cpp's are {', '.join(SAMPLERS)} "
                                  f"(or their letters {''.join(SAMPLER_CHARS)})", "samplers")
    if len(set(names)) < len(names):
        raise InvalidRequestError("samplers: name each sampler once", "samplers")
    if "adaptive_p" in names:
        raise InvalidRequestError("samplers: adaptive_p is not implemented by kiln; leave it out", "samplers")
    order = [n for n in names if n in (*FILTERS, "temperature", "penalties")]
    filters = [n for n in order if n in FILTERS]
    if filters != [n for n in FILTERS if n in filters]:
        raise InvalidRequestError(f"samplers: kiln applies {', '.join(FILTERS)} in that order; got "
                                  f"{', '.join(filters)}", "samplers")
    rest = [n for n in order if n != "penalties"]
    if "temperature" in rest[1:-1]:
        raise InvalidRequestError("samplers: kiln applies temperature before the filters (top_k, top_p, min_p, "
                                  "infill) or after them, not between", "samplers")
    if "penalties" in order and repeat_penalty != 1.0 and order[0] != "penalties":
        raise InvalidRequestError("samplers: kiln applies the repeat penalty before every other sampler; put "
                                  "penalties first", "samplers")
    out: dict[str, Any] = {"temperature_last": rest[-1:] == ["temperature"], "infill": "infill" in names}
    out.update({k: v for k, v in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0), ("temperature", 1.0),
                                  ("repetition_penalty", 1.0)) if ("penalties" if k == "repetition_penalty" else k)
                not in names})
    if out["infill"] and not 0 < (top_k if "top_k" in names else 0) <= INFILL_TOP_K:
        raise InvalidRequestError(f"samplers: put top_k (1 to {INFILL_TOP_K}) before infill: it compares every "
                                  "candidate's text with every other's (llama.vim and llama.vscode send 40)",
                                  "samplers")
    return out


def timings(arrival: float, first: float | None, end: float, prompt_tokens: int, cached: int,
            predicted: int) -> dict[str, float]:
    """llama-server's timings of one generation: its prompt (the tokens the prefix cache did not hold) from arrival to
    the first token, its prediction from there on."""
    first = first or end
    prompt_ms, predicted_ms = (first - arrival) * 1e3, (end - first) * 1e3
    prompt_n = prompt_tokens - cached
    return {"cache_n": cached, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / max(1, prompt_n),
            "prompt_per_second": 1e3 * prompt_n / max(prompt_ms, 1e-9),
            "predicted_n": predicted, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / max(1, predicted - 1),
            "predicted_per_second": 1e3 * max(0, predicted - 1) / max(predicted_ms, 1e-9)}


def limits_of(req: LlamaServerFields, streams: int):
    """The deltas -> deltas wrapper the request's n_indent and t_max_predict_ms ask for (None when neither)."""
    if req.n_indent <= 0 and req.t_max_predict_ms <= 0:
        return None
    return lambda deltas: editor_limits(deltas, streams, req.n_indent, req.t_max_predict_ms)


@dataclass
class _Lines:
    """One choice's text as editor_limits reads it."""

    text: str = ""
    scan: int = 0                   # where the next newline is looked for
    line: int | None = None         # where the line being checked begins (None: none yet, or it passed)
    first: float | None = None      # when its first token came
    done: bool = False


def indent_cut(text: str, lines: _Lines, n_indent: int) -> int | None:
    """Where llama-server's n_indent ends ``text``: at the first character that is not a space or a tab on a line
    after the first newline, when fewer than n_indent come before it (a blank line too); None while every line so far
    is indented enough (a line of blanks alone not yet decided)."""
    while True:
        if lines.line is None:
            nl = text.find("\n", lines.scan)
            if nl < 0:
                lines.scan = len(text)
                return None
            lines.line = nl + 1
        i = lines.line
        while i < len(text) and text[i] in " \t":
            i += 1
        if i == len(text):
            return None
        if i - lines.line < n_indent:
            return i
        lines.scan, lines.line = i, None


async def editor_limits(deltas: AsyncIterator[StreamDelta], streams: int, n_indent: int, t_max_predict_ms: int,
                        clock=time.monotonic) -> AsyncIterator[StreamDelta]:
    """llama-server's limits for editors, on the deltas of ``streams`` choices: n_indent > 0 ends a choice where a line
    after the first is indented less (its text cut before the line's first character), t_max_predict_ms > 0 where a
    token with a newline comes that long after the first token; both as a length limit (stop_type "limit"). A choice
    ended here yields nothing more; when every one has ended the engine's request is aborted (the deltas closed)."""
    states: dict[int, _Lines] = {}
    ended = 0
    try:
        async for delta in deltas:
            st = states.setdefault(delta.index, _Lines())
            if st.done:
                continue
            now = clock()
            if st.first is None and delta.token_ids:
                st.first = now
            text = st.text + delta.text
            cut = indent_cut(text, st, n_indent) if n_indent > 0 else None
            if cut is not None:
                text = text[:cut]
                delta = replace(delta, text=text[len(st.text):], finish_reason="length", stop_string=None)
            elif (t_max_predict_ms > 0 and delta.finish_reason is None and "\n" in delta.text
                  and (now - st.first) * 1e3 > t_max_predict_ms):
                delta = replace(delta, finish_reason="length")
            st.text = text
            if delta.finish_reason is not None:
                st.done, ended = True, ended + 1
            yield delta
            if ended == streams:
                return
    finally:
        await deltas.aclose()
