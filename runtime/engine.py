"""Engine: the Python API over one artifact.

    engine = Engine("dist/smollm2-q0f32-cpu")
    out = engine.generate("Hello", SamplingParams(max_tokens=32, temperature=0))
    for delta in engine.generate_stream("Hello"): print(delta.text, end="")

There is one generation path: `_run` admits requests while KV pages allow,
prefills the admitted ones in one ragged batch, then decodes every running
request one token per step, and yields a StreamDelta per token. generate()
collects that stream; closing a stream early frees its sequences.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from .artifact import Artifact
from .model_runner import ModelRunner
from .protocol import GenerationOutput, InvalidRequestError, SamplingParams, StreamDelta
from .request import Request
from .sampler import Sampler
from .tokenizer import Tokenizer

Prompt = str | Sequence[int]


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int | None = None        # default: the artifact's max_batch_size
    max_total_tokens: int | None = None    # KV capacity; default: one full context + a page per sequence
    verify: bool = True                    # check artifact hashes on load


class Engine:
    def __init__(self, artifact: str | Path, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        self.artifact = Artifact.load(artifact, verify=self.config.verify)
        self.runner = ModelRunner(self.artifact, self.config.max_num_seqs, self.config.max_total_tokens)
        has_tok = (self.artifact.path / "tokenizer.json").is_file()
        self.tokenizer = Tokenizer.from_dir(self.artifact.path) if has_tok else None
        eos = set(self.artifact.config.get("eos_token_ids") or [])
        self.eos_token_ids = frozenset(eos | set(self.tokenizer.eos_token_ids if self.tokenizer else ()))
        self.sampler = Sampler()
        self._seq_ids = itertools.count()

    # -- public API ---------------------------------------------------------------------
    def generate(self, prompt: Prompt | list[Prompt], params: SamplingParams | None = None):
        """One GenerationOutput for a prompt (text or token ids), or a list of them for a list of prompts."""
        prompts, single = _as_batch(prompt)
        requests = self._requests(prompts, params)
        for _ in self._run(requests):
            pass
        outputs = [GenerationOutput(r.output_ids, r.text, r.finish_reason, r.prompt_ids) for r in requests]
        return outputs[0] if single else outputs

    def generate_stream(self, prompt: Prompt | list[Prompt], params: SamplingParams | None = None
                        ) -> Iterator[StreamDelta]:
        prompts, _ = _as_batch(prompt)
        yield from self._run(self._requests(prompts, params))

    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> GenerationOutput:
        return self.generate(self.render_chat(messages), params)

    def chat_stream(self, messages: list[dict], params: SamplingParams | None = None) -> Iterator[StreamDelta]:
        return self.generate_stream(self.render_chat(messages), params)

    def render_chat(self, messages: list[dict]) -> list[int]:
        tok = self._need_tokenizer()
        return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        return self._need_tokenizer().encode(text)

    # -- the generation loop ------------------------------------------------------------
    def _requests(self, prompts: list[Prompt], params: SamplingParams | None) -> list[Request]:
        params = params or SamplingParams()
        return [Request(i, next(self._seq_ids), self._prompt_ids(p), params, self.runner.context_window,
                        self.eos_token_ids, self.tokenizer) for i, p in enumerate(prompts)]

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        self.runner.check_tokens(ids)
        return ids

    def _run(self, requests: list[Request]) -> Iterator[StreamDelta]:
        waiting, running = deque(requests), []
        try:
            while waiting or running:
                admitted = self._admit(waiting, running)
                if admitted:
                    for r in admitted:
                        self.runner.add_sequence(r.seq_id)
                    running += admitted
                    logits = self.runner.prefill([r.seq_id for r in admitted], [r.prompt_ids for r in admitted])
                    batch = admitted
                else:
                    logits = self.runner.decode([r.seq_id for r in running], [r.output_ids[-1] for r in running])
                    batch = running
                tokens = self.sampler.sample(logits, self.sampler.prepare(batch))
                for r, t in zip(batch, tokens):
                    yield r.append(t)
                for r in [r for r in running if r.finished]:
                    self.runner.remove_sequence(r.seq_id)
                    running.remove(r)
        finally:
            for r in running:
                self.runner.remove_sequence(r.seq_id)

    def _admit(self, waiting: deque, running: list[Request]) -> list[Request]:
        """Take waiting requests while sequences and KV pages (for their whole length) are free."""
        page = self.runner.page_size
        pages = lambda r: -(-(len(r.prompt_ids) + r.params.max_tokens) // page)  # noqa: E731
        budget = self.runner.max_total_tokens // page - sum(pages(r) for r in running)
        admitted = []
        while waiting and len(running) + len(admitted) < self.runner.max_num_seqs and pages(waiting[0]) <= budget:
            budget -= pages(waiting[0])
            admitted.append(waiting.popleft())
        if waiting and not running and not admitted:
            r = waiting[0]
            raise InvalidRequestError(f"request {r.index} needs {pages(r) * page} KV tokens but the engine holds "
                                      f"{self.runner.max_total_tokens}; raise EngineConfig.max_total_tokens")
        return admitted

    def _need_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise InvalidRequestError(f"artifact {self.artifact.path} has no tokenizer; pass token ids instead "
                                      "of text, or compile from a model directory that has tokenizer.json")
        return self.tokenizer


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
