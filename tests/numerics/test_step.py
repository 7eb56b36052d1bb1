"""StepFun's Step 3.5 / 3.7 language model against transformers' Step3p7ForConditionalGeneration on a text prompt:
sliding layers of their own head count, RoPE by layer kind (half of each head on the full ones), Gemma's norms, the
softmax scaled by query_pre_attn_scalar, a sigmoid gate a head, DeepSeek-V3's router with a shared expert, dense
first layers, clamped SwiGLUs; as transformers saves it (the vision wrapper) and as Step-3.5-Flash's config.json
says it (Step3p5ForCausalLM's names)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln.runtime import Artifact

from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics

QUICK_LLVM = True
TOL = 1e-4
IDS = np.random.default_rng(13).integers(0, 512, size=21).tolist()
LAYERS = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
TEXT = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, moe_intermediate_size=32,
            n_routed_experts=8, num_experts_per_tok=3, share_expert_dim=48, layer_types=LAYERS, sliding_window=8,
            num_sliding_attention_heads=8, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
            query_pre_attn_scalar=24, moe_router_scaling_factor=1.5, swiglu_limits=[0.0, 0.0, 0.0, 0.7],
            swiglu_limits_shared=[0.0, 0.0, 0.5, 0.0], eos_token_id=2,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 50000.0,
                                                "partial_rotary_factor": 0.5},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
VISION = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


def _released(config: dict) -> dict:
    """Step-3.5-Flash's config.json for the same text model (Step3p5ForCausalLM): its lists padded with an MTP layer,
    the sliding layers' heads in attention_other_setting, RoPE as rope_theta and partial_rotary_factors lists."""
    t = config["text_config"]
    drop = ("layer_types", "mlp_layer_types", "num_sliding_attention_heads", "rope_parameters", "n_routed_experts",
            "num_experts_per_tok", "num_key_value_heads", "per_layer_config", "swiglu_limits", "swiglu_limits_shared")
    return {**{k: v for k, v in t.items() if k not in drop},
            "architectures": ["Step3p5ForCausalLM"], "model_type": "step3p5", "num_nextn_predict_layers": 1,
            "layer_types": LAYERS + ["full_attention"], "num_attention_groups": 2,
            "attention_other_setting": {"attention_type": "sliding_attention", "num_attention_heads": 8,
                                        "num_attention_groups": 2},
            "rope_theta": [50000.0, 10000.0, 10000.0, 50000.0, 50000.0],
            "partial_rotary_factors": [0.5, 1.0, 1.0, 0.5, 0.5], "moe_layers_enum": "1,2,3,4", "moe_num_experts": 8,
            "moe_top_k": 3, "norm_expert_weight": True, "swiglu_limits": [0.0, 0.0, 0.0, 0.7, 0.0],
            "swiglu_limits_shared": [0.0, 0.0, 0.5, 0.0, 0.0]}


# llama.cpp's converter and step35 graph (tests/numerics/test_gguf_converter.py) scale the softmax by the head size
CONVERTER_TEXT = dict(TEXT, query_pre_attn_scalar=16)


def write_released(dest, text: dict = TEXT):
    """The model saved by transformers, its config.json as Step-3.5-Flash's; the model returned (the reference)."""
    ref = write_widened("Step3p7ForConditionalGeneration", "Step3p7Config",
                        dict(text_config=text, vision_config=VISION), dest)
    path = dest / "config.json"
    path.write_text(json.dumps(_released(json.loads(path.read_text()))))
    return ref


@pytest.mark.parametrize("form", ["transformers", "released"])
def test_step_matches_transformers(form, tmp_path):
    ref = write_released(tmp_path / "hf") if form == "released" else write_widened(
        "Step3p7ForConditionalGeneration", "Step3p7Config", dict(text_config=TEXT, vision_config=VISION),
        tmp_path / "hf")
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, TOL)
    config = Artifact.load(art).config
    assert config.kv_cache.owner == "kiln" and config.model.config["heads_per_layer"] == [4, 8, 8, 4]


def test_step_configs_kiln_cannot_run_are_refused_by_name():
    from kiln.models.step import Step3p5Config
    base = dict(TEXT, model_type="step3p5")
    for change, message in ((dict(norm_expert_weight=False), "norm_expert_weight false"),
                            (dict(use_head_wise_attn_gate=False), "use_head_wise_attn_gate False"),
                            (dict(layer_types=["full_attention", "minimax_m3_sparse"] * 2), "indexed sparse"),
                            (dict(swiglu_limits=[0.0]), "swiglu_limits lists 1 layers of the 4")):
        with pytest.raises(ValueError, match=message):
            Step3p5Config.from_hf(dict(base, **change))
