"""GPT-NeoX-Japanese (models/gpt_neox.py GPTNeoXJapaneseConfig): GPT-NeoX's layers one after the other, no biases
but the last layer's attention-output dense_bias, q/k/v fused per head, the MLP intermediate_multiple_size times the
width, the head tied. q0f32 on the CPU gives transformers' GPTNeoXJapaneseForCausalLM logits (every prefill
position, the last-token prefill, decode steps) and passes `kiln check`; with partial rotary too."""

from __future__ import annotations

import numpy as np
import pytest

from tiny_models import compiles_to_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(13).integers(0, 500, size=17).tolist()
CONFIG = dict(vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_multiple_size=2,
              layer_norm_eps=1e-5, attention_dropout=0.0, eos_token_id=2, bos_token_id=1)


@pytest.mark.parametrize("rope", [{}, {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                            "partial_rotary_factor": 0.5}}], ids=["whole", "partial"])
def test_gpt_neox_japanese_matches_transformers(rope, tmp_path):
    ref = write_widened("GPTNeoXJapaneseForCausalLM", "GPTNeoXJapaneseConfig", dict(CONFIG, **rope), tmp_path / "hf",
                        seed=2)
    config = compiles_to_match(tmp_path / "hf", ref, tmp_path / "art", IDS, 1e-4)
    assert config.model.arch == "gpt_neox_japanese" and config.model.config["intermediate_size"] == 128
