"""The Engine's synchronous calls: generate() and chat() (and their streams) run Engine.step() until
their requests finish, here, in the caller's thread; AsyncEngine (the server) runs the same step on a
thread of its own."""

from __future__ import annotations

from typing import Iterator, Sequence as Seq

from . import reasoning
from .protocol import GenerationOutput, InvalidRequestError, SamplingParams, StreamDelta
from .request import Request

Prompt = str | Seq[int]


class SynchronousCalls:
    """Engine's generate, generate_stream, chat and chat_stream, over its add_request, step, abort and
    render_chat."""

    def generate(self, prompt: Prompt | list[Prompt], params: SamplingParams | None = None):
        """One GenerationOutput for a prompt (text or token ids), or a list of them for a list of prompts."""
        prompts, single = _as_batch(prompt)
        requests = self._add_all(prompts, params)
        for _ in self._stream(requests):
            pass
        # The first of a prompt's n copies scores it (index i * n); the others share its prompt logprobs.
        scored = {r.index: r.prompt_logprobs for r in requests if r.prompt_logprobs is not None}
        outputs = [GenerationOutput(r.output_ids, r.text, r.finish_reason, r.prompt_ids, r.logprobs,
                                    scored.get(r.index - r.index % r.params.n), cached_tokens=r.seq.cached_prompt)
                   for r in requests]
        return outputs[0] if single and len(outputs) == 1 else outputs

    def generate_stream(self, prompt: Prompt | list[Prompt], params: SamplingParams | None = None
                        ) -> Iterator[StreamDelta]:
        prompts, _ = _as_batch(prompt)
        yield from self._stream(self._add_all(prompts, params))

    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> GenerationOutput:
        """The reply to a conversation; a reasoning model's (the chat template writes <think> or Harmony's
        channels) with its `reasoning` and `content` apart, its `text` whole. With n > 1, a list of them."""
        ids = self.render_chat(messages)
        out = self.generate(ids, params)
        if (parsers := reasoning.parsers_for(self.tokenizer, ids)) is not None:
            for one in out if isinstance(out, list) else [out]:
                one.reasoning, one.content = reasoning.split(parsers(), one.text)
        return out

    def chat_stream(self, messages: list[dict], params: SamplingParams | None = None) -> Iterator[StreamDelta]:
        return self.generate_stream(self.render_chat(messages), params)

    def _add_all(self, prompts: list[Prompt], params: SamplingParams | None) -> list[Request]:
        n = (params or SamplingParams()).n
        requests: list[Request] = []
        try:
            for i, p in enumerate(prompts):
                requests += self.add_request(p, params, index=i * n)
        except Exception:
            for r in requests:
                self.abort(r)
            raise
        return requests

    def _stream(self, requests: list[Request]) -> Iterator[StreamDelta]:
        """Step until these requests finish, yielding their deltas; closing early aborts them."""
        mine = set(map(id, requests))
        try:
            while any(not r.finished for r in requests):
                for r, delta in self.step():
                    if id(r) in mine:
                        yield delta
        finally:
            for r in requests:
                if not r.finished:
                    self.abort(r)


def _as_batch(prompt) -> tuple[list[Prompt], bool]:
    """(prompts, single?) — a str or a flat list of ints is one prompt; a list of those is a batch."""
    if isinstance(prompt, str):
        return [prompt], True
    items = list(prompt)
    if not items:
        raise InvalidRequestError("the prompt is empty; pass some text or token ids", "prompt")
    if all(isinstance(x, int) or hasattr(x, "__index__") and not isinstance(x, (str, list)) for x in items):
        return [items], True
    return items, False
