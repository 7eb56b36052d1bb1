"""Sampler: host-side prepare(requests), then sample(logits) for the whole batch.

prepare() gathers every request's parameters into arrays once per step;
sample() turns logits [batch, vocab] into one token per row, in vLLM's order:

    logit_bias -> grammar mask (disallowed = -inf) -> repetition_penalty (HF rule,
    prompt + output tokens) -> frequency / presence penalties (OpenAI rule, output
    tokens) -> greedy rows: argmax | other rows: temperature -> top_k -> top_p
    -> min_p -> one uniform draw from the request's own np.random.Generator

(A request with temperature_last: top_k -> top_p -> min_p on the untempered
distribution, then temperature on the tokens kept: llama.cpp's chain. One with
infill: llama.cpp's infill sampler after the filters, before a late temperature:
infill_candidates.)

Every filter becomes a per-row logit threshold (keep x >= thr; ties at the
threshold are kept), so a row's token depends only on its own logits,
parameters and generator: never on which requests share the batch. A seeded
request draws the same tokens every time.

Logprobs are log_softmax of the *processed* logits: after bias, grammar mask
and penalties, before temperature and the top-k/top-p/min-p filters. They are
the model's distribution under the request's constraints, independent of how
it was sampled (vLLM returns the raw model logprobs by default; with no
bias/mask/penalty the two agree). Masked-out alternatives (-inf) are left out
of ``top``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np

from .grammar import GrammarState, bitmask_width, unpack_bitmask
from .protocol import TokenLogprob

if TYPE_CHECKING:
    from .request import Request

_BLOCK = 256         # inverse-CDF search: block sums first, then one block's cumsum (no [batch, vocab] cumsum)
_CANDIDATES = 1024   # top-k / top-p sort only this many of the largest logits when they hold the nucleus


@dataclass(frozen=True)
class SparseRows:
    """Per-row token ids with a value each: logit_bias, seen tokens, output-token counts."""

    rows: np.ndarray      # [n] int64, row of the batch
    ids: np.ndarray       # [n] int64, token id
    values: np.ndarray    # [n] float32

    @staticmethod
    def build(entries: Iterable[tuple[int, np.ndarray, np.ndarray]]) -> SparseRows:
        """From (row, ids, values) per request."""
        entries = list(entries)
        if not entries:
            return SparseRows(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
        rows = np.concatenate([np.full(len(ids), row, np.int64) for row, ids, _ in entries])
        ids = np.concatenate([np.asarray(ids, np.int64) for _, ids, _ in entries])
        values = np.concatenate([np.asarray(v, np.float32) for _, _, v in entries])
        return SparseRows(rows, ids, values)

    def within(self, vocab_size: int) -> SparseRows:
        """Only the entries whose id is a row index of the logits (bias ids are not range-checked upstream)."""
        ok = (self.ids >= 0) & (self.ids < vocab_size)
        return self if ok.all() else SparseRows(self.rows[ok], self.ids[ok], self.values[ok])


@dataclass(frozen=True)
class InfillRow:
    """A row drawn with llama.cpp's infill sampler: its end-of-generation ids, the token that ends it when no text
    is likely enough, and each token's text bytes (a special token's: none)."""

    row: int
    eog: frozenset[int]
    end: int | None
    token_bytes: Callable[[int], bytes]


@dataclass(frozen=True)
class SamplingBatch:
    """Everything sample() needs, as arrays over the batch's rows."""

    temperature: np.ndarray          # [batch] float32, 0 = greedy (also for top_k == 1)
    top_k: np.ndarray                # [batch] int64, 0 = off
    top_p: np.ndarray                # [batch] float32, 1 = off
    min_p: np.ndarray                # [batch] float32, 0 = off
    repetition_penalty: np.ndarray   # [batch] float32, 1 = off
    frequency_penalty: np.ndarray    # [batch] float32
    presence_penalty: np.ndarray     # [batch] float32
    logit_bias: SparseRows           # values: bias added to the logit
    seen: SparseRows                 # prompt + output ids of rows with repetition_penalty != 1 (may repeat)
    counts: SparseRows               # output-token counts of rows with a frequency/presence penalty
    grammar_rows: np.ndarray         # [g] int64, rows that have a grammar
    grammar_bitmask: np.ndarray      # [g, ceil(vocab / 32)] int32, packed allowed tokens
    num_logprobs: np.ndarray         # [batch] int64, -1 = no logprobs, else how many top alternatives
    rngs: list[np.random.Generator]
    allowed: tuple[tuple[int, np.ndarray], ...] = ()   # (row, the only ids it may take: allowed_token_ids)
    temperature_last: np.ndarray | None = None          # [batch] bool: filters before temperature (llama.cpp's)
    infill: tuple[InfillRow, ...] = ()                   # rows with llama.cpp's infill sampler


@dataclass
class SampleResult:
    """One token per row, and its logprobs where the request asked (else None)."""

    tokens: list[int]
    logprobs: list[TokenLogprob | None]


class Sampler:
    """Stateless: prepare() reads the requests, sample() reads only the logits and the batch."""

    def prepare(self, requests: Sequence[Request]) -> SamplingBatch:
        """Gather parameters, penalty token sets and grammar masks of ``requests`` (one per logits row)."""
        ps = [r.params for r in requests]

        def column(values: Iterable[float], dtype=np.float32) -> np.ndarray:
            return np.fromiter(values, dtype, count=len(ps))

        grammar_rows = [i for i, r in enumerate(requests) if _grammar(r) is not None]
        return SamplingBatch(
            temperature=column(0.0 if p.greedy else p.temperature for p in ps),
            top_k=column((p.top_k for p in ps), np.int64),
            top_p=column(p.top_p for p in ps),
            min_p=column(p.min_p for p in ps),
            repetition_penalty=column(p.repetition_penalty for p in ps),
            frequency_penalty=column(p.frequency_penalty for p in ps),
            presence_penalty=column(p.presence_penalty for p in ps),
            logit_bias=SparseRows.build((i, list(b), list(b.values())) for i, b in enumerate(map(_bias, requests))
                                        if b),
            seen=SparseRows.build(_seen_tokens(i, r) for i, r in enumerate(requests)
                                  if r.params.repetition_penalty != 1.0),
            counts=SparseRows.build((i, *np.unique(np.asarray(r.output_ids, np.int64), return_counts=True))
                                    for i, r in enumerate(requests)
                                    if (r.params.frequency_penalty or r.params.presence_penalty) and r.output_ids),
            allowed=tuple((i, np.asarray(p.allowed_token_ids, np.int64)) for i, p in enumerate(ps)
                          if p.allowed_token_ids is not None),
            grammar_rows=np.asarray(grammar_rows, np.int64),
            grammar_bitmask=_grammar_bitmask([_grammar(requests[i]) for i in grammar_rows]),
            num_logprobs=column((p.top_logprobs if p.needs_logprobs else -1 for p in ps), np.int64),
            rngs=[r.rng for r in requests],
            temperature_last=column((p.temperature_last for p in ps), bool)
            if any(p.temperature_last for p in ps) else None,
            infill=tuple(_infill_row(i, r) for i, r in enumerate(requests) if r.params.infill))

    def sample(self, logits: np.ndarray, batch: SamplingBatch) -> SampleResult:
        """logits: [batch, vocab] float32 -> one token (and its logprobs, if asked) per row."""
        x = np.array(logits, dtype=np.float32)             # [batch, vocab], processed in place
        if x.ndim != 2 or x.shape[0] != len(batch.rngs):
            raise ValueError(f"logits must be [{len(batch.rngs)}, vocab], got {list(x.shape)}")
        process_logits(x, batch)
        tokens = np.argmax(x, axis=1)                      # greedy rows keep these
        lp_rows = np.flatnonzero(batch.num_logprobs >= 0)
        lp_x = x[lp_rows]                                  # [r, vocab] kept before temperature touches x
        rows = np.flatnonzero(batch.temperature > 0)
        if batch.infill:
            for f in batch.infill:
                late = batch.temperature_last is not None and bool(batch.temperature_last[f.row])
                if batch.temperature[f.row] > 0 or late:       # greedy, tempered first: the argmax (one candidate)
                    tokens[f.row] = _infill_token(x[f.row], float(batch.temperature[f.row]), late, batch.top_k[f.row],
                                                  batch.top_p[f.row], batch.min_p[f.row], batch.rngs[f.row], f)
            rows = np.setdiff1d(rows, [f.row for f in batch.infill])
        if rows.size:
            scaled = _take(x, rows)                        # in place when every row samples (no copy)
            late = None if batch.temperature_last is None else batch.temperature_last[rows]
            first = batch.temperature[rows] if late is None else np.where(late, 1, batch.temperature[rows])
            scaled /= first[:, None]
            tokens[rows] = _draw(scaled, batch.top_k[rows], batch.top_p[rows], batch.min_p[rows],
                                 [batch.rngs[i] for i in rows],
                                 None if late is None else np.where(late, batch.temperature[rows], 1))
        logprobs: list[TokenLogprob | None] = [None] * len(tokens)
        for i, lp in zip(lp_rows, token_logprobs(lp_x, tokens[lp_rows], batch.num_logprobs[lp_rows])):
            logprobs[i] = lp
        return SampleResult([int(t) for t in tokens], logprobs)


def plain_sampling(request: Request) -> bool:
    """Whether sample() draws the request's token from its raw logits with temperature, top-k, top-p
    and min-p alone: nothing that changes the logits (bias, penalties, a grammar) and no logprobs.
    Such rows can have their token drawn where the logits are (ModelRunner.next_tokens)."""
    return raw_logits(request) and not request.params.needs_logprobs


def raw_logits(request: Request) -> bool:
    """Whether nothing changes the request's logits before sampling: no logit_bias, no penalties, no
    grammar (its logprobs, if asked, are then those of the raw logits)."""
    p = request.params
    # Any grammar, even one waiting for a reasoning model's answer: with overlap, the next step's rows are
    # planned before this token's text shows whether the answer has begun.
    return (not p.logit_bias and p.repetition_penalty == 1.0 and not p.frequency_penalty
            and not p.presence_penalty and getattr(request, "grammar", None) is None
            and not getattr(request, "masked_next", ()) and p.allowed_token_ids is None
            and not p.bad_words                     # a drafted run of tokens could complete one unmasked
            and not p.temperature_last              # the device sampler and speculation temper first
            and not p.infill)


def infill_candidates(x: np.ndarray, weights: np.ndarray, eog: frozenset[int], end: int | None,
                      token_bytes: Callable[[int], bytes]) -> tuple[np.ndarray, int | None]:
    """llama.cpp's infill sampler (llama_sampler_infill_apply) over a row's candidates (weights > 0, the filters'):
    the ids left to draw from by their logits, or the one token it forces.

    With p the candidates' probabilities: where 3 * p(end of generation) * candidates > p(text), only the
    end-of-generation tokens are left. Otherwise a token whose bytes begin another's merges into the likelier of the
    two (its probability added, the other gone); text tokens under 0.2 are dropped (none left: ``end`` is forced),
    the rest renormalized, and text tokens under 1 / (texts left + 1) dropped. End-of-generation tokens stay."""
    cand = np.flatnonzero(weights > 0)
    cand = cand[np.lexsort((cand, -x[cand]))]                  # llama.cpp's order: likeliest first
    p = weights[cand].astype(np.float64)
    p /= p.sum()
    is_eog = np.fromiter((int(t) in eog for t in cand), bool, count=cand.size)
    if 3 * p[is_eog].sum() * cand.size > p[~is_eog].sum():
        return np.sort(cand[is_eog]), None
    texts = [token_bytes(int(t)) for t in cand]
    alive = np.ones(cand.size, bool)
    for i0, a in enumerate(texts):
        if not a:
            continue
        for i1, b in enumerate(texts):
            if not alive[i0]:
                break
            if i0 != i1 and alive[i1] and len(a) <= len(b) and b.startswith(a):
                dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
                p[dst] += p[src]
                p[src], alive[src] = 0.0, False
    keep = alive & ((p >= 0.2) | is_eog)
    n_text = np.count_nonzero(keep & ~is_eog)
    if n_text == 0:
        return np.zeros(0, np.int64), end if end is not None else (min(eog) if eog else int(cand[0]))
    q = np.where(keep, p, 0.0)
    q /= q.sum()
    keep &= (q >= 1.0 / (n_text + 1)) | is_eog
    return np.sort(cand[keep]), None


def _infill_token(x: np.ndarray, temperature: float, late: bool, top_k: int, top_p: float, min_p: float,
                  rng: np.random.Generator, f: InfillRow) -> int:
    """One row's token through the filters, the infill sampler, then the draw by the logits left (tempered after
    when ``late``; greedy: the likeliest left). One uniform draw, as a sampled row takes."""
    if not late:
        x = x / np.float32(temperature)
    weights = _filtered_weights(x[None], np.array([top_k]), np.array([top_p], np.float32),
                                np.array([min_p], np.float32))[0]
    kept, forced = infill_candidates(x, weights, f.eog, f.end, f.token_bytes)
    u = rng.random() if temperature > 0 else 0.0
    if forced is not None:
        return forced
    z = x[kept].astype(np.float64)
    if temperature == 0:
        return int(kept[np.argmax(z)])
    w = np.exp((z - z.max()) / (temperature if late else 1.0))
    cum = np.cumsum(w)
    return int(kept[min(int(np.searchsorted(cum, u * cum[-1], side="right")), kept.size - 1)])


def _infill_row(row: int, request: Request) -> InfillRow:
    eog = frozenset(request.eos_token_ids) | frozenset(request.params.stop_token_ids)
    tokenizer = request.tokenizer
    return InfillRow(row, eog, getattr(tokenizer, "eos_token_id", None), tokenizer.token_bytes)


def _bias(request) -> dict[int, float]:
    """A request's logit_bias, with -inf on the ids it may not take next (min_tokens' stop ids, bad words)."""
    masked = getattr(request, "masked_next", frozenset())
    bias = request.params.logit_bias
    return {**bias, **dict.fromkeys(masked, -np.inf)} if masked else bias


def _grammar(request) -> GrammarState | None:
    """The grammar constraining a request's next token (Request.active_grammar: none while it reasons)."""
    return getattr(request, "active_grammar", getattr(request, "grammar", None))


_BELOW_ONE = np.nextafter(np.float32(1), np.float32(0))


def device_params(requests: Sequence[Request]) -> np.ndarray:
    """The rows sample_tokens takes (models/sampling.py): (temperature, top_k, top_p, min_p, u) per
    request, float32 [batch, 5]. Greedy rows get temperature 0; a sampled row takes the one draw
    from its generator that sample() would take, so a seeded request draws the same stream of
    uniforms on either path."""
    out = np.zeros((len(requests), 5), np.float32)
    for row, r in zip(out, requests):
        p = r.params
        if not p.greedy:
            u = min(np.float32(r.rng.random()), _BELOW_ONE)        # float32 rounding must not reach 1
            row[:] = (p.temperature, min(p.top_k, 1 << 24), p.top_p, p.min_p, u)
    return out


def process_logits(x: np.ndarray, batch: SamplingBatch) -> None:
    """Bias, grammar mask and penalties, in place on x [batch, vocab] (the logits logprobs are taken from)."""
    vocab = x.shape[1]
    bias = batch.logit_bias.within(vocab)
    x[bias.rows, bias.ids] += bias.values
    for row, ids in batch.allowed:                                         # allowed_token_ids: the rest -inf
        ids = ids[ids < vocab]
        kept = x[row, ids]
        x[row] = -np.inf
        x[row, ids] = kept
    if batch.grammar_rows.size:
        allowed = unpack_bitmask(batch.grammar_bitmask, vocab)            # [g, vocab] bool
        x[batch.grammar_rows] = np.where(allowed, x[batch.grammar_rows], -np.inf)
    seen = batch.seen.within(vocab)
    if seen.rows.size:
        # HF rule; ids may repeat, which is harmless: every copy writes the same value
        v, p = x[seen.rows, seen.ids], batch.repetition_penalty[seen.rows]
        x[seen.rows, seen.ids] = np.where(v > 0, v / p, v * p)
    counts = batch.counts.within(vocab)
    if counts.rows.size:
        # OpenAI rule: logit -= frequency * count + presence * (count > 0); ids are unique per row
        x[counts.rows, counts.ids] -= (batch.frequency_penalty[counts.rows] * counts.values
                                       + batch.presence_penalty[counts.rows] * (counts.values > 0))


def probabilities(logits_row: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0,
                  min_p: float = 0.0, temperature_last: bool = False) -> np.ndarray:
    """The exact distribution sample() draws a row from (after bias, mask and penalties), float64 [vocab].

    Greedy settings (temperature 0 or top_k 1) give a one-hot argmax.
    """
    row = np.asarray(logits_row, np.float32)
    if temperature == 0 or top_k == 1:
        return np.eye(row.size, dtype=np.float64)[int(np.argmax(row))]
    late = np.array([temperature], np.float32) if temperature_last else None
    x = (row if temperature_last else row / np.float32(temperature))[None]  # [1, vocab]
    p = _weights(x, np.array([top_k]), np.array([top_p], np.float32), np.array([min_p], np.float32), late)
    return p[0].astype(np.float64) / p[0].sum(dtype=np.float64)


# ---- sampling rows -------------------------------------------------------------------

def _draw(x: np.ndarray, top_k: np.ndarray, top_p: np.ndarray, min_p: np.ndarray,
          rngs: list[np.random.Generator], late: np.ndarray | None = None) -> np.ndarray:
    """x: [rows, vocab] temperature-scaled logits (``late``: the temperatures rows apply after the filters, 1 where
    x is scaled already) -> one token per row, one uniform draw each."""
    weights = _weights(x, top_k, top_p, min_p, late)                          # [rows, vocab] unnormalized
    u = np.fromiter((g.random() for g in rngs), np.float64, count=len(rngs))   # [rows] in [0, 1)
    block_cum = _block_cumsum(weights)
    tokens = _cross_index(weights, block_cum, u * block_cum[:, -1], inclusive=True)
    for r, t in enumerate(tokens):          # float rounding can land on a zero-weight token: step back
        if t >= weights.shape[1] or weights[r, t] == 0:
            tokens[r] = np.flatnonzero(weights[r, :t])[-1]
    return tokens


def _weights(x: np.ndarray, top_k: np.ndarray, top_p: np.ndarray, min_p: np.ndarray,
             late: np.ndarray | None) -> np.ndarray:
    """_filtered_weights, then for the rows with a ``late`` temperature other than 1 the kept tokens' weights
    exp((x - max) / T): the filters chose on the untempered distribution, the draw is from the tempered one."""
    weights = _filtered_weights(x, top_k, top_p, min_p)
    rows = np.array([], np.int64) if late is None else np.flatnonzero(late != 1)
    if rows.size:
        sub = x[rows]
        tempered = np.exp((sub - sub.max(axis=1, keepdims=True)) / late[rows, None])
        weights[rows] = np.where(weights[rows] > 0, tempered, 0).astype(weights.dtype)
    return weights


def _filtered_weights(x: np.ndarray, top_k: np.ndarray, top_p: np.ndarray, min_p: np.ndarray) -> np.ndarray:
    """exp(x - max) with top-k, top-p and min-p filtered tokens set to 0. x: [rows, vocab] float32."""
    xmax = x.max(axis=1)                                                      # [rows]
    weights = np.subtract(x, xmax[:, None])                                   # [rows, vocab] float32
    np.exp(weights, out=weights)
    with np.errstate(divide="ignore"):
        thr = (xmax + np.log(min_p)).astype(np.float32)   # p >= min_p * p_max  <=>  x >= x_max + log(min_p)
    top_k = np.where(top_k < x.shape[1], top_k, 0)                            # k >= vocab keeps everything
    sort_rows = np.flatnonzero((top_k > 0) | (top_p < 1))
    if sort_rows.size:
        mass = _take(weights, sort_rows).sum(axis=1).astype(np.float64)    # float32 pairwise sum
        thr[sort_rows] = np.maximum(thr[sort_rows], _top_k_top_p_threshold(
            _take(x, sort_rows), mass, top_k[sort_rows], top_p[sort_rows]))
    if (thr > -np.inf).any():
        weights *= x >= thr[:, None]
    return weights


def _top_k_top_p_threshold(x: np.ndarray, mass: np.ndarray, top_k: np.ndarray, top_p: np.ndarray) -> np.ndarray:
    """Smallest logit each row keeps under top-k, then top-p on the top-k-renormalized distribution.

    ``mass`` is each row's sum of exp(x - max). Only the largest _CANDIDATES logits are
    sorted (np.partition first); a row whose nucleus is not inside them, or whose
    top_k exceeds them, is sorted in full. Which path a row takes depends on that
    row alone, so the result never depends on the rest of the batch.
    """
    rows, vocab = x.shape
    thr = np.empty(rows, np.float32)
    full = np.full(rows, vocab <= _CANDIDATES) | (top_k > _CANDIDATES)
    part = np.flatnonzero(~full)
    if part.size:
        top = np.partition(_take(x, part), vocab - _CANDIDATES, axis=1)[:, vocab - _CANDIDATES:]
        thr[part], inside = _threshold_of_sorted(np.sort(top, axis=1)[:, ::-1], mass[part], top_k[part], top_p[part])
        full[part[~inside]] = True
    rest = np.flatnonzero(full)
    if rest.size:
        desc = np.sort(_take(x, rest), axis=1)[:, ::-1]
        thr[rest], _ = _threshold_of_sorted(desc, mass[rest], top_k[rest], top_p[rest])
    return thr


def _threshold_of_sorted(desc: np.ndarray, mass: np.ndarray, top_k: np.ndarray, top_p: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Thresholds from the leading sorted logits desc [rows, n] (all of them, or the top n).

    top-p keeps the shortest prefix whose mass reaches top_p of the top-k (or, without
    top-k, the whole-row) mass. Also returns whether that prefix lies inside ``desc``.
    """
    rows, n = desc.shape
    r = np.arange(rows)
    k_on = top_k > 0
    thr_k = np.where(k_on, desc[r, np.clip(top_k, 1, n) - 1], -np.inf)
    weights = np.exp(desc - desc[:, :1])                                      # desc[:, 0] is the row max
    weights *= desc >= thr_k[:, None]
    block_cum = _block_cumsum(weights)
    total = np.where(k_on, block_cum[:, -1], mass)
    target = top_p.astype(np.float64) * total
    inside = k_on | (top_p >= 1) | (block_cum[:, -1] >= target * (1 + 1e-6))
    last = np.minimum(_cross_index(weights, block_cum, target, inclusive=False), n - 1)
    thr_p = np.where(top_p < 1, desc[r, last], -np.inf)
    return np.maximum(thr_k, thr_p), inside


def _block_cumsum(weights: np.ndarray) -> np.ndarray:
    """Cumulative sums of _BLOCK-wide blocks of each row, float64 [rows, ceil(vocab / _BLOCK)]."""
    rows, vocab = weights.shape
    full = vocab // _BLOCK * _BLOCK
    sums = weights[:, :full].reshape(rows, -1, _BLOCK).sum(axis=2)           # float32 pairwise: ~1e-7 relative
    if full < vocab:
        sums = np.concatenate([sums, weights[:, full:].sum(axis=1)[:, None]], axis=1)
    return np.cumsum(sums, axis=1, dtype=np.float64)


def _cross_index(weights: np.ndarray, block_cum: np.ndarray, target: np.ndarray, inclusive: bool) -> np.ndarray:
    """Per row, how many leading cumulative sums of ``weights`` are < target (<= target if inclusive).

    That is np.searchsorted(np.cumsum(row), target, side) without the [rows, vocab] cumsum:
    find the block, then cumsum inside it.
    """
    side = "right" if inclusive else "left"
    out = np.empty(weights.shape[0], np.int64)
    for r in range(weights.shape[0]):
        b = min(int(np.searchsorted(block_cum[r], target[r], side)), block_cum.shape[1] - 1)
        before = block_cum[r, b - 1] if b else 0.0
        local = before + np.cumsum(weights[r, b * _BLOCK:(b + 1) * _BLOCK], dtype=np.float64)
        out[r] = b * _BLOCK + int(np.searchsorted(local, target[r], side))
    return out


# ---- logprobs and prepare helpers -----------------------------------------------------

def token_logprobs(x: np.ndarray, tokens: np.ndarray, num_top: np.ndarray) -> list[TokenLogprob]:
    """log_softmax of processed logits x [r, vocab]: each row's token and its num_top best alternatives."""
    if not x.shape[0]:
        return []
    m = x.max(axis=1)
    lse = m + np.log(np.exp(x - m[:, None]).sum(axis=1, dtype=np.float64))    # [r] float64
    out = []
    for row, token, n, norm in zip(x, tokens, num_top, lse):
        top: list[tuple[int, float]] = []
        if n:
            cand = np.argpartition(-row, min(n, row.size) - 1)[:n]
            cand = cand[np.lexsort((cand, -row[cand]))]                       # best first, ties by id
            top = [(int(t), float(row[t] - norm)) for t in cand if np.isfinite(row[t])]
        out.append(TokenLogprob(int(token), float(row[token] - norm), top))
    return out


def _take(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """a[rows] for sorted unique rows; ``a`` itself (no copy) when they are all of its rows."""
    return a if rows.size == a.shape[0] else a[rows]


def _seen_tokens(row: int, request: Request) -> tuple[int, np.ndarray, np.ndarray]:
    """Prompt + output ids of a request (repeats kept: cheaper than np.unique, and harmless)."""
    ids = np.fromiter(chain(request.prompt_ids, request.output_ids), np.int64)
    return row, ids, np.ones(ids.size, np.float32)


def _grammar_bitmask(states: list[GrammarState]) -> np.ndarray:
    """Packed allowed-token masks [g, words] int32 of the given GrammarStates."""
    if not states:
        return np.zeros((0, 0), np.int32)
    sizes = {s.vocab_size for s in states}
    if len(sizes) != 1:
        raise ValueError(f"grammars in one batch must share a vocabulary size, got {sorted(sizes)}")
    bitmask = np.full((len(states), bitmask_width(sizes.pop())), -1, np.int32)
    for g, state in enumerate(states):
        state.fill_mask(bitmask, g)
    return bitmask
