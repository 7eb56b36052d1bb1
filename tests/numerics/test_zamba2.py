"""Zyphra's Zamba 2 (models/zamba2.py) against transformers: tiny random-init models compiled q0f32 for the CPU give
transformers' logits within 1e-4 (every prefill position, the last-token prefill, greedy decode steps): Mamba-2
layers, and hybrid layers whose shared transformer blocks (two, taking turns over three hybrid layers) read the
layer's input beside the embeddings, each with its own LoRA adapters (q/k/v's and gate_up's) folded in at load;
with RoPE (1.2B's) and without (2.7B's); the engine's chunked prefill, batches, n > 1 and prefix caching of the
recurrent state give a plain run's tokens."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.runtime.artifact import Artifact
from tiny_models import assert_prefill_and_decode_match, assert_recurrent_engine, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
IDS = np.random.default_rng(9).integers(3, 500, size=24).tolist()
ZAMBA2 = dict(vocab_size=512, hidden_size=64, num_hidden_layers=6, intermediate_size=96, num_attention_heads=4,
              num_key_value_heads=4, mamba_d_state=16, n_mamba_heads=4, mamba_ngroups=2, num_mem_blocks=2,
              layers_block_type=["mamba", "hybrid", "mamba", "hybrid", "mamba", "hybrid"], adapter_rank=8,
              max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
CASES = {
    "rope-adapters": dict(ZAMBA2, use_mem_rope=True, use_shared_attention_adapter=True),
    "nope": dict(ZAMBA2, use_mem_rope=False, use_shared_attention_adapter=False, num_mem_blocks=1,
                 tie_word_embeddings=False),
}


@pytest.fixture(scope="module")
def zamba2(tmp_path_factory):
    root = tmp_path_factory.mktemp("zamba2")
    ref = write_widened("Zamba2ForCausalLM", "Zamba2Config", CASES["rope-adapters"], root / "hf", seed=3)
    return kiln.compile(str(root / "hf"), target="cpu", quant="q0f32", output=root / "art"), ref


def test_zamba2_matches_transformers(zamba2):
    art, ref = zamba2
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
    layout = Artifact.load(art).config.kv_cache
    # cache layers: the 3 hybrid layers' keys and values, then each of the 6 layers' conv inputs (128 inner + 2 groups
    # x 2 x 16 state channels, 3 kept) and scan state [4 heads, 16 state, 32 head dim]
    assert layout.num_layers == 9 and layout.states == [(192, 3), (4, 16, 32)] * 6 and layout.head_dim == 32


def test_zamba2_without_rope_or_attention_adapters(tmp_path):
    ref = write_widened("Zamba2ForCausalLM", "Zamba2Config", CASES["nope"], tmp_path / "hf", seed=4)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)


def test_engine_chunks_batches_forks_and_continues_turns(zamba2):
    assert_recurrent_engine(zamba2[0])
