"""ZAYA1 (models/zaya.py): compressed convolutional attention and top-1 MoE layers with a router MLP. q0f32 on the
CPU gives transformers' ZayaForCausalLM logits (every prefill position, the last-token prefill, decode steps) and
passes `kiln check`: the convs over each token's window of raw q/k projections (kept between forwards as a
recurrent state), the delayed value half, the residual paths and L2 norms, the per-type RoPE (full and sliding
layers), the router MLP carrying each layer's router input to the next, the skip expert and the residual scales.
The engine runs it as the other models with a recurrent state: chunked prefill, batches, forks at a sequence's end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kiln.models import ModelLoadError, build, load
from tiny_models import assert_recurrent_engine, compiles_to_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(5).integers(0, 500, size=21).tolist()
CONFIG = dict(vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, moe_intermediate_size=32, num_experts=4, router_hidden_size=32, rms_norm_eps=0.05,
              layer_types=["hybrid", "hybrid_sliding", "hybrid"], sliding_window=8, eos_token_id=2, bos_token_id=1,
              rope_parameters={"hybrid": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5},
                               "hybrid_sliding": {"rope_type": "default", "rope_theta": 1e4,
                                                  "partial_rotary_factor": 1.0}})


@pytest.mark.parametrize("variant", ["released", "biased-wider-convs"])
def test_zaya_matches_transformers(variant, tmp_path):
    cfg = dict(CONFIG, tie_word_embeddings=False, attention_bias=True, cca_time0=3, cca_time1=2) \
        if variant != "released" else CONFIG
    ref = write_widened("ZayaForCausalLM", "ZayaConfig", cfg, tmp_path / "hf", seed=4)
    with torch.no_grad():
        for layer in ref.model.layers:      # routers sharp enough to pick differently by token; the skip's bias -1
            gate = layer.mlp.gate           # (as transformers loads it)
            for linear in (gate.router_mlp.fc1, gate.router_mlp.fc2, gate.router_mlp.out_proj):
                linear.weight.mul_(5.0)
            gate.balancing_biases[-1] = -1.0
        gate = ref.model.layers[1].mlp.gate     # layer 1 picks its best probability, the skip's (damped) too
        gate.balancing_biases.fill_(-1.0)
        gate.router_mlp.out_proj.weight[-1] *= 0.3
    ref.save_pretrained(tmp_path / "hf")
    picks = []
    hook = gate.register_forward_hook(lambda m, args, out: picks.append(
        (out[0].softmax(-1) + m.balancing_biases).argmax(-1).tolist()))
    ref(torch.tensor([IDS]))
    hook.remove()
    if variant == "released":       # some tokens skip, some take an expert
        assert 0 < picks[0].count(cfg["num_experts"]) < len(IDS), picks
    config = compiles_to_match(tmp_path / "hf", ref, tmp_path / "art", IDS, 1e-4)
    assert config.model.arch == "zaya"
    if variant == "released":
        assert_recurrent_engine(tmp_path / "art")


def test_zaya_refusals(tmp_path):
    write_widened("ZayaForCausalLM", "ZayaConfig", CONFIG, tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    saved = json.loads(path.read_text())
    for change, message in (({"num_experts_per_tok": 2}, "num_experts_per_tok 2 is not supported"),
                            ({"lm_head_bias": True}, "lm_head_bias true is not supported"),
                            ({"layer_types": ["hybrid", "mamba", "hybrid"]}, "layer_types must give each")):
        path.write_text(json.dumps(dict(saved, **change)))
        with pytest.raises(ModelLoadError, match=message):
            build(load(tmp_path / "hf"))
