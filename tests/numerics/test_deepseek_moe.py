"""DeepSeek-MoE (deepseek: its own code's DeepseekForCausalLM, deepseek-moe-16b) reads as DeepSeek-OCR 2's language
model, which took its layers: q0f32 on the CPU gives transformers' DeepSeek-OCR 2 class's logits on a text prompt for
the same language model (transformers has no DeepSeek-MoE class); its settings kiln does not run are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import kiln
from kiln.models import ModelLoadError, build, load
from test_vision_text import deepseek_ocr_case
from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(10).integers(0, 500, size=19).tolist()


def deepseek_moe_case() -> tuple[str, str, dict]:
    """DeepSeek-OCR 2's class with DeepSeek-MoE's routing: greedy, no routed scale."""
    cls, config_cls, cfg = deepseek_ocr_case()
    return cls, config_cls, dict(cfg, text_config=dict(cfg["text_config"], routed_scaling_factor=1.0))


def write_deepseek_moe(hf):
    """deepseek_moe_case's model (seed 1) as DeepSeek-MoE's checkpoints lay it out: its config (model_type deepseek,
    the dense layers as first_k_dense_replace), the language model's tensors alone under their own names."""
    write_widened(*deepseek_moe_case(), hf, seed=1)
    path = hf / "config.json"
    text = json.loads(path.read_text())["text_config"]
    dense = text.pop("mlp_layer_types").count("dense")
    for key in ("n_group", "topk_group", "topk_method", "routed_scaling_factor", "head_dim"):
        text.pop(key)
    path.write_text(json.dumps(dict(text, architectures=["DeepseekForCausalLM"], model_type="deepseek",
                                    first_k_dense_replace=dense, moe_layer_freq=1, scoring_func="softmax",
                                    norm_topk_prob=False)))
    weights = hf / "model.safetensors"
    tensors = load_file(str(weights))
    save_file({n: t for n, t in tensors.items() if n.split(".")[1] in ("embed_tokens", "layers", "norm", "weight")},
              str(weights), metadata={"format": "pt"})


def test_deepseek_moe_matches_its_layers_in_transformers(tmp_path):
    write_deepseek_moe(tmp_path / "hf")
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, write_widened(*deepseek_moe_case(), tmp_path / "ref", seed=1), IDS, 1e-4)


@pytest.mark.parametrize("change", [dict(norm_topk_prob=True), dict(moe_layer_freq=2), dict(scoring_func="sigmoid")])
def test_deepseek_moe_settings_kiln_does_not_run_are_refused(change, tmp_path):
    write_deepseek_moe(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), **change)))
    key, value = next(iter(change.items()))
    with pytest.raises(ModelLoadError, match=f"deepseek with {key} {value!r} is not supported"):
        build(load(tmp_path / "hf"))
