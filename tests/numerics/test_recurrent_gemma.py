"""Google's RecurrentGemma (models/recurrent_gemma.py) against transformers: a tiny random-init model compiled q0f32
for the CPU gives transformers' logits within 1e-4 (every prefill position, the last-token prefill, greedy decode
steps past the attention window): RG-LRU blocks (block-diagonal gates, the conv and the recurrence's state in the
layer's slot of the KV cache kiln owns, position 0's unscaled input), local attention (one kv head, RoPE on half
of each head, a biased output), biased gelu MLPs of half intermediate_size, (1 + w) norms, the embeddings times
sqrt(hidden) rounded to bfloat16 (80: 8.9375, not 8.944) and soft-capped logits; the engine's chunked prefill,
batches, n > 1 and prefix caching of the recurrent state give a plain run's tokens."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from tiny_models import assert_prefill_and_decode_match, assert_recurrent_engine, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
IDS = np.random.default_rng(10).integers(3, 500, size=19).tolist()
CONFIG = dict(vocab_size=512, hidden_size=80, intermediate_size=96, num_hidden_layers=4, num_attention_heads=5,
              num_key_value_heads=1, attention_window_size=20, conv1d_width=4, logits_soft_cap=3.0,
              block_types=["recurrent", "recurrent", "attention"], max_position_embeddings=256, pad_token_id=0,
              eos_token_id=1, bos_token_id=2)


@pytest.fixture(scope="module")
def recurrent_gemma(tmp_path_factory):
    root = tmp_path_factory.mktemp("recurrent-gemma")
    ref = write_widened("RecurrentGemmaForCausalLM", "RecurrentGemmaConfig", CONFIG, root / "hf", seed=5)
    return kiln.compile(str(root / "hf"), target="cpu", quant="q0f32", output=root / "art"), ref


def test_recurrent_gemma_matches_transformers(recurrent_gemma):
    art, ref = recurrent_gemma
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4, steps=8)         # 27 tokens: past the 20-token window
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()


def test_engine_chunks_batches_forks_and_continues_turns(recurrent_gemma):
    """(past the 20-token window: prompts up to 60 tokens, a 70-token shared start)"""
    assert_recurrent_engine(recurrent_gemma[0])
