"""Engine: the Python API over one artifact, and the step that every front end runs.

    engine = Engine("dist/smollm2-q0f32-cpu")
    out = engine.generate("Hello", SamplingParams(max_tokens=32, temperature=0))
    for delta in engine.generate_stream("Hello"): print(delta.text, end="")

step() is the whole serving loop in five lines: the scheduler decides a batch
(continuous batching, chunked prefill, prefix reuse, preemption), the KV state
is brought in line with it, the runner computes logits, the sampler picks
tokens, and each request turns its token into a StreamDelta. generate() and
AsyncEngine (the server) both run this same step; the non-streaming reply is
the collected stream.

With overlap (on for GPUs) a step decides, and where the device picks the
tokens launches, the next step between taking its tokens and showing them, so
that detokenizing, stop strings and the callers' deltas run while the device
computes.

With speculative decoding on (EngineConfig.speculative_tokens or draft_model), a step of decodes
checks each request's draft, found by prompt lookup or made by a draft model, in the same forward
and takes every drafted token the model picks itself, then the model's next one; the KV cache gives
back the rest.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .artifact import Artifact
from .draft_model import DraftModel
from .engine_calls import Prompt, SynchronousCalls
from .engine_config import EngineConfig, kv_size
from .front import ModelFront
from .host_memory import Trimmer
from .kv_pages import PageAccountant
from .memory_budget import default_kv_tokens, sized_by_memory
from .model_runner import LaunchedTokens, ModelRunner
from .prefix_cache import PrefixCache
from .protocol import EngineStats, InvalidRequestError, SamplingParams, StreamDelta, TokenLogprob
from .request import Request
from .sampler import Sampler, device_params, plain_sampling
from .scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from .sequence import SeqStatus, Sequence
from .speculative import Speculator, speculation_most, speculation_problem


class EngineBusy(RuntimeError):
    """The engine cannot take this work now (no free KV pages); retry after a step."""


class Engine(SynchronousCalls, ModelFront):
    def __init__(self, artifact: str | Path, config: EngineConfig | None = None):
        self.config = config = config or EngineConfig()
        loaded = Artifact.load(artifact, verify=config.verify)
        most = speculation_most(config.speculative_tokens, config.draft_model)
        why = speculation_problem(most, config.prompt_lookup_min, config.prompt_lookup_max,
                                  loaded.config.prefill_chunk_size, loaded.config.kv_cache.rewind_problem())
        if why is not None:
            raise ValueError(why)
        kv_tokens, kv_share = kv_size(loaded, config)
        draft = _draft_model(loaded, config, kv_tokens, kv_share, most)       # first: see DraftModel
        self.runner = ModelRunner(loaded, config.max_num_seqs, kv_tokens, kv_share, step_graphs=config.step_graphs)
        super().__init__(loaded, config.chat_template)     # tokenizer, eos ids, grammar compiler
        budget = min(config.max_tokens_per_step or self.runner.prefill_chunk, self.runner.prefill_chunk)
        window = self.runner.window        # sliding-window KV is never shared: no prefix cache, no forks
        recurrent = bool(loaded.config.kv_cache.states)   # cached whole, continued by a rename (Scheduler)
        prefix_cache = config.enable_prefix_cache and (self.runner.shares_kv or recurrent)
        self.scheduler = Scheduler(
            SchedulerConfig(max_num_seqs=self.runner.max_num_seqs, max_tokens_per_step=budget,
                            policy=config.policy, enable_prefix_cache=prefix_cache, sliding_window=window,
                            state_slots=self.runner.max_num_seqs if recurrent else None,
                            min_checkpoint=config.min_checkpoint),
            PageAccountant(self.runner.free_pages(), self.runner.page_size,
                           window.max_pages(self.runner.page_size) if window else None),
            PrefixCache(whole=recurrent) if prefix_cache else None)
        self.sampler = Sampler()
        if config.device_sampling and not self.runner.samples_on_device:
            raise ValueError("this artifact was compiled before kiln could sample on the device (it lacks "
                             "sample_tokens); recompile it with `kiln compile`, or sample on the host "
                             "(EngineConfig.device_sampling=False, `kiln serve --sampling-on host`)")
        device_sampling = config.device_sampling
        if device_sampling is None:
            device_sampling = self.artifact.device != "cpu" and self.runner.samples_on_device
        self.samples_on_device = device_sampling     # plain sampled decode steps draw where the logits are
        self._requests: dict[int, Request] = {}      # seq id -> live request
        self._seq_ids = itertools.count()
        self._trimmer = Trimmer()                    # freed host memory back to the OS, every few seconds
        self.overlap = config.overlap if config.overlap is not None else self.artifact.device != "cpu"
        self._ahead: _Launched | ScheduledBatch | None = None   # the next step, decided early (overlap)
        self._ahead_drafts: dict[int, list[int]] | None = None   # its drafts by sequence, if not launched
        self._clock = _ForwardClock()
        self.speculator = Speculator(most, config.prompt_lookup_min, config.prompt_lookup_max, self.runner,
                                     self.scheduler.pages, draft)

    # -- the serving step -------------------------------------------------------------
    def step(self) -> list[tuple[Request, StreamDelta]]:
        """Advance every scheduled request by one forward pass; returns the deltas produced."""
        ahead, self._ahead = self._ahead, None
        if isinstance(ahead, _Launched):         # launched by the previous step (overlap)
            out = self._take(ahead)
        else:
            batch = self._schedule() if ahead is None else _live(ahead)
            if not batch.chunks:
                return []
            drafts = self._drafts(batch) if ahead is None else self._drafts_ahead(batch)
            if drafts and self.speculator.reserve(batch.chunks, drafts):
                out = self._speculative_step(batch, drafts)
            else:
                plan = self._device_plan(batch.chunks)
                out = self._sampled_step(batch) if plan is None else self._take(self._launch(batch, *plan))
        for r, _ in out:
            if r.finished:
                self._finish(r)
        if not self.scheduler.has_work:
            self._clock.idle()
        self._trimmer.maybe()
        return out

    def _schedule(self) -> ScheduledBatch:
        batch = self.scheduler.schedule()
        self._sync_kv(batch)
        return batch

    def _sampled_step(self, batch: ScheduledBatch) -> list[tuple[Request, StreamDelta]]:
        """The forward returns logits; the sampler picks each token (and scores prompts) on the host."""
        chunks = batch.chunks
        full = [c.all_logits for c in chunks]
        self._clock.launch(lookahead=False)
        logits = self.runner.run([c.seq.seq_id for c in chunks], [c.seq.token_ids(c.start, c.end) for c in chunks],
                                 full)
        self._clock.ready()
        logits, scored = logits if any(full) else (logits, {})
        self.scheduler.update(batch)
        for i, rows in scored.items():          # prompt logprobs (echo): every scored position
            self._requests[chunks[i].seq.seq_id].score_prompt(chunks[i].start, rows)
        rows = [i for i, c in enumerate(chunks) if c.needs_logits]
        scoring_only = [i for i in rows if self._requests[chunks[i].seq.seq_id].params.max_tokens == 0]
        rows = [i for i in rows if i not in scoring_only]
        requests = [self._requests[chunks[i].seq.seq_id] for i in rows]
        result = self.sampler.sample(logits[rows], self.sampler.prepare(requests))
        out = self._show(list(zip(requests, result.tokens, result.logprobs)))
        return out + [(r, r.finish_scored()) for r in (self._requests[chunks[i].seq.seq_id] for i in scoring_only)]

    def _device_plan(self, chunks) -> tuple[str, set[int]] | None:
        """How the device picks a step's tokens, so that only they are copied back: ("greedy" or
        "sampled", the sequences whose rows still go to the host Sampler: logprobs, penalties, bias,
        a grammar; only their logits are copied back). None, and the whole step's logits come back:
        prompt scoring, max_tokens=0, no row the device can pick, or sampling the device cannot do."""
        taking = [self._requests[c.seq.seq_id] for c in chunks if c.needs_logits]
        if any(c.all_logits for c in chunks) or any(r.params.max_tokens == 0 for r in taking):
            return None
        plain = [r for r in taking if plain_sampling(r)]
        if not plain:
            return None
        host = {r.seq_id for r in taking if not plain_sampling(r)}
        if self.runner.greedy_on_device and all(r.params.greedy for r in plain):
            return "greedy", host
        return ("sampled", host) if self.samples_on_device else None

    def _launch(self, batch: ScheduledBatch, picked: str, host: set[int], lookahead: bool = False) -> _Launched:
        """Queue the batch's forward with its tokens picked on the device ("greedy" or "sampled"); the
        rows of the `host` sequences go first, so their logits are the front of the device's."""
        batch.chunks.sort(key=lambda c: c.seq.seq_id not in host)          # stable: the rest keep their order
        chunks = batch.chunks
        rows = [i for i, c in enumerate(chunks) if c.needs_logits]        # the others are mid-prompt chunks
        requests = [self._requests[chunks[i].seq.seq_id] for i in rows]
        params = None
        if picked == "sampled":               # greedy rows for mid-prompt chunks and the host's rows
            params = np.zeros((len(chunks), 5), np.float32)
            params[rows[len(host):]] = device_params(requests[len(host):])
        self._clock.launch(lookahead)
        tokens = self.runner.launch_next_tokens([c.seq.seq_id for c in chunks],
                                                [c.seq.token_ids(c.start, c.end) for c in chunks], params,
                                                logits_rows=len(host))
        return _Launched(batch, rows, requests, tokens)

    def _take(self, launched: _Launched) -> list[tuple[Request, StreamDelta]]:
        """A launched forward's tokens to its requests (those not ended since it was launched); the
        host Sampler's rows (the first ones) drawn from their copied logits."""
        tokens = launched.tokens.wait().tolist()                           # ints, once for the batch
        self._clock.ready()
        self.scheduler.update(launched.batch)
        rows, requests = launched.rows, launched.requests
        logprobs: list[TokenLogprob | None] = [None] * len(rows)
        logits = launched.tokens.logits()                                  # [host rows, vocab]
        if len(logits):
            host = requests[:len(logits)]
            result = self.sampler.sample(logits, self.sampler.prepare(host))
            for j, (token, logprob) in enumerate(zip(result.tokens, result.logprobs)):
                tokens[rows[j]], logprobs[j] = int(token), logprob
        return self._show([(r, tokens[i], lp) for i, r, lp in zip(rows, requests, logprobs) if not r.finished])

    def _show(self, taking: list[tuple[Request, int, TokenLogprob | None]]) -> list[tuple[Request, StreamDelta]]:
        """Each request takes its token; with overlap on, the next step is decided (and launched where
        the device picks its tokens) before the tokens' text is made and shown."""
        for r, token, logprob in taking:
            r.take(token, logprob)
        if self.overlap:
            self._ahead = self._schedule_ahead([r for r, _, _ in taking])
        return [(r, r.show()) for r, _, _ in taking]

    def _schedule_ahead(self, taken: list[Request]) -> _Launched | ScheduledBatch | None:
        """The next step decided now, before this one's tokens are shown: requests that end with their
        token whatever its text (a stop token, max_tokens) give back their slot and pages first; a stop
        string found later drops that request's row. Launched if the device picks its tokens, else kept
        for the next step() to run."""
        for r in taken:
            reason = r.end_reason
            if reason is not None:
                self._end(r, reason)
        batch = self._schedule()
        if not batch.chunks:
            return None
        drafts = self._drafts(batch)
        self._ahead_drafts = None if drafts is None else {c.seq.seq_id: d for c, d in zip(batch.chunks, drafts)}
        plan = None if drafts else self._device_plan(batch.chunks)
        return batch if plan is None else self._launch(batch, *plan, lookahead=True)

    # -- speculative decoding (runtime/speculative.py) -------------------------------------
    def _drafts(self, batch: ScheduledBatch) -> list[list[int]] | None:
        return self.speculator.drafts(batch.chunks, [self._requests.get(c.seq.seq_id) for c in batch.chunks])

    def _drafts_ahead(self, batch: ScheduledBatch) -> list[list[int]] | None:
        """The drafts _schedule_ahead found for this batch (less the chunks of requests that ended since):
        nothing they were drawn from has changed, so they are not looked up again."""
        found = self._ahead_drafts
        return None if found is None else [found[c.seq.seq_id] for c in batch.chunks]

    def _speculative_step(self, batch: ScheduledBatch, drafts: list[list[int]]) -> list[tuple[Request, StreamDelta]]:
        """Each decode's token and its draft (their pages reserved) in one forward; each request takes
        what the Speculator keeps of its draft, and the scheduler counts what is in the cache now."""
        requests = [self._requests[c.seq.seq_id] for c in batch.chunks]
        self._clock.launch(lookahead=False)
        checked = self.speculator.check(batch.chunks, requests, drafts)
        self._clock.ready()
        batch.chunks, shown = self.speculator.take(batch.chunks, requests, drafts, checked)
        self.scheduler.update(batch)
        return shown

    def drain(self) -> None:
        """Wait for a forward launched ahead, still on the device (its tokens stay for the next step):
        before anything else begins a forward on the KV cache (Engine.embed does)."""
        if isinstance(self._ahead, _Launched):
            self._ahead.tokens.wait()

    def _sync_kv(self, batch: ScheduledBatch) -> None:
        """Bring TVM's KV state in line with the scheduler's decisions, in the order they were made."""
        for seq_id in [*batch.evict, *(s.seq_id for s in batch.preempted)]:
            self.runner.remove_sequence(seq_id)
        for parent, child, pos in batch.forks:
            self.runner.fork_sequence(parent, child, pos)
        for seq_id, new_id in batch.renames:
            self.runner.rename_sequence(seq_id, new_id)
        for seq_id in batch.new_seqs:
            self.runner.add_sequence(seq_id)

    def _finish(self, r: Request) -> None:
        self._end(r, r.finish_reason)

    def _end(self, r: Request, reason: str) -> None:
        self._requests.pop(r.seq_id, None)
        for seq_id in self.scheduler.finish(r.seq, reason):
            self.runner.remove_sequence(seq_id)

    # -- adding and aborting requests --------------------------------------------------
    def add_request(self, prompt: Prompt, params: SamplingParams | None = None, index: int = 0,
                    priority: int = 0) -> list[Request]:
        """Queue one prompt; returns its params.n output streams (forked from the prompt's KV)."""
        params = params or SamplingParams()
        ids = self._prompt_ids(prompt)
        for name, named in (("logit_bias", params.logit_bias), ("allowed_token_ids",
                                                                 params.allowed_token_ids or ())):
            bad = [t for t in named if not 0 <= t < self.runner.vocab_size]
            if bad:
                raise InvalidRequestError(f"{name} names token {bad[0]}, outside the vocabulary "
                                          f"[0, {self.runner.vocab_size})", name)
        if params.n > self.runner.max_num_seqs:
            raise InvalidRequestError(f"n ({params.n}) is more than the {self.runner.max_num_seqs} sequences this "
                                      "engine runs at once; lower n or raise max_num_seqs (kiln serve --max-num-seqs)",
                                      "n")
        requests = []
        for k in range(params.n):
            shared = k and (self.runner.shares_kv or self.scheduler.caches_states)
            fork = (requests[0].seq_id, len(ids) - 1) if shared else None
            seq = Sequence(seq_id=next(self._seq_ids), prompt_ids=list(ids), max_tokens=params.max_tokens,
                           priority=priority, fork_from=fork, cache_salt=params.cache_salt,
                           prompt_logits=params.prompt_logprobs is not None and not k)
            requests.append(Request(index + k, seq, params, self.runner.context_window, self.eos_token_ids,
                                    self.tokenizer, self._grammar(params), _rng_seed_offset=k))
        if not self.scheduler.fits(len(ids) + params.max_tokens):
            raise InvalidRequestError(f"the prompt ({len(ids)} tokens) plus max_tokens ({params.max_tokens}) needs "
                                      "more KV pages than the engine holds; raise EngineConfig.max_total_tokens",
                                      "max_tokens")
        for r in requests:           # validated all before queueing any
            self._requests[r.seq_id] = r
            self.scheduler.add(r.seq)
        return requests

    def abort(self, request: Request) -> None:
        """Stop a request wherever it is (waiting, prefilling, decoding) and free its pages."""
        if self._requests.pop(request.seq_id, None) is None:
            return
        request.abort()
        was_in_kv = request.seq.num_computed > 0 or request.seq.status is SeqStatus.RUNNING
        self.scheduler.abort(request.seq_id)
        if was_in_kv:
            self.runner.remove_sequence(request.seq_id)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def stats(self) -> EngineStats:
        """Running and waiting sequences, KV pages, prefix-cache hits, now, and the forwards' counters.
        Safe to call from another thread while step() runs (the server's /metrics does): see
        Scheduler.stats."""
        c = self._clock
        return replace(self.scheduler.stats(), forwards=c.forwards, lookahead_forwards=c.lookahead,
                       host_gap_seconds=c.gap_s, draft_tokens=self.speculator.drafted,
                       accepted_draft_tokens=self.speculator.accepted)

    # -- the synchronous API: generate, chat and their streams (runtime/engine_calls.py) -------
    def embed(self, inputs: list[Prompt]) -> list[tuple[np.ndarray, int]]:
        """(embedding, token count) per input: the final hidden state at the last token, L2-normalised
        (the pooling of decoder-only embedding models). Runs between steps, beside the batch: the
        KV pages it borrows are accounted like a sequence's and given back at once. Raises
        EngineBusy when the pages, or a sequence's place in the KV cache, are not free now (the caller
        retries after a step)."""
        ids = [self._prompt_ids(p) for p in inputs]
        for i, t in enumerate(ids):
            if not t:
                raise InvalidRequestError(f"input {i} is empty", "input")
            if len(t) > self.runner.context_window:
                raise InvalidRequestError(f"input {i} is {len(t)} tokens, more than the context window of "
                                          f"{self.runner.context_window}; shorten it", "input")
        out = []
        self.drain()
        for t in ids:
            pages, sid = self.scheduler.pages, next(self._seq_ids)
            if not pages.can_allocate(len(t)):
                raise EngineBusy("no free KV pages for an embedding now")
            if self.runner.full:
                raise EngineBusy(f"all {self.runner.max_num_seqs} sequences the KV cache holds are running now")
            pages.allocate(sid, len(t))
            self.runner.add_sequence(sid)
            try:
                h = self.runner.last_hidden(sid, t).astype(np.float64)
            finally:
                self.runner.remove_sequence(sid)
                pages.free(sid)
            out.append(((h / max(np.linalg.norm(h), 1e-12)).astype(np.float32), len(t)))
        return out

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        self.check_tokens(ids)
        return ids

    def _grammar(self, params: SamplingParams):
        rf = params.response_format
        if not rf or rf.get("type") == "text":
            return None
        return self.grammar_compiler().compile(rf)


@dataclass
class _Launched:
    """A forward queued on the device whose tokens the engine has not taken yet."""

    batch: ScheduledBatch
    rows: list[int]               # the chunks that take a token (the others are mid-prompt chunks)
    requests: list[Request]       # their requests, row for row
    tokens: LaunchedTokens


class _ForwardClock:
    """Counts forwards and the host's time between one's tokens coming back and the next's launch
    (EngineStats.host_gap_seconds): the time a device that runs forwards asynchronously sits idle."""

    def __init__(self) -> None:
        self.forwards = self.lookahead = 0
        self.gap_s = 0.0
        self._ready_at: float | None = None

    def launch(self, lookahead: bool) -> None:
        now = time.perf_counter()
        if self._ready_at is not None:
            self.gap_s += now - self._ready_at
            self._ready_at = None
        self.forwards += 1
        self.lookahead += lookahead

    def ready(self) -> None:
        self._ready_at = time.perf_counter()

    def idle(self) -> None:
        """No work left: the wait for the next request is not a gap."""
        self._ready_at = None


def _live(batch: ScheduledBatch) -> ScheduledBatch:
    """A batch decided a step early without the chunks of sequences that ended since."""
    batch.chunks = [c for c in batch.chunks if c.seq.status is SeqStatus.RUNNING]
    return batch


def _draft_model(served: Artifact, config: EngineConfig, kv_tokens: int | None, kv_share: float | None,
                 most: int) -> DraftModel | None:
    """The config's draft model, loaded before the served model, told the served model's KV capacity
    where it is known before that loads (given, or a CPU's default)."""
    if config.draft_model is None:
        return None
    seqs = config.max_num_seqs or served.config.max_batch_size
    if kv_tokens is None and not sized_by_memory(served.device, kv_share):
        kv_tokens = default_kv_tokens(served, seqs)
    return DraftModel(Artifact.load(config.draft_model, verify=config.verify), served, seqs, kv_tokens, most)
