"""Speculative decoding with a draft model (EngineConfig.draft_model, runtime/draft_model.py): a
second artifact with the same tokenizer drafts each request's next tokens greedily, and the served
model checks them in one forward. Greedy requests must get plain decoding's tokens whatever the
draft model says (a 4-bit copy of the model, which agrees often, or another model, which agrees
rarely), in batches, with overlap, when the draft model's cache must drop requests to make room;
the draft model's page books must agree with TVM's; pairs that cannot work are refused in one line."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kiln import Engine, EngineConfig, SamplingParams
from kiln.runtime.draft_model import pairing_problem

pytestmark = pytest.mark.numerics
GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(3, 400, size=n).tolist() for n in (5, 12, 40, 3, 21)]


@pytest.fixture(scope="module")
def plain(tiny_artifacts):
    return [o.token_ids for o in Engine(tiny_artifacts["tied"]).generate(_prompts(), GREEDY)]


@pytest.fixture(scope="module")
def drafts(tiny_artifacts, dumped_ir):
    """The tied tiny Llama's own 4-bit build (agrees with it often) and the untied one (another model
    with the same tokenizer: agrees rarely)."""
    return {"4-bit copy": dumped_ir.artifact("cpu"), "other model": tiny_artifacts["untied"]}


def _books_agree(engine: Engine) -> None:
    draft = engine.speculator.draft_model
    assert draft.runner.free_pages() == draft.pages.free_pages
    draft.pages.check()
    assert engine.runner.free_pages() == engine.scheduler.pages.free_pages


@pytest.mark.parametrize("config", [dict(), dict(speculative_tokens=1), dict(speculative_tokens=6, overlap=True),
                                    dict(max_num_seqs=2), dict(max_num_seqs=3, max_total_tokens=256, overlap=True)],
                         ids=["default", "one-token", "long-overlap", "two-at-once", "small-cache"])
@pytest.mark.parametrize("which", ["4-bit copy", "other model"])
def test_greedy_tokens_are_plain_decodings_whatever_the_draft_model(tiny_artifacts, drafts, plain, which, config):
    engine = Engine(tiny_artifacts["tied"], EngineConfig(draft_model=drafts[which], **config))
    out = engine.generate(_prompts(), GREEDY)
    assert [o.token_ids for o in out] == plain
    stats = engine.stats()
    assert stats.draft_tokens > 0
    if which == "4-bit copy":              # most drafted tokens kept: fewer forwards than tokens
        assert stats.accepted_draft_tokens > stats.draft_tokens / 2
        assert stats.forwards < sum(map(len, plain))
    _books_agree(engine)


def test_a_small_draft_cache_drops_the_oldest_requests_and_computes_them_again(tiny_artifacts, drafts, plain):
    """Five requests one after another through a draft cache of two sequences: each new one drops the
    one that drafted longest ago (ended, its pages still held)."""
    engine = Engine(tiny_artifacts["tied"], EngineConfig(draft_model=drafts["4-bit copy"], max_num_seqs=2))
    draft = engine.speculator.draft_model
    assert draft.runner.max_num_seqs == 2
    outs = [engine.generate(p, GREEDY).token_ids for p in _prompts()]
    assert outs == plain
    assert len(draft._drafted) == 2
    _books_agree(engine)


def test_sampled_requests_keep_drafts_by_speculative_sampling(tiny_artifacts):
    """The model drafting for itself at a low temperature: most drafts kept, every request finished,
    the pages back."""
    art = tiny_artifacts["tied"]
    engine = Engine(art, EngineConfig(draft_model=art))
    out = engine.generate(_prompts()[:3], SamplingParams(max_tokens=30, temperature=0.1, seed=4, ignore_eos=True))
    assert [len(o.token_ids) for o in out] == [30, 30, 30]
    stats = engine.stats()
    assert stats.accepted_draft_tokens > stats.draft_tokens / 2
    _books_agree(engine)


def test_a_draft_model_with_another_tokenizer_is_refused(tiny_artifacts, smollm2_artifact):
    with pytest.raises(ValueError, match="cannot be the draft model: its tokenizer is not the served model's"):
        Engine(tiny_artifacts["tied"], EngineConfig(draft_model=smollm2_artifact))


def test_pairs_on_other_devices_with_a_sliding_window_or_recurrent_layers_are_refused(tiny_artifacts):
    from kiln.runtime.artifact import Artifact
    served = Artifact.load(tiny_artifacts["tied"], verify=False)

    def like(device="cpu", window=None, states=()):
        kv = SimpleNamespace(sliding_window=window, states=list(states))
        return SimpleNamespace(device=device, config=SimpleNamespace(kv_cache=kv), path=served.path)
    assert pairing_problem(like(), served) is None
    assert "compiled for cuda and the served model for cpu" in pairing_problem(like(device="cuda"), served)
    assert "sliding-window" in pairing_problem(like(window=64), served)
    assert "recurrent layers" in pairing_problem(like(states=[(64, 3)]), served)


def test_a_draft_model_that_does_not_load_is_one_clear_error(tiny_artifacts, monkeypatch):
    """TVM's allocation failing for the draft model is one ValueError naming the draft model and what
    to do, not TVM's error alone."""
    from kiln.runtime import draft_model

    def no_memory(*_args, **_kwargs):
        raise RuntimeError("TVMError: ...\nCUDA: out of memory")
    monkeypatch.setattr(draft_model, "ModelRunner", no_memory)
    with pytest.raises(ValueError, match=r"draft model .* could not be loaded \(CUDA: out of memory\); free the "
                                         r"device or choose a smaller draft model"):
        Engine(tiny_artifacts["tied"], EngineConfig(draft_model=tiny_artifacts["untied"]))


def test_the_draft_model_is_loaded_first_and_sized_from_what_the_served_model_will_hold(tiny_artifacts):
    """Its cache: the served model's capacity where known before that loads (given, or the CPU's default),
    within 8 full contexts, plus a page and a draft per sequence."""
    engine = Engine(tiny_artifacts["tied"], EngineConfig(draft_model=tiny_artifacts["untied"], max_num_seqs=3,
                                                         max_total_tokens=192, speculative_tokens=5))
    draft = engine.speculator.draft_model.runner
    page = engine.runner.page_size
    assert (draft.max_num_seqs, draft.max_total_tokens) == (3, 192 + 3 * (page + 5))
    engine = Engine(tiny_artifacts["tied"], EngineConfig(draft_model=tiny_artifacts["untied"]))
    draft = engine.speculator.draft_model.runner
    assert draft.max_total_tokens == engine.runner.max_total_tokens + draft.max_num_seqs * (page + 4)
