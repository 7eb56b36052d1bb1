"""Families whose layers slide, on prompts and generations longer than the window, against transformers:
Gemma 2 (alternating sliding/global layers), Gemma 3 (the same with per-layer RoPE in the graph), and
Phi-3 and StarCoder2 (every layer slides: TVM's per-sequence window), Cohere2 (sliding layers with RoPE
in the graph, global ones without), CWM (a Llama with sliding layers among full ones), GPT-Neo (local
layers among global ones, learned positions), Mellum (experts, sliding layers with their own RoPE base
around a full one), ModernBERT's decoder (a RoPE base a layer kind, its window half local_attention); over the KV
cache kiln owns, gpt-oss (sinks) and Phi-3 with LongRoPE (every layer sliding,
RoPE in the graph), which TVM's cache cannot run (refused with --kv-cache tvm), and MiMo-V2-Flash (KV heads a layer
kind, sinks on the sliding layers, values narrower than keys)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import Engine, EngineConfig, SamplingParams
from kiln.runtime.artifact import Artifact
from kiln.runtime.model_runner import ModelRunner
from test_families import write_family
from tiny_models import greedy_reference, reference_logits

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
TOL = 1e-4
WINDOW = 16
IDS = np.random.default_rng(8).integers(3, 500, size=40).tolist()
CASES = {"gemma2": dict(sliding_window=WINDOW),          # attention soft-capped (2.0): TVM's sliding kernels too
         "gemma3": dict(sliding_window=WINDOW),
         # Phi-3-mini-4k's shape: every layer slides, RoPE unscaled (applied by the cache)
         "phi3": dict(sliding_window=WINDOW, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
         "starcoder2": dict(sliding_window=WINDOW),             # every layer slides (StarCoder2-3B's 4,096)
         "cohere2": dict(sliding_window=WINDOW),                # 3 sliding with RoPE, then 1 global without
         "cwm": dict(sliding_window=WINDOW),                    # a Llama: 1 full, then 3 sliding, RoPE by the cache
         "gpt-neo": dict(window_size=WINDOW),                   # learned positions: a global layer, then a local one
         "mellum": dict(sliding_window=WINDOW),                 # sliding, full, sliding; RoPE in the graph
         "modernbert-decoder": dict(local_attention=2 * WINDOW),  # full, 2 sliding, full; a RoPE base a kind
         # the KV cache kiln owns (windows masked by position, any chunk): sinks on sliding and full layers;
         # every layer sliding with RoPE in the graph (LongRoPE), which TVM's cache cannot run
         "gpt-oss": dict(sliding_window=WINDOW),
         # sinks on its sliding layers only, those with twice the full layer's KV heads, values narrower than keys
         "mimo-v2-flash": dict(sliding_window=WINDOW),
         "phi3-longrope": dict(sliding_window=WINDOW)}


@pytest.fixture(scope="module", params=list(CASES))
def family(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    ref = write_family(request.param.removesuffix("-longrope"), root / "hf", seed=3, **CASES[request.param])
    art = kiln.compile(str(root / "hf"), target="cpu", quant="q0f32", output=root / "art")
    return request.param, art, ref


def test_the_artifact_passes_kiln_check(family):
    """Its golden prompts (up to 16 tokens: the whole window) through the sliding-window cache."""
    report = kiln.check(family[1])
    assert report.ok and report.reference.startswith("transformers"), report.table()


def test_prompt_longer_than_the_window_and_decode_match_transformers(family):
    name, art, ref = family
    runner = ModelRunner(Artifact.load(art))
    layout = Artifact.load(art).config.kv_cache
    assert "sliding" in layout.layer_kinds and (layout.owner == "kiln") == (name in ("gpt-oss", "phi3-longrope",
                                                                                           "mimo-v2-flash"))
    expected = reference_logits(ref, IDS)
    runner.add_sequence(0)
    got, pos = [], 0
    while pos < len(IDS):
        n = runner.window.max_chunk(runner.sequence_length(0)) if runner.window else 7     # kiln's cache: any
        got.append(runner.verify(0, IDS[pos:pos + n]))
        pos += n
    np.testing.assert_allclose(np.concatenate(got), expected, atol=TOL, rtol=0)
    runner.add_sequence(1)
    logits, seq = runner.prefill([1], [IDS])[0], list(IDS)
    for _ in range(5):
        seq.append(int(np.argmax(logits)))
        logits = runner.decode([1], [seq[-1]])[0]
        np.testing.assert_allclose(logits, reference_logits(ref, seq)[-1], atol=TOL, rtol=0)


def test_engine_greedy_past_the_window_matches_transformers(family):
    name, art, ref = family
    engine = Engine(art, EngineConfig(max_tokens_per_step=24))
    outs = engine.generate([IDS[:6], IDS], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    assert [o.token_ids for o in outs] == [greedy_reference(ref, IDS[:6], 24), greedy_reference(ref, IDS, 24)]


def test_every_layer_sliding_with_rope_in_the_graph_is_refused_on_tvms_cache(tmp_path):
    from kiln.models import ModelLoadError
    write_family("phi3", tmp_path / "hf", sliding_window=WINDOW)          # LongRoPE: RoPE in the graph
    with pytest.raises((ValueError, ModelLoadError), match="paged KV cache supports neither; use --kv-cache kiln"):
        kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", kv_cache="tvm")
    assert not (tmp_path / "art").exists()
