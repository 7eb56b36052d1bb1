"""Speculative decoding: the Speculator an Engine's step calls (the drafts for a step of decodes,
their KV pages, the forward that checks them, what each request keeps) and its pieces (the prompt
lookup, a request's drafting state, speculative sampling).

A draft is, by default, the tokens that followed the latest earlier occurrence of a request's last
few tokens (prompt and reply): vLLM's "ngram" method, llama.cpp's lookup decoding. It costs no
second model and pays where a reply repeats its context: quoting, fixing or editing a text or code.
With a draft model (runtime/draft_model.py) a draft is that model's greedy tokens instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Sequence as Seq

import numpy as np

from .kv_pages import PageAccountant
from .protocol import SamplingParams, StreamDelta, TokenLogprob, merge_ready
from .sampler import probabilities, raw_logits, token_logprobs
from .sequence import Sequence

if TYPE_CHECKING:
    from .draft_model import DraftModel
    from .model_runner import ModelRunner
    from .request import Request
    from .scheduler import Chunk

# Speculative decoding drafts for steps of at most this many decodes: a step lasts as long as its
# slowest row, and larger batches already share each read of the weights among their rows, so drafts
# there mostly add compute (and a prompt lookup per request to the host's share of the step).
SPECULATE_UP_TO = 8
# Draft tokens a step when a draft model is given and EngineConfig.speculative_tokens is 0.
DRAFT_MODEL_TOKENS = 4


def speculation_most(speculative_tokens: int, draft_model) -> int:
    """Draft tokens a step: EngineConfig.speculative_tokens, whose 0 means DRAFT_MODEL_TOKENS where a
    draft model is given (and off without one)."""
    return speculative_tokens or (DRAFT_MODEL_TOKENS if draft_model is not None else 0)


def speculation_problem(most: int, shortest: int, longest: int, prefill_chunk: int, kv_problem: str | None = None
                        ) -> str | None:
    """Why these speculative decoding settings cannot run on an artifact with this prefill chunk (and KV
    cache: kv_problem, why it cannot give tokens back, KVCacheLayout.rewind_problem), or None. Asked before
    anything loads (a draft model included)."""
    if most < 0 or not 1 <= shortest <= longest:
        return (f"speculative decoding needs speculative_tokens >= 0 and 1 <= prompt_lookup_min <= "
                f"prompt_lookup_max (got {most}, {shortest}, {longest})")
    if most and most + 1 > prefill_chunk:
        return (f"speculative_tokens ({most}) + 1 is more than this artifact's prefill chunk "
                f"({prefill_chunk}) checks in one forward; lower it")
    if most and kv_problem:
        return f"speculative decoding is not available for this artifact ({kv_problem}); leave speculative_tokens at 0"
    return None


@dataclass
class Drafting:
    """One request's speculative decoding: how long its next draft may be, whether it pauses, and its
    tokens as an array (extended as they come, for the prompt lookup).

    A draft kept whole lets the next be two tokens longer (transformers' assisted-generation
    heuristic); one kept in part, one token longer than the part kept; one missed outright, one
    token. A one-token draft missed outright pauses drafting for 1, 2, 4 ... 64 tokens (doubling while
    the misses go on, back to 1 once a drafted token is kept), so text that does not repeat pays for
    a checking forward only now and then."""

    limit: int                   # the most tokens the next draft may have
    resume_at: int = 0           # no draft before the reply has this many tokens
    pause: int = 1               # the pause the next outright miss of a one-token draft sets
    _ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64), repr=False)
    _known: int = 0              # tokens of _ids filled

    def tokens(self, seq: Sequence) -> np.ndarray:
        """seq's prompt and output tokens; only those new since the last call are copied."""
        n = seq.num_tokens
        if n > len(self._ids):
            grown = np.empty(max(n, 2 * len(self._ids)), np.int64)
            grown[:self._known] = self._ids[:self._known]
            self._ids = grown
        if n > self._known:
            self._ids[self._known:n] = seq.token_ids(self._known, n)
            self._known = n
        return self._ids[:n]

    def after(self, drafted: int, kept: int, replied: int, most: int) -> None:
        """Update after a draft of `drafted` tokens of which `kept` were kept; the reply now has
        `replied` tokens; `most` is EngineConfig.speculative_tokens."""
        if kept == drafted:
            self.limit, self.pause = min(most, max(self.limit, drafted + 2)), 1
        elif kept:
            self.limit, self.pause = kept + 1, 1
        elif drafted > 1:
            self.limit = 1
        else:
            self.limit, self.resume_at, self.pause = 1, replied + self.pause, min(2 * self.pause, 64)


def prompt_lookup(tokens: Seq[int] | np.ndarray, k: int, shortest: int, longest: int) -> list[int]:
    """Up to k draft tokens: those that followed the latest earlier occurrence of the last n tokens,
    for the largest n from `longest` down to `shortest` that occurs; [] if none does. One pass over
    the tokens for the places the last token occurred, then at most `longest` over those places."""
    ids = np.asarray(tokens)
    if len(ids) < 2:
        return []
    ends = np.flatnonzero(ids[:-1] == ids[-1])              # where an earlier n-gram could end
    length = np.ones(len(ends), np.int64)                   # how far back each matches, up to longest
    alive = np.ones(len(ends), bool)
    for n in range(1, min(longest, len(ids) - 1)):
        alive &= ends >= n
        alive[alive] = ids[ends[alive] - n] == ids[-1 - n]
        length += alive
    if not len(ends) or length.max() < shortest:
        return []
    end = int(ends[np.flatnonzero(length == length.max())[-1]]) + 1
    return ids[end:end + k].tolist()


def greedy_take(picked: np.ndarray, draft: list[int]) -> list[int]:
    """The tokens a greedy request takes from a checked draft: the drafted tokens the model picked
    itself (picked [len(draft) + 1]: its token at the input and after each drafted one), then its
    token after them."""
    picked = picked.tolist()
    kept = 0
    while kept < len(draft) and picked[kept] == draft[kept]:
        kept += 1
    return [*draft[:kept], picked[kept]]


def speculative_sample(logits: np.ndarray, draft: list[int], params: SamplingParams,
                       rng: np.random.Generator) -> list[int]:
    """The tokens a sampled request takes from a checked draft (speculative sampling with a draft
    that proposes each token with certainty): drafted token i is kept with the probability the
    request's sampling gives it after the tokens before it; the first one not kept is replaced by a
    draw from that distribution without it; if all are kept, one more is drawn after them. Each token
    taken then has exactly the distribution sampling it alone would give. logits: [len(draft) + 1,
    vocab] at the input token and each drafted one."""
    def dist(i: int) -> np.ndarray:
        return probabilities(logits[i], params.temperature, params.top_k, params.top_p, params.min_p)
    for i, token in enumerate(draft):
        p = dist(i)
        if rng.random() < p[token]:
            continue
        p[token] = 0.0
        return [*draft[:i], _draw_from(p, rng)]
    return [*draft, _draw_from(dist(len(draft)), rng)]


def _draw_from(p: np.ndarray, rng: np.random.Generator) -> int:
    """One token from unnormalised probabilities p (float64 [vocab], some positive)."""
    cum = np.cumsum(p)
    token = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return token if token < len(p) and p[token] > 0 else int(np.flatnonzero(p[:token])[-1])


class Speculator:
    """An engine's speculative decoding: drafts for a step of decodes, their KV pages, the forward that
    checks them, and what each request keeps. `most` (EngineConfig.speculative_tokens) 0 is off."""

    def __init__(self, most: int, shortest: int, longest: int, runner: ModelRunner, pages: PageAccountant,
                 draft_model: DraftModel | None = None):
        """`most`, `shortest`, `longest` as speculation_problem accepts them (with a draft model, `most`
        already its default where the config said 0); draft_model: the model whose greedy tokens are
        the drafts (runtime/draft_model.py), instead of prompt lookup's."""
        self.most, self.shortest, self.longest = most, shortest, longest
        self.runner, self.pages = runner, pages
        self.draft_model = draft_model
        self.drafted = self.accepted = 0            # draft tokens checked, and kept

    def drafts(self, chunks: list[Chunk], requests: list[Request | None]) -> list[list[int]] | None:
        """Each chunk's draft ([] where none is found or its request pauses), or None where speculation
        does not apply: it takes steps of at most SPECULATE_UP_TO decodes only, of requests whose
        logits nothing changes (no penalties, bias or grammar), and at most as many rows in all as a
        forward returns (max_batch_size)."""
        if not self.most or len(chunks) > SPECULATE_UP_TO or not all(c.is_decode for c in chunks):
            return None
        if not all(r is not None and raw_logits(r) for r in requests):
            return None
        runner = self.runner
        rows = min(runner.max_batch_size, runner.prefill_chunk) - len(chunks)      # beyond one a chunk
        drafts, wanted = [], []
        for c, r in zip(chunks, requests):
            state = r.drafting = r.drafting or Drafting(self.most)
            most = 0
            if len(r.output_ids) >= state.resume_at:
                most = max(0, min(state.limit, r.remaining - 1, runner.context_window - c.end, rows))
            if self.draft_model is None:
                draft = prompt_lookup(state.tokens(c.seq), most, self.shortest, self.longest) if most else []
                rows -= len(draft)
                drafts.append(draft)
            else:
                rows -= most
                wanted.append(most)
        if self.draft_model is not None:
            drafts = self.draft_model.propose([c.seq for c in chunks], wanted)
        return drafts if any(drafts) else None

    def reserve(self, chunks: list[Chunk], drafts: list[list[int]]) -> bool:
        """The drafted tokens' KV pages, where free (a draft without them is dropped); False if none got any."""
        for c, draft in zip(chunks, drafts):
            if draft and not self.pages.try_append(c.seq.seq_id, len(draft)):
                draft.clear()
        return any(drafts)

    def check(self, chunks: list[Chunk], requests: list[Request], drafts: list[list[int]]) -> np.ndarray:
        """The forward: each decode's token and its draft appended; at every position the greedy token
        [positions] if every request is greedy without logprobs, else the logits [positions, vocab]."""
        return self.runner.check_drafts([c.seq.seq_id for c in chunks],
                                        [[*c.seq.token_ids(c.start, c.end), *d] for c, d in zip(chunks, drafts)],
                                        all(r.params.greedy and not r.params.needs_logprobs for r in requests))

    def take(self, chunks: list[Chunk], requests: list[Request], drafts: list[list[int]], checked: np.ndarray
             ) -> tuple[list[Chunk], list[tuple[Request, StreamDelta]]]:
        """Each request takes the drafted tokens the model picks itself, then the token it picks after
        them (greedy), or keeps drafted tokens by speculative sampling; it stops at a token that ends
        it. The KV cache and the page accounting give back what is not kept. Returns the chunks as
        computed now (for Scheduler.update) and the requests' deltas."""
        at, computed, shown = 0, [], []
        for c, r, draft in zip(chunks, requests, drafts):
            k, rows = len(draft), checked[at:at + len(draft) + 1]
            at += k + 1
            if r.params.greedy:
                taking = greedy_take(rows if rows.ndim == 1 else np.argmax(rows, axis=1), draft)
            else:
                taking = speculative_sample(rows, draft, r.params, r.rng)
            logprobs = _logprobs(rows, taking, r)
            deltas = []
            for token, logprob in zip(taking, logprobs):
                deltas.append(r.append(token, logprob))
                if r.finished:
                    break
            unused = k + 1 - len(deltas)        # the cache holds the input and the draft; the newest token waits
            self.runner.pop_tokens(c.seq.seq_id, unused)
            self.pages.pop(c.seq.seq_id, unused)
            computed.append(replace(c, end=c.start + len(deltas)))
            if k:
                kept = len(taking) - 1
                self.drafted += k
                self.accepted += kept
                r.drafting.after(k, kept, len(r.output_ids), self.most)
            shown += [(r, d) for d in merge_ready(deltas)]
        return computed, shown


def _logprobs(rows: np.ndarray, taking: list[int], r: Request) -> list[TokenLogprob | None]:
    """The logprobs of each token taken, from the logits it was picked from, where the request asks."""
    if not r.params.needs_logprobs:
        return [None] * len(taking)
    n = len(taking)
    return token_logprobs(np.asarray(rows[:n], np.float32), np.asarray(taking), np.full(n, r.params.top_logprobs))
