"""Speculative decoding by prompt lookup (EngineConfig.speculative_tokens): in a step of decodes,
each request's draft, the tokens that followed an earlier occurrence of its last n-gram, is checked
in the same forward and the tokens the model picks itself are kept. It must never change what a
greedy request generates, a sampled token must keep sampling's distribution, and the KV pages a
rejected draft took must come back (TVM's count agreeing)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import Engine, EngineConfig, SamplingParams
from kiln.runtime.speculative import Drafting, prompt_lookup, speculative_sample
from kiln.runtime.sampler import probabilities

pytestmark = pytest.mark.numerics


def test_prompt_lookup_takes_the_longest_latest_match():
    assert prompt_lookup([1, 2, 3, 9, 2, 3, 7, 1, 2, 3], 2, 1, 4) == [9, 2]    # "1 2 3" beats the later "2 3"
    assert prompt_lookup([5, 6, 1, 5, 6, 2, 5, 6], 3, 2, 4) == [2, 5, 6]      # the latest "5 6"
    assert prompt_lookup([4, 4, 4, 4], 3, 1, 3) == [4]                        # overlapping runs
    assert prompt_lookup([1, 2, 3, 4], 3, 2, 4) == []                         # nothing repeats
    assert prompt_lookup([1, 2, 1], 3, 2, 4) == []                            # only a 1-gram, shortest is 2
    assert prompt_lookup([7], 3, 1, 4) == []


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.9), SamplingParams(temperature=1.3, top_p=0.9),
                                    SamplingParams(temperature=0.7, top_k=3, min_p=0.05)],
                         ids=["temperature", "top-p", "top-k-min-p"])
def test_speculative_sampling_keeps_each_tokens_distribution(params):
    """Monte Carlo over the rule itself: the first token taken has the first row's distribution, the
    one after a kept first drafted token the second row's, the one after both the third row's."""
    vocab, draft, n = 7, [2, 4], 20_000
    logits = np.random.default_rng(5).normal(0, 1.5, size=(3, vocab)).astype(np.float32)
    logits[0, 2] = logits[0].max() + 0.3                    # the drafted tokens are likely, not certain
    logits[1, 4] = logits[1].max() + 0.3
    want = [probabilities(row, params.temperature, params.top_k, params.top_p, params.min_p) for row in logits]
    rng = np.random.default_rng(0)
    runs = [speculative_sample(logits, draft, params, rng) for _ in range(n)]
    assert all(1 <= len(r) <= 3 and r[:len(r) - 1] == draft[:len(r) - 1] for r in runs)
    for i in range(3):                                      # the token at i, given the draft kept before it
        got = np.bincount([r[i] for r in runs if len(r) > i], minlength=vocab)
        assert got.sum() > 1_500
        assert 0.5 * np.abs(got / got.sum() - want[i]).sum() < 0.03, (i, got / got.sum(), want[i])


def test_drafts_grow_when_kept_shrink_when_missed_and_pause_after_misses():
    s = Drafting(5)
    s.after(5, 5, 10, most=6)
    assert (s.limit, s.resume_at) == (6, 0)                 # kept whole: two longer, at most `most`
    s.after(6, 2, 13, most=6)
    assert s.limit == 3                                     # kept in part: one longer than the part
    s.after(3, 0, 14, most=6)
    assert (s.limit, s.resume_at) == (1, 0)                 # missed outright: one token
    pauses = []
    for replied in (15, 17, 20, 25):                        # one-token misses: pauses of 1, 2, 4, 8
        s.after(1, 0, replied, most=6)
        pauses.append(s.resume_at - replied)
    assert pauses == [1, 2, 4, 8]
    s.after(1, 1, 40, most=6)
    assert (s.limit, s.pause) == (3, 1)                     # a kept token ends the pauses
    for _ in range(10):
        s.after(1, 0, 50, most=6)
    assert s.pause == 64


def test_a_requests_tokens_are_copied_once():
    from kiln.runtime.sequence import Sequence
    seq = Sequence(seq_id=0, prompt_ids=[1, 2, 3], max_tokens=10)
    state = Drafting(4)
    assert state.tokens(seq).tolist() == [1, 2, 3]
    seq.output_ids += [4, 5]
    assert state.tokens(seq).tolist() == [1, 2, 3, 4, 5]
    seq.output_ids += list(range(6, 20))
    assert state.tokens(seq).tolist() == list(range(1, 20))


def _repeating_prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)
    phrase = rng.integers(3, 500, size=9).tolist()
    return [phrase * 3 + phrase[:4], rng.integers(3, 500, size=30).tolist(), [11, 12, 13] * 8]


def _pages_back(engine: Engine) -> None:
    sched = engine.scheduler
    cached = set(sched.prefix_cache.seq_ids()) if sched.prefix_cache is not None else set()
    assert set(sched.pages.seq_ids()) <= cached
    assert engine.runner.free_pages() == sched.pages.free_pages
    sched.pages.check()


def _generate(artifact, prompts, params, **config):
    engine = Engine(artifact, EngineConfig(**config))
    outs = [engine.generate(p, params) for p in prompts]          # one at a time: a lone request decodes
    _pages_back(engine)
    return outs, engine.stats()


@pytest.fixture(scope="module")
def plain_60(tiny_artifacts):
    return _generate(tiny_artifacts["tied"], _repeating_prompts(),
                     SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True))[0]


@pytest.mark.parametrize("config", [dict(), dict(overlap=True), dict(enable_prefix_cache=False),
                                    dict(speculative_tokens=9, prompt_lookup_min=1)],
                         ids=["plain", "overlap", "no-prefix-cache", "long-drafts"])
def test_same_tokens_with_and_without_speculation(tiny_artifacts, plain_60, config):
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    spec, stats = _generate(tiny_artifacts["tied"], _repeating_prompts(), params, **{"speculative_tokens": 4, **config})
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain_60]
    assert [o.text for o in spec] == [o.text for o in plain_60]
    assert all(o.finish_reason == "length" for o in spec)
    assert stats.accepted_draft_tokens > 0                  # the tiny model falls into loops: drafts are kept
    assert stats.forwards < sum(len(o.token_ids) for o in spec) + len(spec)


def test_short_replies_are_the_same_and_leave_room_for_no_draft(tiny_artifacts):
    """The last token is always the model's own: 1 or 2 tokens leave no room for a draft."""
    for max_tokens in (1, 2, 7):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        plain, _ = _generate(tiny_artifacts["tied"], _repeating_prompts(), params)
        spec, stats = _generate(tiny_artifacts["tied"], _repeating_prompts(), params, speculative_tokens=4,
                                prompt_lookup_min=1)
        assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
        assert (stats.draft_tokens == 0) == (max_tokens <= 2)


def test_a_stop_token_or_string_inside_a_kept_draft_ends_the_request_there(tiny_artifacts):
    prompts = _repeating_prompts()
    free_run = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    plain, _ = _generate(tiny_artifacts["tied"], prompts, free_run)
    for out in plain:
        stop_id = out.token_ids[30]
        stop_text = out.text[len(out.text) // 2:][:6]
        for params in (SamplingParams(max_tokens=60, temperature=0.0, stop_token_ids=(stop_id,), ignore_eos=True),
                       SamplingParams(max_tokens=60, temperature=0.0, stop=(stop_text,), ignore_eos=True)):
            want, _ = _generate(tiny_artifacts["tied"], [out.prompt_token_ids], params)
            got, stats = _generate(tiny_artifacts["tied"], [out.prompt_token_ids], params, speculative_tokens=5,
                                   prompt_lookup_min=1)
            assert (got[0].token_ids, got[0].text, got[0].finish_reason) == \
                   (want[0].token_ids, want[0].text, want[0].finish_reason)
            assert got[0].finish_reason == "stop" and stats.accepted_draft_tokens > 0


def test_a_batch_of_decodes_speculates_and_keeps_its_tokens(tiny_artifacts, plain_60):
    """Three greedy requests at once: each row's draft is checked in the same forward."""
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    for config in (dict(), dict(overlap=True), dict(max_num_seqs=2)):
        plain = Engine(tiny_artifacts["tied"], EngineConfig(**config))
        plain.generate(_repeating_prompts(), params)
        engine = Engine(tiny_artifacts["tied"], EngineConfig(speculative_tokens=4, **config))
        outs = engine.generate(_repeating_prompts(), params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain_60]
        stats = engine.stats()
        assert stats.accepted_draft_tokens > 0 and stats.forwards < plain.stats().forwards
        _pages_back(engine)


def test_a_batch_of_greedy_and_sampled_decodes(tiny_artifacts, plain_60):
    engine = Engine(tiny_artifacts["tied"], EngineConfig(speculative_tokens=4, prompt_lookup_min=1))
    prompts = _repeating_prompts()
    greedy = engine.add_request(prompts[0], SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True))[0]
    sampled = engine.add_request(prompts[2], SamplingParams(max_tokens=60, temperature=0.5, seed=2,
                                                            ignore_eos=True))[0]
    while not (greedy.finished and sampled.finished):
        engine.step()
    assert greedy.output_ids == plain_60[0].token_ids
    assert len(sampled.output_ids) == 60 and engine.stats().accepted_draft_tokens > 0
    _pages_back(engine)


def test_logprobs_come_from_the_checked_drafts(tiny_artifacts):
    params = SamplingParams(max_tokens=40, temperature=0.0, logprobs=True, top_logprobs=3, ignore_eos=True)
    prompts = _repeating_prompts()
    plain, _ = _generate(tiny_artifacts["tied"], prompts, params)
    spec, stats = _generate(tiny_artifacts["tied"], prompts, params, speculative_tokens=4, prompt_lookup_min=1)
    assert stats.accepted_draft_tokens > 0
    for want, got in zip(plain, spec):
        assert got.token_ids == want.token_ids and len(got.logprobs) == len(want.logprobs) == 40
        for w, g in zip(want.logprobs, got.logprobs):
            assert g.token_id == w.token_id and abs(g.logprob - w.logprob) < 1e-4
            assert [t for t, _ in g.top] == [t for t, _ in w.top]
            np.testing.assert_allclose([lp for _, lp in g.top], [lp for _, lp in w.top], atol=1e-4)


def test_only_requests_with_untouched_logits_speculate(tiny_artifacts):
    engine = Engine(tiny_artifacts["tied"], EngineConfig(speculative_tokens=4, prompt_lookup_min=1))
    prompts = _repeating_prompts()
    engine.generate(prompts[0], SamplingParams(max_tokens=30, temperature=0.0, repetition_penalty=1.3,
                                               ignore_eos=True))
    penalised = engine.add_request(prompts[1], SamplingParams(max_tokens=30, temperature=0.0,
                                                              presence_penalty=0.5, ignore_eos=True))[0]
    plain = engine.add_request(prompts[2], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))[0]
    while not (penalised.finished and plain.finished):      # a batch with a penalised row: none speculates
        engine.step()
    assert engine.stats().draft_tokens == 0
    before = engine.stats().forwards
    engine.generate(prompts[0], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    stats = engine.stats()
    assert stats.draft_tokens > 0 and stats.forwards - before < 30
    _pages_back(engine)


def test_a_sampled_request_speculates_and_gives_its_pages_back(tiny_artifacts):
    engine = Engine(tiny_artifacts["tied"], EngineConfig(speculative_tokens=4, prompt_lookup_min=1))
    params = SamplingParams(max_tokens=40, temperature=0.3, seed=3, ignore_eos=True)
    out = engine.generate(_repeating_prompts()[0], params)
    stats = engine.stats()
    assert len(out.token_ids) == 40 and out.finish_reason == "length"
    assert stats.accepted_draft_tokens > 0 and stats.forwards < 40
    _pages_back(engine)


def test_a_stream_closed_mid_way_gives_its_pages_back(tiny_artifacts):
    engine = Engine(tiny_artifacts["tied"], EngineConfig(speculative_tokens=6, prompt_lookup_min=1))
    stream = engine.generate_stream(_repeating_prompts()[2], SamplingParams(max_tokens=80, temperature=0.0,
                                                                            ignore_eos=True))
    seen = sum(len(d.token_ids) for d, _ in zip(stream, range(5)))
    stream.close()
    assert seen > 5                          # kept drafts: more than a token a delta
    _pages_back(engine)


@pytest.mark.parametrize("config, match", [
    (dict(speculative_tokens=-1), "speculative_tokens >= 0"),
    (dict(speculative_tokens=2, prompt_lookup_min=3, prompt_lookup_max=2), "prompt_lookup_min <= prompt_lookup_max"),
    (dict(speculative_tokens=100_000), "prefill chunk"),
])
def test_bad_speculation_settings_are_refused(tiny_artifacts, config, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        Engine(tiny_artifacts["tied"], EngineConfig(**config))
    # before a draft model would load (this one is no artifact: loading it would fail otherwise)
    with pytest.raises(ValueError, match=match):
        Engine(tiny_artifacts["tied"], EngineConfig(**config, draft_model=tmp_path / "none"))


def test_smollm2_repeats_a_text_in_fewer_forwards_and_the_same_words(smollm2_artifact):
    """The real model asked to repeat a text: the draft is the text itself."""
    text = ("The kiln fires clay at high heat. Potters load it in the morning, close the door and raise the "
            "temperature slowly, so that the pots do not crack.")
    messages = [{"role": "user", "content": f"Repeat this text exactly:\n\n{text}"}]
    params = SamplingParams(max_tokens=48, temperature=0.0)
    outs, stats = {}, {}
    for k in (0, 5):
        engine = Engine(smollm2_artifact, EngineConfig(speculative_tokens=k))
        outs[k] = engine.chat(messages, params)
        stats[k] = engine.stats()
        _pages_back(engine)
    assert outs[5].token_ids == outs[0].token_ids and outs[5].text == outs[0].text
    assert stats[5].accepted_draft_tokens >= len(outs[5].token_ids) // 2
    assert stats[5].forwards < stats[0].forwards / 2
