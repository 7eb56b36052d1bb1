"""JetMoE (models/jetmoe.py): attention and MLP both mixtures of experts. q0f32 on the CPU gives transformers'
JetMoeForCausalLM logits (every prefill position, the last-token prefill, decode steps) and passes `kiln check`:
each token's experts' queries as grouped heads over the shared keys and values, the experts' output projections
weighed by the router, both mixtures' biases, the layers' norms at epsilon 1e-6 beside the last norm's rms_norm_eps;
with the head tied (the default) and untied."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.models import ModelLoadError, load
from tiny_models import compiles_to_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(11).integers(0, 500, size=19).tolist()
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_key_value_heads=2,
              kv_channels=16, num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=0.05, eos_token_id=2,
              bos_token_id=1)


@pytest.mark.parametrize("tied", [True, False])
def test_jetmoe_matches_transformers(tied, tmp_path):
    ref = write_widened("JetMoeForCausalLM", "JetMoeConfig", dict(CONFIG, tie_word_embeddings=tied), tmp_path / "hf",
                        seed=3)
    config = compiles_to_match(tmp_path / "hf", ref, tmp_path / "art", IDS, 1e-4)
    assert config.model.arch == "jetmoe" and config.model.config["num_attention_heads"] == 4


def test_jetmoe_with_more_experts_a_token_than_it_has_is_refused(tmp_path):
    write_widened("JetMoeForCausalLM", "JetMoeConfig", CONFIG, tmp_path / "hf")
    import json
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), num_experts_per_tok=5)))
    with pytest.raises(ModelLoadError, match=r"num_experts_per_tok \(5\) must be from 1 to the number of experts"):
        from kiln.models import build
        build(load(tmp_path / "hf"))
