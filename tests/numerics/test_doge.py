"""Doge (models/doge.py): dynamic mask attention (a bias a key and KV head from its values, carried in the cache's
extra key dims), q/k norms a head, learned residual scales. q0f32 on the CPU gives transformers' DogeForCausalLM
logits (every prefill position, the last-token prefill, decode steps) and passes `kiln check`; its context is capped at
keep_window_size (past it Doge masks by the bias's top keys), and its MoE and sliding window are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kiln.models import ModelLoadError, build, load
from tiny_models import compiles_to_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(12).integers(0, 500, size=19).tolist()
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, keep_window_size=128, eos_token_id=2,
              bos_token_id=1)


def write_doge(dest, **more):
    """The test's Doge, its A and residual scales random (zeros and ones at init) and its bias large enough to move
    the logits."""
    ref = write_widened("DogeForCausalLM", "DogeConfig", dict(CONFIG, **more), dest, seed=4)
    with torch.no_grad():
        for layer in ref.model.layers:
            layer.self_attn.A.normal_(0.0, 1.0)
            layer.input_residual.normal_(1.0, 0.3)
            layer.post_attention_residual.normal_(1.0, 0.3)
    ref.save_pretrained(dest)
    return ref


@pytest.mark.parametrize("bias", [False, True])
def test_doge_matches_transformers(bias, tmp_path):
    ref = write_doge(tmp_path / "hf", attention_bias=bias)
    config = compiles_to_match(tmp_path / "hf", ref, tmp_path / "art", IDS, 1e-4)
    assert config.model.arch == "doge" and config.model.config["context_window_size"] == 128
    assert any("capped at keep_window_size (128 tokens)" in n for n in config.notes)


@pytest.mark.parametrize("change, message", [
    (dict(is_moe=True), "Doge with is_moe .* not supported yet"),
    (dict(sliding_window=64), "Doge with sliding_window 64 is not supported yet"),
])
def test_doge_configs_kiln_cannot_run_are_refused(change, message, tmp_path):
    write_widened("DogeForCausalLM", "DogeConfig", CONFIG, tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), **change)))
    with pytest.raises(ModelLoadError, match=message):
        build(load(tmp_path / "hf"))
