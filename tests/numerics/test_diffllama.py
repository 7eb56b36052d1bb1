"""DiffLlama (models/diffllama.py): differential attention, run as one grouped attention over paired heads' values
(v_proj's rows laid out at load, q and k padded to the cache's 2 head_dim) and each head pair's difference, normed
and scaled. q0f32 on the CPU gives transformers' DiffLlamaForCausalLM logits (every prefill position, the last-token
prefill, decode steps) and passes `kiln check`; with grouped KV heads and biases too."""

from __future__ import annotations

import numpy as np
import pytest

from tiny_models import compiles_to_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(12).integers(0, 500, size=19).tolist()
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=4, head_dim=16, rms_norm_eps=0.05, eos_token_id=2, bos_token_id=1)


@pytest.mark.parametrize("extra", [{}, dict(num_attention_heads=8, num_key_value_heads=2, attention_bias=True)],
                         ids=["mha", "grouped-biased"])
def test_diffllama_matches_transformers(extra, tmp_path):
    ref = write_widened("DiffLlamaForCausalLM", "DiffLlamaConfig", dict(CONFIG, **extra), tmp_path / "hf", seed=6)
    config = compiles_to_match(tmp_path / "hf", ref, tmp_path / "art", IDS, 1e-4)
    assert config.model.arch == "diffllama" and config.model.config["head_dim"] == 32
