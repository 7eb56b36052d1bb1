"""Gemma 4 (models/gemma4.py) against transformers: tiny random-init models, compiled q0f32 for the CPU,
give transformers' logits within 1e-4 at every prefill position, the last-token prefill and 5 greedy
decode steps, with a prompt past the sliding window, and pass `kiln check`:

    e2b      per-layer embeddings, the last 3 layers sharing earlier layers' keys and values (a sliding
             and a global one as sources), double-wide MLPs on the shared layers, global layers with their
             own head size (transformers' saved per_layer_config)
    k-eq-v   global layers whose values are their keys (no v_proj) and one KV head of their own, an untied
             head, no per-layer embeddings
    moe      26B-A4B's experts beside each MLP (8 experts, 3 a token): routed from the unweighted norm times
             router.scale, renormalised, each expert's weight times its per_expert_scale
    google   the multimodal checkpoint (Gemma4ForConditionalGeneration, text weights under
             model.language_model) with config.json as Google writes it (global_head_dim,
             num_global_key_value_heads) instead of per_layer_config

Every layer's layer_scalar is drawn around 1 (transformers initialises it to 1). The engine runs the
shared-KV model with continuous batching, forks (n > 1), the prefix cache and pops (speculation) to the
tokens it gives alone; the KV cache holds pages only for the layers that compute keys and values, each at
its own size."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln import Engine, EngineConfig, SamplingParams
from kiln.runtime.artifact import Artifact
from kiln.runtime.model_runner import ModelRunner
from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
TOL = 1e-4
IDS = np.random.default_rng(8).integers(3, 500, size=30).tolist()     # past the 8-token window
SLIDING, FULL = "sliding_attention", "full_attention"
BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, sliding_window=8, max_position_embeddings=256, final_logit_softcapping=30.0,
            eos_token_id=2, bos_token_id=None, pad_token_id=0, rms_norm_eps=1e-6)
CASES = {
    "e2b": dict(BASE, num_hidden_layers=6, layer_types=[SLIDING, SLIDING, FULL, SLIDING, SLIDING, FULL],
                global_head_dim=32, hidden_size_per_layer_input=16, vocab_size_per_layer_input=512,
                num_kv_shared_layers=3, use_double_wide_mlp=True),
    "k-eq-v": dict(BASE, num_hidden_layers=4, layer_types=[SLIDING, FULL, SLIDING, FULL], global_head_dim=32,
                   num_global_key_value_heads=1, attention_k_eq_v=True, hidden_size_per_layer_input=0,
                   tie_word_embeddings=False),
    "moe": dict(BASE, num_hidden_layers=2, layer_types=[SLIDING, FULL], global_head_dim=32,
                enable_moe_block=True, num_experts=8, top_k_experts=3, moe_intermediate_size=32,
                hidden_size_per_layer_input=0),
    # Gemma 4 unified (gemma4_unified_text: the 12B's language model, no PLE, no experts) as Gemma 4
    "unified": dict(BASE, num_hidden_layers=4, layer_types=[SLIDING, FULL, SLIDING, FULL], global_head_dim=32,
                    num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=1),
    "google": dict(BASE, num_hidden_layers=4, layer_types=[SLIDING, FULL, SLIDING, FULL], global_head_dim=32,
                   num_global_key_value_heads=1, attention_k_eq_v=True, hidden_size_per_layer_input=8,
                   vocab_size_per_layer_input=512, num_kv_shared_layers=1),
}


def write_gemma4(case: str, dest, seed: int = 0):
    """The case's transformers model, widened, saved with a tokenizer (the `google` case as Google's
    multimodal checkpoint and config.json)."""
    text = CASES[case]
    if case == "unified":
        return write_widened("Gemma4UnifiedForCausalLM", "Gemma4UnifiedTextConfig", text, dest, seed)
    if case != "google":
        return write_widened("Gemma4ForCausalLM", "Gemma4TextConfig", text, dest, seed)
    model = write_widened("Gemma4ForConditionalGeneration", "Gemma4Config",
                          dict(text_config=text, vision_config=None, audio_config=None), dest, seed)
    path = dest / "config.json"
    config = json.loads(path.read_text())
    config["text_config"].pop("per_layer_config")
    config["text_config"].update(global_head_dim=32, num_global_key_value_heads=1)
    path.write_text(json.dumps(config))
    return model


@pytest.fixture(scope="module")
def shared_kv(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4")
    ref = write_gemma4("e2b", root / "hf")
    return kiln.compile(str(root / "hf"), target="cpu", quant="q0f32", output=root / "art"), ref


@pytest.mark.parametrize("case", list(CASES))
def test_gemma4_matches_transformers(case, tmp_path, shared_kv):
    if case == "e2b":
        art, ref = shared_kv
    else:
        ref = write_gemma4(case, tmp_path / "hf", seed=1)
        art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, TOL)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()


def test_the_cache_holds_pages_only_for_layers_that_compute_keys(shared_kv):
    layout = Artifact.load(shared_kv[0]).config.kv_cache
    assert layout.owner == "kiln"
    assert layout.layer_kv == ((2, 16), (2, 16), (2, 32), (2, 16), (2, 16), (2, 32))
    assert layout.layer_sources == (0, 1, 2, 1, 1, 2)          # the last sliding and the last global layer
    assert layout.bytes_per_token == 2 * 4 * (2 * 16 + 2 * 16 + 2 * 32)
    runner = ModelRunner(Artifact.load(shared_kv[0]))
    assert [tuple(p.shape[2:]) for p in runner.cache.pages] == [(2, 16, 16), (2, 16, 16), (2, 16, 32)]


def test_engine_batches_forks_caches_prefixes_and_pops(shared_kv):
    art = shared_kv[0]
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 500, size=int(rng.integers(2, 50))).tolist() for _ in range(4)]
    plain = Engine(art, EngineConfig(enable_prefix_cache=False, max_tokens_per_step=24))
    alone = [plain.generate(p, greedy).token_ids for p in prompts]
    engine = Engine(art, EngineConfig(max_tokens_per_step=24))
    assert [o.token_ids for o in engine.generate(prompts, greedy)] == alone
    n = engine.generate(prompts[0], SamplingParams(max_tokens=6, temperature=0.0, n=3, ignore_eos=True))
    assert [o.token_ids for o in n] == [alone[0][:6]] * 3                     # forks of the prompt's pages
    shared = list(range(10, 60))
    first = engine.generate(shared + [5, 6], greedy).token_ids
    hits = engine.scheduler.prefix_cache.hit_tokens
    second = engine.generate(shared + [7, 8, 9], greedy).token_ids
    assert engine.scheduler.prefix_cache.hit_tokens - hits >= 32               # the prefix's pages reused
    assert first == plain.generate(shared + [5, 6], greedy).token_ids
    assert second == plain.generate(shared + [7, 8, 9], greedy).token_ids
    spec = Engine(art, EngineConfig(speculative_tokens=3)).generate(prompts[1], greedy).token_ids
    assert spec == alone[1]


def test_a_fork_mid_page_copies_every_layers_page_at_its_size(shared_kv):
    fresh, runner = ModelRunner(Artifact.load(shared_kv[0])), ModelRunner(Artifact.load(shared_kv[0]))
    prompt = list(range(3, 43))                                                # 2.5 pages of 16
    runner.add_sequence(0)
    runner.prefill([0], [prompt])
    runner.fork_sequence(0, 1, 36)
    got = runner.decode([0, 1], [50, 51])
    for seq, (pos, token) in enumerate(((40, 50), (36, 51))):
        fresh.add_sequence(seq)
        fresh.prefill([seq], [prompt[:pos]])
        np.testing.assert_allclose(got[seq], fresh.decode([seq], [token])[0], atol=2e-5, rtol=0)


def test_q8_gemma4_equals_transformers_on_its_q8_weights(tmp_path):
    """q8f32, the per-layer embedding table and projection quantized too: the artifact's logits equal
    transformers' with every weight kiln quantized replaced by its q8 values (kiln's own packer)."""
    import torch

    from kiln.compiler.quant_modules import QuantFormat
    from kiln.compiler.quant_pack import dequantize, quantize
    from kiln.models.gemma4 import Gemma4Config, weight_map
    ref = write_gemma4("e2b", tmp_path / "hf")
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q8f32", output=tmp_path / "art")
    formats = Artifact.load(art).config.quantization["tensors"]
    assert formats["model.embed_tokens_per_layer.weight"] == formats["model.per_layer_model_projection.weight"] == "q8"
    wmap = weight_map(Gemma4Config.from_hf(json.loads((tmp_path / "hf" / "config.json").read_text())))
    fmt, state = QuantFormat("q8", 32, "float32"), ref.state_dict()
    with torch.no_grad():
        for name in (n for n, kind in formats.items() if kind == "q8"):
            for hf in wmap[name]:
                state[hf].copy_(torch.from_numpy(dequantize(fmt, quantize(fmt, state[hf].numpy()))))
    assert_prefill_and_decode_match(art, ref, IDS, TOL)


def test_gemma4_builds_for_cuda(tmp_path, shared_kv):
    """q4f16 for an H100: the KV cache kiln owns, its attention kernels built per layer shape (16- and
    32-wide heads, 2 KV heads each), nvcc compiles the library. The kernels' numerics are the owned
    cache's GPU kernel, checked against numpy by tests/numerics/test_owned_kv_kernel.py."""
    write_gemma4("e2b", tmp_path / "hf")
    art = kiln.compile(str(tmp_path / "hf"), target="cuda-sm90", quant="q4f16", output=tmp_path / "art",
                       golden=False)
    config = Artifact.load(art).config
    assert config.kv_cache.layer_sources == (0, 1, 2, 1, 1, 2) and config.kv_cache.dtype == "float16"


@pytest.mark.parametrize("change, message", [
    (dict(enable_moe_block=True, num_experts=4, top_k_experts=None, moe_intermediate_size=32), "top_k_experts"),
    (dict(num_kv_shared_layers=6), "num_kv_shared_layers 6 must leave"),
    (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0},
                           "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
     "full_attention type 'yarn'"),
])
def test_gemma4_configs_kiln_cannot_run_are_refused_by_name(tmp_path, change, message):
    from kiln.models.gemma4 import Gemma4Config
    config = dict(CASES["e2b"], model_type="gemma4_text", **change)
    with pytest.raises(ValueError, match=message):
        Gemma4Config.from_hf(config)
