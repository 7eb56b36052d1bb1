"""Qwen3.5 (models/qwen3_5.py) against transformers: a tiny random-init model of gated DeltaNet and gated attention
layers, compiled q0f32 for the CPU, gives transformers' logits within 1e-4 (every prefill position, the last-token
prefill, greedy decode steps, each DeltaNet layer's state carried in its slot of the KV cache kiln owns); the engine's
chunked prefill, batches and n > 1 give the tokens a plain run gives, with prefix sharing and speculation refused
for its recurrent state; the MoE variant and the multimodal checkpoint's text read; the kernels build for CUDA."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import Engine, EngineConfig, SamplingParams
from kiln.runtime.artifact import Artifact
from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8,
              linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=256, eos_token_id=2,
              bos_token_id=None, pad_token_id=0, rms_norm_eps=1e-6, tie_word_embeddings=False)
IDS = np.random.default_rng(8).integers(3, 500, size=30).tolist()


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen35")
    ref = write_widened("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", CONFIG, root / "hf", seed=1)
    return kiln.compile(str(root / "hf"), target="cpu", quant="q0f32", output=root / "art"), ref, root


def test_qwen35_matches_transformers(qwen35):
    art, ref, _ = qwen35
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    layout = Artifact.load(art).config.kv_cache
    assert layout.owners == [3] and layout.states == [(64, 3), (4, 8, 8)] * 3
    assert layout.rewind_problem() and "state_slots" in layout.tables


def test_engine_chunks_batches_and_forks_without_sharing(qwen35):
    art = qwen35[0]
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(3, 500, size=int(rng.integers(2, 60))).tolist() for _ in range(4)]
    plain = Engine(art)
    alone = [plain.generate(p, greedy).token_ids for p in prompts]
    engine = Engine(art, EngineConfig(max_tokens_per_step=16))                # prompts cut into chunks, batched
    assert engine.scheduler.prefix_cache is None and not engine.runner.shares_kv
    assert [o.token_ids for o in engine.generate(prompts, greedy)] == alone
    n = engine.generate(prompts[0], SamplingParams(max_tokens=6, temperature=0.0, n=3, ignore_eos=True))
    assert [o.token_ids for o in n] == [alone[0][:6]] * 3
    again = [engine.generate(p, greedy).token_ids for p in prompts[:2]]       # slots freed and reused
    assert again == alone[:2]
    with pytest.raises(ValueError, match="recurrent layers"):
        Engine(art, EngineConfig(speculative_tokens=3))


def test_qwen35_moe_and_the_multimodal_checkpoint(tmp_path):
    moe = dict(CONFIG, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               shared_expert_intermediate_size=48)
    moe.pop("intermediate_size")
    ref = write_widened("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", moe, tmp_path / "moe", seed=2)
    art = kiln.compile(str(tmp_path / "moe"), target="cpu", quant="q0f32", output=tmp_path / "moe-art")
    assert_prefill_and_decode_match(art, ref, IDS[:12], 1e-4)
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64)
    ref = write_widened("Qwen3_5ForConditionalGeneration", "Qwen3_5Config",
                        dict(text_config=CONFIG, vision_config=vision), tmp_path / "vl", seed=3)
    art = kiln.compile(str(tmp_path / "vl"), target="cpu", quant="q0f32", output=tmp_path / "vl-art")
    assert Artifact.load(art).config.model.config["weight_prefix"] == "model.language_model"
    # transformers runs a whole sequence through the chunked delta rule (a triangular solve a chunk), kiln
    # token by token: float32 apart by up to 1.4e-4 on this seed's logits (about 2 in size)
    assert_prefill_and_decode_match(art, ref, IDS[:12], 2e-4)


def test_qwen35_builds_for_cuda(qwen35):
    art = kiln.compile(str(qwen35[2] / "hf"), target="cuda-sm90", quant="q4f16", output=qwen35[2] / "cuda",
                       golden=False)
    assert Artifact.load(art).config.kv_cache.states
