"""LFM2 (models/lfm2.py) against transformers: a tiny random-init model of conv and attention layers, compiled
q0f32 for the CPU, gives transformers' logits within 1e-4 (every prefill position, the last-token prefill, 5 greedy
decode steps, each conv reading the tokens before it from the KV cache kiln owns) and passes `kiln check`; the
engine's chunked prefill, forks, prefix hits and speculation's pops give the tokens a plain run gives; the conv
kernel's GPU form builds for CUDA."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import Engine, EngineConfig, SamplingParams
from kiln.runtime.artifact import Artifact
from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256,
              layer_types=["conv", "full_attention", "conv", "full_attention"], block_multiple_of=32, eos_token_id=2,
              bos_token_id=None, pad_token_id=0, norm_eps=1e-5)
IDS = np.random.default_rng(8).integers(3, 500, size=30).tolist()


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory):
    root = tmp_path_factory.mktemp("lfm2")
    ref = write_widened("Lfm2ForCausalLM", "Lfm2Config", CONFIG, root / "hf", seed=1)
    return kiln.compile(str(root / "hf"), target="cpu", quant="q0f32", output=root / "art"), ref, root


def test_lfm2_matches_transformers(lfm2):
    art, ref, _ = lfm2
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
    layout = Artifact.load(art).config.kv_cache
    assert layout.layer_kv == ((1, 32), (2, 16), (1, 32), (2, 16))      # a conv layer's input as one head's halves


def test_engine_chunks_forks_caches_prefixes_and_pops(lfm2):
    art = lfm2[0]
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(3, 500, size=int(rng.integers(2, 60))).tolist() for _ in range(4)]
    plain = Engine(art, EngineConfig(enable_prefix_cache=False))
    alone = [plain.generate(p, greedy).token_ids for p in prompts]
    engine = Engine(art, EngineConfig(max_tokens_per_step=16))                # prompts cut into chunks
    assert [o.token_ids for o in engine.generate(prompts, greedy)] == alone
    n = engine.generate(prompts[0], SamplingParams(max_tokens=6, temperature=0.0, n=3, ignore_eos=True))
    assert [o.token_ids for o in n] == [alone[0][:6]] * 3
    shared = list(range(10, 60))
    first = engine.generate(shared + [5, 6], greedy).token_ids
    hits = engine.scheduler.prefix_cache.hit_tokens
    second = engine.generate(shared + [7, 8, 9], greedy).token_ids
    assert engine.scheduler.prefix_cache.hit_tokens - hits >= 32
    assert first == plain.generate(shared + [5, 6], greedy).token_ids
    assert second == plain.generate(shared + [7, 8, 9], greedy).token_ids
    spec = Engine(art, EngineConfig(speculative_tokens=3)).generate(prompts[1], greedy).token_ids
    assert spec == alone[1]


def test_lfm2_builds_for_cuda(lfm2):
    art = kiln.compile(str(lfm2[2] / "hf"), target="cuda-sm90", quant="q4f16", output=lfm2[2] / "cuda", golden=False)
    assert Artifact.load(art).config.kv_cache.owner == "kiln"


def test_lfm2_with_a_conv_bias_is_refused():
    from kiln.models.lfm2 import Lfm2Config
    with pytest.raises(ValueError, match="conv_bias is not supported"):
        Lfm2Config.from_hf(dict(CONFIG, model_type="lfm2", conv_bias=True))


def test_lfm2_gguf_matches_transformers(lfm2, tmp_path):
    """As llama.cpp's converter writes it (tests/gguf_writer.py: a KV head count a layer, 0 for the conv layers,
    the MLP's adjusted width, the conv weight squeezed to 2-D under blk.N.shortconv.conv): read back into the model
    it came from, Q8_0 kept exactly."""
    from gguf_writer import write_gguf
    from kiln.models.gguf import load_gguf
    _, ref, root = lfm2
    path = write_gguf(root / "hf", tmp_path / "lfm2.gguf")
    config = load_gguf(path).hf_config
    assert config["layer_types"] == CONFIG["layer_types"] and not config["block_auto_adjust_ff_dim"]
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
    q8 = write_gguf(root / "hf", tmp_path / "lfm2-q8.gguf", default="Q8_0")
    art = kiln.compile(str(q8), target="cpu", quant="auto", output=tmp_path / "q8")
    report = kiln.check(art)
    assert report.ok and max(p.max_logit_error for p in report.prompts) < 1e-3, report.table()


def test_lfm2_moe_matches_transformers(tmp_path):
    """LFM2-MoE: the first layer's MLP dense, the rest 8 experts (3 a token) chosen by sigmoid scores plus a bias,
    renormalised with its 1e-6 and scaled."""
    moe = dict(CONFIG, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, num_dense_layers=1,
               routed_scaling_factor=2.5, intermediate_size=96)
    ref = write_widened("Lfm2MoeForCausalLM", "Lfm2MoeConfig", moe, tmp_path / "hf", seed=2)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()


def test_lfm2_moe_gguf_matches_transformers(tmp_path):
    """An lfm2moe GGUF as llama.cpp's converter writes it (the experts stacked, the choice bias as exp_probs_b, the
    leading dense layers counted; released models' routed_scaling_factor 1, which it does not write): transformers'
    logits."""
    from gguf_writer import write_gguf
    moe = dict(CONFIG, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, num_dense_layers=1,
               intermediate_size=96)
    ref = write_widened("Lfm2MoeForCausalLM", "Lfm2MoeConfig", moe, tmp_path / "hf", seed=3)
    path = write_gguf(tmp_path / "hf", tmp_path / "lfm2moe.gguf")
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)


def test_lfm3_matches_transformers(tmp_path):
    """LFM3: conv layers of 7 taps, sliding attention layers past their 8-token window and a full one with
    proportional RoPE (half of each head rotated), norms on the operator's and MLP's outputs, a sigmoid gate a head,
    q/k/v/o biases."""
    lfm3 = dict(CONFIG, num_hidden_layers=5, head_dim=16, sliding_window=8, conv_L_cache=7, attention_bias=True,
                layer_types=["conv", "sliding_attention", "full_attention", "conv", "sliding_attention"],
                intermediate_size=96)
    ref = write_widened("Lfm3ForCausalLM", "Lfm3Config", lfm3, tmp_path / "hf", seed=3)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
