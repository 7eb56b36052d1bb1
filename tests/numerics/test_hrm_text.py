"""HRM-Text (models/hrm_text.py): its two weight-shared stacks run in H / L cycles, every run of a layer at its own
cache slots, q0f32 on the CPU gives transformers' HrmTextForCausalLM logits (every prefill position, the last-token
prefill, decode steps) and passes `kiln check`; as transformers writes config.json (num_hidden_layers the cache's
slots beside num_layers_per_stack) and as an older one (num_hidden_layers the stack's, no num_layers_per_stack),
with its embedding_scale default (1 / initializer_range)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tiny_models import compiles_to_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(10).integers(0, 500, size=19).tolist()
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              head_dim=16, H_cycles=2, L_cycles=2, eos_token_id=2, bos_token_id=1, initializer_range=0.5)


def write_hrm(dest):
    """The test's model (its low state's start random: zeros at init), saved by transformers; returned."""
    ref = write_widened("HrmTextForCausalLM", "HrmTextConfig", CONFIG, dest)
    with torch.no_grad():
        ref.model.z_L_init.normal_(0.0, 0.5)
    ref.save_pretrained(dest)
    return ref


@pytest.mark.parametrize("form", ["transformers", "per-stack count"])
def test_hrm_text_matches_transformers(form, tmp_path):
    ref = write_hrm(tmp_path / "hf")
    if form == "per-stack count":
        path = tmp_path / "hf" / "config.json"
        config = json.loads(path.read_text())
        assert config["num_hidden_layers"] == 2 * 2 * (2 + 1)           # the cache's slots, as transformers writes
        config = {k: v for k, v in config.items() if k not in ("num_layers_per_stack", "embedding_scale")}
        path.write_text(json.dumps(dict(config, num_hidden_layers=2)))
    config = compiles_to_match(tmp_path / "hf", ref, tmp_path / "art", IDS, 1e-4)
    assert any("prefix-LM attention" in n for n in config.notes)
    assert config.model.config["num_hidden_layers"] == 12 and config.model.config["embedding_scale"] == 2.0
