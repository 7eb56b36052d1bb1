"""Beam search as vLLM's OpenAI server runs it (`use_beam_search`, `length_penalty`): over the engine, a step at a time.

Each step asks the engine for one token of every live beam (its prompt and tokens so far: the prefix cache holds
all but their last page), with the 2 x width most likely next tokens' logprobs; every beam's candidates are scored,
those ending in EOS are set aside as finished, and the best `width` of the rest go on. After max_tokens steps (or
when none is left) the finished and live beams are ranked together and the best `width` returned, each as one
delta. The score is vLLM's: the cumulative logprob over (prompt + generated tokens, an ending EOS not counted) **
length_penalty. The sampled token (temperature > 0) joins the candidates too, as in vLLM; greedy, the search is
deterministic."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import AsyncIterator, Callable

from .protocol import SamplingParams, StreamDelta
from .request import check_fits


class StepFailed(Exception):
    """A step's request ended without a token (the engine failed, or the server is shutting down)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Beam:
    tokens: tuple[int, ...]          # generated so far (an ending EOS included)
    logprob: float                   # their cumulative logprob
    ended: bool = False              # its last token is an EOS

    def score(self, prompt_len: int, length_penalty: float) -> float:
        return self.logprob / (prompt_len + len(self.tokens) - self.ended) ** length_penalty


async def beam_search(generate: Callable[[list[int], SamplingParams], AsyncIterator[StreamDelta]], prompt: list[int],
                      params: SamplingParams, eos_ids: frozenset[int], context_window: int,
                      length_penalty: float) -> list[Beam]:
    """The best params.n beams of ``prompt``, best first (``generate``: the engine's stream of one request)."""
    width = params.n
    check_fits(len(prompt), params.max_tokens, context_window)
    step = replace(params, max_tokens=1, n=1, logprobs=True, top_logprobs=2 * width, ignore_eos=True, stop=())

    async def next_token(beam: Beam):
        async for delta in generate([*prompt, *beam.tokens], step):
            if delta.logprobs:
                return delta.logprobs[0]
            if delta.finish_reason is not None:
                raise StepFailed(delta.finish_reason)
        raise StepFailed("error")

    def rank(beams: list[Beam]) -> list[Beam]:
        return sorted(beams, key=lambda b: b.score(len(prompt), length_penalty), reverse=True)[:width]

    live, ended = [Beam((), 0.0)], []
    for _ in range(params.max_tokens):
        options = await asyncio.gather(*(next_token(b) for b in live))
        grown = []
        for beam, lp in zip(live, options):
            for token, logprob in {**dict(lp.top), lp.token_id: lp.logprob}.items():
                child = Beam((*beam.tokens, token), beam.logprob + logprob,
                             token in eos_ids and not params.ignore_eos)
                (ended if child.ended else grown).append(child)
        live = rank(grown)
        if not live:
            break
    return rank(ended + live)


async def beam_deltas(generate, prompts: list[list[int]], params: SamplingParams, eos_ids: frozenset[int],
                      context_window: int, length_penalty: float,
                      decode: Callable[[list[int]], str]) -> AsyncIterator[StreamDelta]:
    """Every prompt's best beams as finished deltas (prompt i's k-th best at index i * n + k); an ending EOS is left
    out of the text unless include_stop_str_in_output (vLLM's)."""
    try:
        searches = await asyncio.gather(*(beam_search(generate, p, params, eos_ids, context_window, length_penalty)
                                          for p in prompts))
    except StepFailed as e:                   # the reply answers it as a failed request (http_errors.FAILED)
        yield StreamDelta(0, "", [], e.reason)
        return
    for i, beams in enumerate(searches):
        for k, beam in enumerate(beams):
            shown = beam.tokens[:-1] if beam.ended and not params.include_stop_str_in_output else beam.tokens
            yield StreamDelta(i * params.n + k, decode(list(shown)), list(beam.tokens),
                              "stop" if beam.ended else "length")
