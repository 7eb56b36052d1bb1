"""runtime/beam_search.py on a scripted model (every prefix's next-token logprobs drawn from a generator seeded by
it, EOS likely): the search against one written here from vLLM's description, EOS-ended beams and length_penalty
included; an EOS-ended beam's text leaves the EOS out unless include_stop_str_in_output."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from kiln.runtime.beam_search import beam_deltas
from kiln.runtime.protocol import SamplingParams, StreamDelta, TokenLogprob

pytestmark = pytest.mark.unit
VOCAB, EOS, PROMPT = 12, 0, [5, 6, 7]


def logprobs(ids: list[int]) -> np.ndarray:
    rng = np.random.default_rng([*ids, 99])
    x = rng.normal(size=VOCAB) * 1.5
    x[EOS] += 1.0                                               # beams end now and then
    return x - np.log(np.exp(x).sum())


async def generate(ids: list[int], params: SamplingParams):
    lp = logprobs(ids)
    top = [(int(t), float(lp[t])) for t in np.argsort(-lp)[:params.top_logprobs]]
    yield StreamDelta(0, "", [top[0][0]], "length", [TokenLogprob(top[0][0], top[0][1], top)])


def reference(width: int, steps: int, length_penalty: float) -> list[tuple[tuple[int, ...], float]]:
    def score(beam):
        tokens, total = beam
        return total / (len(PROMPT) + len(tokens) - (tokens[-1] == EOS)) ** length_penalty
    live, ended = [((), 0.0)], []
    for _ in range(steps):
        grown = []
        for tokens, total in live:
            lp = logprobs(PROMPT + list(tokens))
            for t in np.argsort(-lp)[:2 * width]:
                (ended if t == EOS else grown).append(((*tokens, int(t)), total + float(lp[t])))
        live = sorted(grown, key=score, reverse=True)[:width]
    return sorted(ended + live, key=score, reverse=True)[:width]


async def _search(params: SamplingParams, length_penalty: float) -> list[StreamDelta]:
    decode = lambda ids: ",".join(map(str, ids))             # noqa: E731
    return [d async for d in beam_deltas(generate, [PROMPT], params, frozenset({EOS}), 64, length_penalty, decode)]


@pytest.mark.parametrize("width, length_penalty", [(1, 1.0), (3, 1.0), (4, 0.0), (4, 2.0)])
def test_the_search_is_vllms(width, length_penalty):
    want = reference(width, 6, length_penalty)
    assert any(t[-1] == EOS for t, _ in want) or width == 1      # the EOS path is taken
    got = asyncio.run(_search(SamplingParams(max_tokens=6, n=width, temperature=0), length_penalty))
    assert [d.token_ids for d in got] == [list(t) for t, _ in want]
    assert [d.finish_reason for d in got] == ["stop" if t[-1] == EOS else "length" for t, _ in want]
    assert [d.text for d in got] == [",".join(map(str, t[:-1] if t[-1] == EOS else t)) for t, _ in want]
    assert [d.index for d in got] == list(range(width))


def test_the_length_penalty_changes_the_ranking_and_the_eos_can_be_kept():
    short, long = (asyncio.run(_search(SamplingParams(max_tokens=6, n=4, temperature=0), lp)) for lp in (0.0, 2.0))
    assert [d.token_ids for d in short] != [d.token_ids for d in long]
    kept = asyncio.run(_search(SamplingParams(max_tokens=6, n=4, temperature=0, include_stop_str_in_output=True), 1.0))
    ended = [d for d in kept if d.finish_reason == "stop"]
    assert ended and all(d.text.endswith(str(EOS)) for d in ended)
