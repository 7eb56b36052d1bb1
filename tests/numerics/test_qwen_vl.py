"""models/qwen_vl.py: the text models of Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE checkpoints, compiled
q0f32 for the CPU, give transformers' vision-language classes' logits on a text prompt (every prefill position, the
last-token prefill, 5 decode steps) within 1e-4 and pass `kiln check`, with a note that the vision tower is not
read; so does Qwen2.5-VL's config.json as released (flat, M-RoPE as rope_scaling type "mrope") and Qwen3-VL-MoE's
experts as released ([experts, in, out], transposed); experts of neither shape are refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import kiln
from kiln.models.qwen_vl import TEXT_ONLY
from tiny_models import compiles_to_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
TOL = 1e-4
IDS = np.random.default_rng(9).integers(0, 512, size=19).tolist()
TEXT = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=1)
VISION = dict(depth=1, hidden_size=32, num_heads=2, embed_dim=32, out_hidden_size=64, intermediate_size=32)
MROPE = dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])         # head_dim 16: 8 pairs
QWEN3 = dict(TEXT, head_dim=16, rope_parameters=dict(MROPE, mrope_interleaved=True))
MOE = dict(QWEN3, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24)       # 2 x 24 != 64: no square

CASES = {
    "qwen2-vl": ("Qwen2VLForConditionalGeneration", "Qwen2VLConfig", dict(TEXT, rope_parameters=MROPE)),
    "qwen2.5-vl": ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig", dict(TEXT, rope_parameters=MROPE)),
    "qwen3-vl": ("Qwen3VLForConditionalGeneration", "Qwen3VLConfig", QWEN3),
    "qwen3-vl-moe": ("Qwen3VLMoeForConditionalGeneration", "Qwen3VLMoeConfig", MOE),
}


def _write(case: str, dest, seed: int = 0, tie: bool = False):
    model_cls, config_cls, text = CASES[case]
    return write_widened(model_cls, config_cls, dict(text_config=text, vision_config=VISION, tie_word_embeddings=tie),
                         dest, seed)


def _compiles_to(src, ref, dest):
    return compiles_to_match(src, ref, dest, IDS, TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_the_text_model_matches_transformers_vl_class(case, tmp_path):
    ref = _write(case, tmp_path / "hf", tie=case == "qwen3-vl")
    config = _compiles_to(tmp_path / "hf", ref, tmp_path / "art")
    assert TEXT_ONLY in config.notes
    assert config.model.config["weight_prefix"] == ("model" if case.startswith("qwen2") else "model.language_model")


def test_qwen25_vl_config_as_released(tmp_path):
    """The released Qwen2.5-VL config.json: the text fields flat, M-RoPE as rope_scaling {type: mrope}."""
    ref = _write("qwen2.5-vl", tmp_path / "hf", seed=1)
    path = tmp_path / "hf" / "config.json"
    cfg = json.loads(path.read_text())
    text = {k: v for k, v in cfg.pop("text_config").items() if k not in ("rope_parameters", "model_type")}
    flat = dict(cfg, **text, rope_theta=MROPE["rope_theta"],
                rope_scaling={"type": "mrope", "mrope_section": MROPE["mrope_section"]})
    path.write_text(json.dumps(flat))
    _compiles_to(tmp_path / "hf", ref, tmp_path / "art")


def test_qwen3_vl_moe_experts_as_released_and_a_misshapen_one(tmp_path):
    """Released Qwen3-VL-MoE checkpoints hold each layer's experts as [experts, hidden, 2 x width] and [experts,
    width, hidden] (transformers transposes them as it loads): the same logits; an experts tensor of neither
    layout is refused naming it."""
    ref = _write("qwen3-vl-moe", tmp_path / "hf", seed=2)
    path = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(str(path))
    experts = [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert len(experts) == 4 and all(tensors[n].ndim == 3 for n in experts)
    save_file({n: np.ascontiguousarray(t.transpose(0, 2, 1)) if n in experts else t for n, t in tensors.items()},
              str(path), metadata={"format": "pt"})
    _compiles_to(tmp_path / "hf", ref, tmp_path / "art")
    name = experts[0]
    save_file({**tensors, name: tensors[name][:, :-1]}, str(path), metadata={"format": "pt"})
    with pytest.raises(Exception, match=f"{name} is .*the checkpoint does not match its config.json"):
        kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "bad")
