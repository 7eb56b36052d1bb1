"""Sliding-window attention end to end against transformers: a tiny Mistral (every layer slides:
TVM's per-sequence window, pages recycled) and a tiny Qwen2 with full and sliding layers (per-layer
windows), compiled q0f32 for the CPU; prompts and generations far longer than the window."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from kiln import Engine, EngineConfig, SamplingParams
from kiln.runtime.artifact import Artifact
from kiln.runtime.model_runner import ModelRunner
from tiny_models import greedy_reference, reference_logits, write_tiny

pytestmark = pytest.mark.numerics
TOL = 1e-4
WINDOW = 16                  # tokens; the CPU profile's pages hold 16
IDS = np.random.default_rng(21).integers(3, 500, size=45).tolist()
FAMILIES = {      # family, config overrides, the overrides that turn the window off
    "mistral": ("Mistral", dict(sliding_window=WINDOW), dict(sliding_window=None)),
    "qwen2": ("Qwen2", dict(sliding_window=WINDOW, use_sliding_window=True, max_window_layers=1,
                            num_hidden_layers=3, rope_theta=1e6),      # layer 0 full, layers 1-2 slide
              dict(layer_types=["full_attention"] * 3)),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    """Per family: the q0f32 CPU artifact, transformers' model (eager attention honours the window)
    and the same weights with full attention (to show the window changes the logits)."""
    import transformers
    root = tmp_path_factory.mktemp("sliding")
    out = {}
    for name, (family, overrides, no_window) in FAMILIES.items():
        d = write_tiny(family, root / name, tied=name == "qwen2", seed=7, **overrides)
        art = kiln.compile(str(d), target="cpu", quant="q0f32", output=root / f"{name}-art")
        cls = getattr(transformers, f"{family}ForCausalLM")
        ref = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        full = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager", **no_window).eval()
        out[name] = (art, ref, full)
    return out


def test_mistral_sliding_window_slides_every_layer():
    from kiln.models.llama import LlamaConfig
    hf = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=32768, sliding_window=4096)
    c = LlamaConfig.from_hf(hf)
    assert c.context_window_size == 32768 and {(a.kind, a.window) for a in c.layer_attention()} == {("sliding", 4096)}
    for off in (dict(sliding_window=None), dict(sliding_window=32768)):
        assert {a.kind for a in LlamaConfig.from_hf(dict(hf, **off)).layer_attention()} == {"full"}


def test_artifact_records_the_window(models):
    kinds = {name: Artifact.load(art).config.kv_cache for name, (art, _, _) in models.items()}
    assert kinds["mistral"].layer_kinds == ("sliding", "sliding") and kinds["mistral"].sliding_window == WINDOW
    assert kinds["qwen2"].layer_kinds == ("full", "sliding", "sliding") and kinds["qwen2"].sliding_window == WINDOW


@pytest.mark.parametrize("name", FAMILIES)
def test_every_prompt_position_and_decode_past_the_window_match_transformers(name, models):
    art, ref, full = models[name]
    runner = ModelRunner(Artifact.load(art))
    expected = reference_logits(ref, IDS)                     # 45 positions, window 16
    assert np.abs(expected[-1] - reference_logits(full, IDS)[-1]).max() > 0.05, "the window changes nothing"
    runner.add_sequence(0)                                    # every position, in the largest legal chunks
    got, pos = [], 0
    while pos < len(IDS):
        n = runner.window.max_chunk(runner.sequence_length(0))
        got.append(runner.verify(0, IDS[pos:pos + n]))
        pos += n
    np.testing.assert_allclose(np.concatenate(got), expected, atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="sliding window allows"):
        runner.verify(0, IDS[:WINDOW])                        # a chunk TVM would get wrong is refused
    runner.add_sequence(1)                                    # last-token prefill, then decode steps
    logits = runner.prefill([1], [IDS])[0]
    np.testing.assert_allclose(logits, expected[-1], atol=TOL, rtol=0)
    seq = list(IDS)
    for _ in range(6):
        seq.append(int(np.argmax(logits)))
        logits = runner.decode([1], [seq[-1]])[0]
        np.testing.assert_allclose(logits, reference_logits(ref, seq)[-1], atol=TOL, rtol=0)


@pytest.mark.parametrize("name", FAMILIES)
def test_engine_greedy_generation_far_past_the_window_matches_transformers(name, models):
    art, ref, _ = models[name]
    # A 24-token step budget: prompts are prefilled in chunks beside other sequences' decodes.
    engine = Engine(art, EngineConfig(max_tokens_per_step=24))
    assert engine.scheduler.prefix_cache is None
    prompts = [IDS[:5], IDS[:30], IDS]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, n=2)
    outs = engine.generate(prompts, params)
    for i, prompt in enumerate(prompts):
        expected = greedy_reference(ref, prompt, 40)
        assert outs[2 * i].token_ids == expected and outs[2 * i + 1].token_ids == expected
    assert engine.scheduler.pages.used_pages == 0 and engine.runner.free_pages() == engine.scheduler.pages.total_pages


def test_long_sliding_generation_recycles_pages(models):
    art, ref, _ = models["mistral"]
    page = Artifact.load(art).config.kv_cache.page_size
    bound = WINDOW // page + 2                                # pages per sequence, however long
    # 8 pages in all: two 170-token sequences would need 22 without the window.
    engine = Engine(art, EngineConfig(max_total_tokens=8 * page, max_tokens_per_step=24))
    accountant = engine.scheduler.pages
    params = SamplingParams(max_tokens=150, temperature=0.0, ignore_eos=True)
    requests = [r for p in (IDS[:20], IDS[5:25]) for r in engine.add_request(p, params)]
    most = 0
    while engine.has_work:
        engine.step()
        held = {s: len(accountant.pages_of(s)) for s in accountant.seq_ids()}
        assert all(n <= bound for n in held.values()), held
        tvm_used = accountant.total_pages - engine.runner.free_pages()
        assert tvm_used <= accountant.used_pages, (tvm_used, accountant.used_pages)
        most = max(most, tvm_used)
    assert all(len(r.output_ids) == 150 for r in requests) and most <= 2 * bound
    assert requests[0].output_ids == greedy_reference(ref, IDS[:20], 150)


def test_mixed_layers_keep_every_page(models):
    art, _, _ = models["qwen2"]
    engine = Engine(art, EngineConfig(max_tokens_per_step=24))
    assert engine.runner.window.per_sequence is False and engine.scheduler.pages.max_pages_per_seq is None
    [request] = engine.add_request(IDS, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    page = engine.runner.page_size
    while not request.finished:
        engine.step()
        if not request.finished:                                  # full layers need every token's KV
            computed = request.seq.num_computed
            assert engine.runner.sequence_length(request.seq_id) == computed
            assert engine.scheduler.pages.total_pages - engine.runner.free_pages() == -(-computed // page)


def test_prompts_arriving_while_a_sequence_slides_match_transformers(models):
    """A fresh prompt arrives at every step for one page's worth of steps, so some forward
    both frees a page of the sliding sequence and hands pages to the newcomer."""
    art, ref, _ = models["mistral"]
    engine = Engine(art, EngineConfig(max_total_tokens=8 * 16, max_tokens_per_step=40))
    [long] = engine.add_request(IDS[:20], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    short = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    arrivals = []
    for k in range(18):
        engine.step()
        prompt = IDS[k:k + 19]
        arrivals += [(prompt, r) for r in engine.add_request(prompt, short)]
    while engine.has_work:
        engine.step()
    assert long.output_ids == greedy_reference(ref, IDS[:20], 40)
    assert all(r.output_ids == greedy_reference(ref, p, 3) for p, r in arrivals)
