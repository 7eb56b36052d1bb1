"""Sampler vs numpy references: distributions, penalties, greedy, seeds, logprobs, speed.

Empirical distributions from 20k draws (fixed seeds) are compared with
``probabilities()`` and with a reference written here independently (argsort +
cumsum, one filter at a time, as the filters are usually described).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from kiln.runtime.protocol import SamplingParams
from kiln.runtime.sampler import Sampler, SampleResult, probabilities, process_logits, raw_logits

pytestmark = pytest.mark.unit

DRAWS = 20_000
LOGITS = np.array([2.0, 1.5, 1.2, 0.9, 0.3, 0.0, -0.4, -1.1, -2.0, 0.6, 1.0, -3.0], np.float32)


@dataclass(eq=False)
class FakeRequest:
    """What the sampler reads from a Request."""

    params: SamplingParams
    prompt_ids: list[int] = field(default_factory=lambda: [0])
    output_ids: list[int] = field(default_factory=list)
    grammar: object | None = None
    eos_token_ids: frozenset[int] = frozenset()
    tokenizer: object | None = None

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.params.seed)


def reference(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0,
              min_p: float = 0.0) -> np.ndarray:
    """Softmax(logits / T), then top-k, top-p (smallest prefix with mass >= top_p), min-p; renormalized."""
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_k:
        p[p < np.sort(p)[::-1][top_k - 1]] = 0
        p /= p.sum()
    if top_p < 1:
        order = np.argsort(-p, kind="stable")
        mass_before = np.cumsum(p[order]) - p[order]
        p[order[mass_before >= top_p]] = 0
        p /= p.sum()
    if min_p:
        p[p < min_p * p.max()] = 0
        p /= p.sum()
    return p


def _sample_many(params: SamplingParams, logits: np.ndarray = LOGITS, n: int = DRAWS, **request) -> np.ndarray:
    """n draws of one request (one generator), as one batch of n identical rows."""
    request = FakeRequest(params, **request)
    sampler = Sampler()
    result = sampler.sample(np.tile(logits, (n, 1)), sampler.prepare([request] * n))
    return np.bincount(result.tokens, minlength=logits.size) / n


FILTERS = [
    dict(temperature=1.0),
    dict(temperature=0.5),
    dict(temperature=2.0),
    dict(temperature=1.0, top_k=4),
    dict(temperature=1.0, top_p=0.7),
    dict(temperature=1.0, min_p=0.2),
    dict(temperature=0.8, top_k=6, top_p=0.8),
    dict(temperature=1.3, top_k=8, top_p=0.9, min_p=0.1),
]


@pytest.mark.parametrize("kw", FILTERS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_distribution_matches_references(kw):
    expected = reference(LOGITS, **kw)
    np.testing.assert_allclose(probabilities(LOGITS, **kw), expected, atol=1e-6)
    empirical = _sample_many(SamplingParams(seed=1234, **kw))
    assert np.all(empirical[expected == 0] == 0), "a filtered-out token was drawn"
    # 20k draws: the standard error of a frequency is <= 0.0036, so 0.015 is > 4 sigma
    np.testing.assert_allclose(empirical, expected, atol=0.015)


def llama_cpp_reference(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0,
                        min_p: float = 0.0) -> np.ndarray:
    """llama.cpp's sampler chain: top-k, top-p and min-p on the untempered softmax, then softmax(logits / T) over the
    tokens they kept."""
    kept = reference(logits, 1.0, top_k, top_p, min_p) > 0
    z = np.where(kept, logits.astype(np.float64) / temperature, -np.inf)
    p = np.exp(z - z.max())
    return p / p.sum()


@pytest.mark.parametrize("kw", FILTERS[1:], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_temperature_last_is_llama_cpps_chain(kw):
    expected = llama_cpp_reference(LOGITS, **kw)
    np.testing.assert_allclose(probabilities(LOGITS, **kw, temperature_last=True), expected, atol=1e-6)
    empirical = _sample_many(SamplingParams(seed=99, temperature_last=True, **kw))
    assert np.all(empirical[expected == 0] == 0), "a filtered-out token was drawn"
    np.testing.assert_allclose(empirical, expected, atol=0.015)


@pytest.mark.parametrize("kw", [dict(temperature=2.0, top_p=0.7), dict(temperature=0.5, min_p=0.2)])
def test_the_order_changes_what_the_filters_keep(kw):
    """Hotter, top-p keeps more tokens when it chooses after temperature; colder, min-p keeps fewer."""
    late, first = (probabilities(LOGITS, **kw, temperature_last=last) for last in (True, False))
    assert (np.count_nonzero(late) < np.count_nonzero(first)) == (kw["temperature"] > 1)
    assert np.count_nonzero(late) != np.count_nonzero(first)


def test_top_p_keeps_the_token_that_crosses_the_mass():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    p = probabilities(logits, 1.0, top_p=0.6)
    np.testing.assert_allclose(p, [0.5 / 0.8, 0.3 / 0.8, 0, 0], atol=1e-6)
    np.testing.assert_allclose(probabilities(logits, 1.0, top_p=0.4), [1, 0, 0, 0], atol=1e-6)


@pytest.mark.parametrize("scale, kw", [
    (2.0, dict(temperature=0.9, top_p=0.5)),                   # nucleus among the 1024 largest: partial sort
    (2.0, dict(temperature=1.0, top_k=300, min_p=0.05)),
    (0.1, dict(temperature=1.0, top_p=0.9)),                   # flat: nucleus beyond them, full sort
    (2.0, dict(temperature=1.0, top_k=2000, top_p=0.99)),      # k beyond them, full sort
])
def test_large_vocab_distribution_matches_reference(scale, kw):
    logits = np.random.default_rng(3).standard_normal(3000).astype(np.float32) * scale
    expected = reference(logits, **kw)
    np.testing.assert_allclose(probabilities(logits, **kw), expected, atol=1e-7)
    empirical = _sample_many(SamplingParams(seed=0, **kw), logits)
    assert np.all(empirical[expected == 0] == 0), "a filtered-out token was drawn"
    np.testing.assert_allclose(empirical, expected, atol=0.015)


def _processed(params: SamplingParams, logits: np.ndarray, prompt=(0,), output=()) -> np.ndarray:
    request = FakeRequest(params, list(prompt), list(output))
    x = np.array(logits[None], np.float32)
    process_logits(x, Sampler().prepare([request]))
    return x[0]


def test_repetition_penalty_hf_rule_on_prompt_and_output():
    logits = np.array([1.0, -1.0, 2.0, 0.5, -0.5, 3.0], np.float32)
    x = _processed(SamplingParams(repetition_penalty=2.0), logits, prompt=[0, 1, 1], output=[2, 4])
    np.testing.assert_allclose(x, [0.5, -2.0, 1.0, 0.5, -1.0, 3.0])   # seen: 0, 1 (prompt), 2, 4 (output)


def test_frequency_and_presence_penalties_openai_rule_on_output_only():
    logits = np.array([1.0, -1.0, 2.0, 0.5, -0.5, 3.0], np.float32)
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    x = _processed(params, logits, prompt=[0, 5], output=[2, 2, 3, 2])
    np.testing.assert_allclose(x, [1.0, -1.0, 2.0 - 1.5 - 0.25, 0.5 - 0.5 - 0.25, -0.5, 3.0])


def test_logit_bias_then_penalties_then_greedy():
    logits = np.array([1.0, -1.0, 2.0, 0.5, -0.5, 3.0], np.float32)
    params = SamplingParams(temperature=0, logit_bias={5: -100, 4: 2.0, 99: 5.0, -1: 5.0}, repetition_penalty=2.0,
                            frequency_penalty=0.5, presence_penalty=0.25)
    expected = np.array([0.5, -2.0, 2.0 / 2 - 1.25, 0.25 - 0.75, 1.5, -97.0])   # out-of-range bias ids ignored
    np.testing.assert_allclose(_processed(params, logits, prompt=[0, 1], output=[2, 2, 3]), expected, rtol=1e-6)
    request = FakeRequest(params, [0, 1], [2, 2, 3])
    assert Sampler().sample(logits[None], Sampler().prepare([request])).tokens == [4]


def test_greedy_is_argmax():
    logits = np.random.default_rng(0).standard_normal((6, 500)).astype(np.float32)
    requests = [FakeRequest(SamplingParams(temperature=0)), FakeRequest(SamplingParams(top_k=1, temperature=1.5))] * 3
    sampler = Sampler()
    assert sampler.sample(logits, sampler.prepare(requests)).tokens == logits.argmax(axis=1).tolist()
    assert probabilities(logits[0], 0.0)[logits[0].argmax()] == 1.0


def _run(requests: list[FakeRequest], steps: int, logits_of) -> list[list[int]]:
    """Sample ``steps`` tokens for each request; logits_of(request, step) -> its row of logits."""
    sampler = Sampler()
    for step in range(steps):
        logits = np.stack([logits_of(r, step) for r in requests])
        for r, t in zip(requests, sampler.sample(logits, sampler.prepare(requests)).tokens):
            r.output_ids.append(t)
    return [r.output_ids for r in requests]


def _row_logits(request: FakeRequest, step: int) -> np.ndarray:
    """Logits that depend only on the request's seed and the step (as a model's would on its tokens)."""
    return np.random.default_rng((request.params.seed or 0, step)).standard_normal(1000).astype(np.float32) * 2


def test_same_seed_same_tokens_different_seed_differs():
    steps = np.random.default_rng(11).standard_normal((30, 1000)).astype(np.float32)
    kw = dict(temperature=0.9, top_p=0.95, top_k=200)
    a, b, c = (_run([FakeRequest(SamplingParams(seed=seed, **kw))], 30, lambda r, s: steps[s])[0]
               for seed in (7, 7, 8))
    assert a == b
    assert a != c


def test_tokens_do_not_depend_on_batch_composition():
    def mine() -> FakeRequest:
        return FakeRequest(SamplingParams(seed=5, temperature=0.8, top_p=0.9, min_p=0.02, presence_penalty=0.5))

    alone = _run([mine()], 25, _row_logits)[0]
    others = [FakeRequest(SamplingParams(seed=s, temperature=t, top_k=k, top_p=p, repetition_penalty=rp))
              for s, (t, k, p, rp) in enumerate([(0, 0, 1, 1), (1.2, 40, 1, 1.3), (0.5, 0, 0.5, 1), (1, 1, 1, 1)], 100)]
    for position in (0, 2, 4):
        batch = others[:position] + [mine()] + others[position:]
        for r in others:
            r.output_ids = []
            r.rng = np.random.default_rng(r.params.seed)
        assert _run(batch, 25, _row_logits)[position] == alone


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def test_logprobs_are_log_softmax_of_processed_logits_before_temperature():
    logits = np.random.default_rng(2).standard_normal((3, 300)).astype(np.float32) * 3
    requests = [FakeRequest(SamplingParams(seed=1, temperature=0.3, logprobs=True, top_logprobs=5,
                                           logit_bias={7: 4.0})),
                FakeRequest(SamplingParams(temperature=0, top_logprobs=20)),
                FakeRequest(SamplingParams(seed=2))]
    sampler = Sampler()
    result: SampleResult = sampler.sample(logits, sampler.prepare(requests))
    assert result.logprobs[2] is None
    for i, n in [(0, 5), (1, 20)]:
        row = logits[i].copy()
        if i == 0:
            row[7] += 4.0
        expected = _log_softmax(row)
        lp = result.logprobs[i]
        assert lp.token_id == result.tokens[i]
        assert lp.logprob == pytest.approx(expected[lp.token_id], abs=1e-5)
        assert [t for t, _ in lp.top] == np.argsort(-expected, kind="stable")[:n].tolist()
        np.testing.assert_allclose([v for _, v in lp.top], np.sort(expected)[::-1][:n], atol=1e-5)
        assert all(a[1] >= b[1] for a, b in zip(lp.top, lp.top[1:]))
    assert result.logprobs[1].top[0] == (result.tokens[1], result.logprobs[1].logprob)


def test_logprobs_without_alternatives():
    request = FakeRequest(SamplingParams(seed=0, logprobs=True))
    lp = Sampler().sample(LOGITS[None], Sampler().prepare([request])).logprobs[0]
    assert lp.top == [] and lp.logprob == pytest.approx(_log_softmax(LOGITS)[lp.token_id], abs=1e-6)


def test_mixed_batch_32_by_49152():
    """Every kind of sampling parameter in one SmolLM2-sized batch."""
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((32, 49152)) * 3).astype(np.float32)
    kinds = [dict(temperature=0), dict(temperature=0.7, top_p=0.9), dict(temperature=0.8, top_k=50),
             dict(temperature=1.0, min_p=0.05, repetition_penalty=1.1, frequency_penalty=0.3, top_logprobs=5)]
    requests = [FakeRequest(SamplingParams(seed=i, **kinds[i % 4]), rng.integers(0, 49152, 500).tolist(),
                            rng.integers(0, 49152, 100).tolist()) for i in range(32)]
    sampler = Sampler()
    result = sampler.sample(logits, sampler.prepare(requests))
    assert len(result.tokens) == 32 and all(0 <= t < 49152 for t in result.tokens)


def test_what_only_the_host_sampler_honours_keeps_a_request_off_the_device_and_speculation():
    """raw_logits (the device sampler's and speculative decoding's test): bad words (a drafted run of tokens could
    complete one with no mask between) and llama.cpp's order (both temper first) send a request to the host."""
    assert raw_logits(FakeRequest(SamplingParams(temperature=0.7)))
    assert not raw_logits(FakeRequest(SamplingParams(bad_words=("upon",))))
    assert not raw_logits(FakeRequest(SamplingParams(temperature=0.7, temperature_last=True)))
    assert not raw_logits(FakeRequest(SamplingParams(temperature=0.7, infill=True)))


# ---- llama.cpp's infill sampler ------------------------------------------------------------------------------------

@dataclass
class ByteTexts:
    """A tokenizer's token_bytes and EOS id, as the infill sampler reads them."""

    texts: list[bytes]
    eos_token_id: int | None = None

    def token_bytes(self, token_id: int) -> bytes:
        return self.texts[token_id]


# token 3 ends the generation (a special token: no text); "de" and "d" begin "def"
TEXTS = ByteTexts([b"def", b"de", b"x", b"", b"d", b"y"], eos_token_id=3)
PROBS = np.array([0.30, 0.25, 0.21, 0.01, 0.13, 0.10])


def _infill_draws(probs: np.ndarray, texts: ByteTexts, **params) -> np.ndarray:
    return _sample_many(SamplingParams(seed=7, infill=True, temperature_last=True, **params),
                        np.log(probs).astype(np.float32), eos_token_ids=frozenset({texts.eos_token_id}),
                        tokenizer=texts)


def test_the_infill_sampler_merges_prefixes_then_draws_by_the_logits_left():
    """"de" (0.25) and "d" (0.13) merge into "def": 0.68 of the mass; "x" keeps 0.21 (>= 0.2), "y" (0.10) is dropped;
    renormalized over def, x and the end token (0.90), x's 0.233 is under 1 / (2 texts + 1): dropped. Left: "def" and
    the end token, drawn by their own logits (0.30 : 0.01), not by the merged mass; tempered after, as late."""
    for temperature, expected_def in ((1.0, 0.30 / 0.31), (0.5, 0.09 / 0.0901)):
        draws = _infill_draws(PROBS, TEXTS, temperature=temperature)
        assert set(np.flatnonzero(draws)) <= {0, 3}
        np.testing.assert_allclose(draws[0], expected_def, atol=0.01)
    greedy = _infill_draws(PROBS, TEXTS, temperature=0.0)
    assert greedy[0] == 1.0


def test_a_likely_end_leaves_only_the_end_tokens():
    """3 * p(end) * candidates > p(text): 3 * 0.1 * 4 = 1.2 > 0.9, so the end token is taken even greedy, where the
    plain argmax would write "def"; with top_k 3 first the end token is no candidate and text goes on."""
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    texts = ByteTexts([b"def", b"q", b"x", b""], eos_token_id=3)
    for temperature in (1.0, 0.0):
        assert _infill_draws(probs, texts, temperature=temperature)[3] == 1.0
    kept = _infill_draws(probs, texts, temperature=1.0, top_k=3)
    assert set(np.flatnonzero(kept)) == {0, 1}                # "x": 0.222 < 1 / (3 texts + 1)
    np.testing.assert_allclose(kept[0], 0.4 / 0.7, atol=0.015)


def test_no_text_likely_enough_forces_the_end_token():
    """Ten unrelated texts of about 0.1 each and an unlikely end (3 * 0.0001 * 11 candidates < 0.9999): no text
    reaches 0.2, so the end token is forced."""
    probs = np.array([0.1] * 10 + [0.0001])
    texts = ByteTexts([bytes([97 + i]) for i in range(10)] + [b""], eos_token_id=10)
    draws = _sample_many(SamplingParams(seed=3, infill=True, temperature_last=True), np.log(probs).astype(np.float32),
                         n=200, eos_token_ids=frozenset({10}), tokenizer=texts)
    assert draws[10] == 1.0
