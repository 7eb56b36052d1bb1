"""models/vision_text.py: a vision-language checkpoint whose language model is a family kiln reads (LLaVA,
LLaVA-NeXT, LLaVA-OneVision, Idefics3, SmolVLM, InternVL in both formats, Aya Vision, Command A Vision, Voxtral (an
audio tower); Llama 3.2 Vision without its
cross-attention layers; GLM-4.1V and GLM-4.5V as GLM-4-0414 and GLM-4.5; DeepSeek-OCR 2's DeepSeek-V2 experts under
Llama's attention) compiles as that language model: q0f32 on
the CPU gives transformers' class for the whole checkpoint's logits on a text prompt (every prefill position, the
last-token prefill, 5 decode steps) within 1e-4 and passes `kiln check`, with a note counting the vision tensors left
unread; its tensors are found under whichever prefix the file uses (a checkpoint re-saved under model.language_model
and lm_head gives the same logits); a wrapper without a text_config or a language model is refused naming the fix,
and PaliGemma (a prefix LM) by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from kiln.models import ModelLoadError, load
from kiln.models.vision_text import WRAPPERS
from tiny_models import assert_prefill_and_decode_match, compiles_to_match, write_tokenizer, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
TOL = 1e-4
IDS = np.random.default_rng(10).integers(0, 500, size=19).tolist()
LLAMA = dict(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=1)
CLIP = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, image_size=28, patch_size=14, projection_dim=32)
SIGLIP = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=32, num_hidden_layers=1,
              num_attention_heads=2, image_size=28, patch_size=14)
IDEFICS = dict(model_type="idefics3_vision", hidden_size=32, intermediate_size=32, num_hidden_layers=1,
               num_attention_heads=2, image_size=28, patch_size=14)
INTERN = dict(model_type="internvl_vision", hidden_size=32, intermediate_size=32, num_hidden_layers=1,
              num_attention_heads=2, image_size=[28, 28], patch_size=[14, 14])

LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)
MLLAMA_TEXT = dict({k: v for k, v in LLAMA.items() if k != "model_type"}, num_hidden_layers=3,
                   cross_attention_layers=[1], pad_token_id=0, rope_parameters=LLAMA3_ROPE)
MLLAMA_VISION = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_global_layers=1,
                     num_attention_heads=2, image_size=28, patch_size=14, intermediate_layers_indices=[0],
                     vision_output_dim=64, max_num_tiles=4)

GLM4V_TEXT = dict({k: v for k, v in LLAMA.items() if k != "model_type"}, pad_token_id=0, rope_parameters=dict(
    rope_type="default", rope_theta=10000.0, mrope_section=[2, 1, 1], partial_rotary_factor=0.5))
GLM4V_VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64, image_size=28,
                    patch_size=14)

COHERE2 = dict(LLAMA, model_type="cohere2", sliding_window=32, pad_token_id=0,
               layer_types=["sliding_attention", "full_attention"])

CASES = {   # case -> (class, config class, config), the image token the last id (no text prompt holds it)
    "llava": ("LlavaForConditionalGeneration", "LlavaConfig",
              dict(text_config=dict(LLAMA, model_type="mistral", sliding_window=None), vision_config=CLIP,
                   image_token_index=511)),
    "llava-next": ("LlavaNextForConditionalGeneration", "LlavaNextConfig",
                   dict(text_config=LLAMA, vision_config=CLIP, image_token_index=511)),
    "llava-onevision": ("LlavaOnevisionForConditionalGeneration", "LlavaOnevisionConfig",      # Qwen2 inside
                        dict(text_config=dict(LLAMA, model_type="qwen2"), vision_config=SIGLIP, image_token_index=511,
                             video_token_index=510)),
    "idefics3": ("Idefics3ForConditionalGeneration", "Idefics3Config",
                 dict(text_config=LLAMA, vision_config=IDEFICS, image_token_id=511)),
    "smolvlm": ("SmolVLMForConditionalGeneration", "SmolVLMConfig",
                dict(text_config=LLAMA, vision_config=dict(IDEFICS, model_type="smolvlm_vision"), image_token_id=511)),
    "internvl": ("InternVLForConditionalGeneration", "InternVLConfig",        # Qwen2 inside, the head tied
                 dict(text_config=dict(LLAMA, model_type="qwen2"), vision_config=INTERN, image_token_id=511)),
    "aya-vision": ("AyaVisionForConditionalGeneration", "AyaVisionConfig",   # Cohere 2: window and global layers
                   dict(text_config=dict(COHERE2, logit_scale=1.0), vision_config=SIGLIP, image_token_index=511)),
    # GLM-4.1V / GLM-4.5V: GLM-4-0414 and GLM-4.5 with M-RoPE over half the head's dims, adjacent pairs
    "glm4v": ("Glm4vForConditionalGeneration", "Glm4vConfig",
              dict(text_config=GLM4V_TEXT, vision_config=GLM4V_VISION, image_token_id=511)),
    "glm4v-moe": ("Glm4vMoeForConditionalGeneration", "Glm4vMoeConfig",
                  dict(text_config=dict(GLM4V_TEXT, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                        first_k_dense_replace=1, n_shared_experts=1),
                       vision_config=GLM4V_VISION, image_token_id=511)),
    "command-a-vision": ("Cohere2VisionForConditionalGeneration", "Cohere2VisionConfig",
                         dict(text_config=dict(COHERE2, logit_scale=1.0), vision_config=SIGLIP, image_token_id=511)),
    # Voxtral: an audio tower (Whisper's encoder) before a Llama
    "voxtral": ("VoxtralForConditionalGeneration", "VoxtralConfig",
                dict(text_config=LLAMA, audio_config=dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                                          num_attention_heads=2, num_mel_bins=8,
                                                          max_source_positions=16), audio_token_id=511)),
    # Llama 3.2 Vision: a cross-attention layer between two self-attention ones, 8 image rows past the vocabulary
    "mllama": ("MllamaForConditionalGeneration", "MllamaConfig",
               dict(text_config=MLLAMA_TEXT, vision_config=MLLAMA_VISION, image_token_index=511)),
    # GOT-OCR 2.0 (and PP-Chart2Table, the same class): a SAM encoder and convolutions before a Qwen2
    "got-ocr2": ("GotOcr2ForConditionalGeneration", "GotOcr2Config", dict(
        text_config=dict(LLAMA, model_type="qwen2"), image_token_index=511,
        vision_config=dict(hidden_size=32, output_channels=16, num_hidden_layers=1, num_attention_heads=2,
                           image_size=64, patch_size=16, window_size=2, global_attn_indexes=[0], mlp_dim=32))),
    # Cosmos 3 Edge: its reasoner (Llama's attention, relu2's ungated MLP) at the root as released, attention named
    # to_q / to_k / to_v / to_out; M-RoPE on text as RoPE
    "cosmos3-edge": ("Cosmos3EdgeForConditionalGeneration", "Cosmos3EdgeConfig", dict(
        text_config=dict({k: v for k, v in LLAMA.items() if k != "model_type"}, head_dim=16, pad_token_id=0,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2])),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           num_patches=16, patch_size=4),
        projector_hidden_size=64, image_token_id=511, video_token_id=510)),
    # ERNIE 4.5 VL: ERNIE 4.5 MoE whose sparse layers hold text and vision experts (a text prompt takes the text ones)
    "ernie4_5-vl-moe": ("Ernie4_5_VLMoeForConditionalGeneration", "Ernie4_5_VLMoeConfig", dict(
        text_config=dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, moe_intermediate_size=[32, 16], moe_k=2,
                         moe_num_experts=4, moe_num_shared_experts=1, eos_token_id=2, bos_token_id=1,
                         rope_parameters=dict(rope_type="default", rope_theta=500000.0, mrope_section=[2, 2, 4])),
        vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64),
        image_start_token_id=505, image_end_token_id=506, image_token_id=507, video_start_token_id=508,
        video_end_token_id=509, video_token_id=510)),
    # Cohere Compass: Command R7B's layers (sliding with RoPE, full without) with RoPE on halves, given per layer kind
    "cohere-compass": ("CohereCompassForConditionalGeneration", "CohereCompassConfig", dict(
        text_config=dict(COHERE2, model_type="cohere_compass_text", logit_scale=0.25,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                         num_hidden_layers=3, rope_parameters=dict(
                             sliding_attention=dict(rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2]),
                             full_attention=None)),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           num_position_embeddings=16, deepstack_visual_indexes=[0], patch_size=4),
        image_token_id=511, video_token_id=510, vision_start_token_id=509, vision_end_token_id=508)),
    # Muse Glimmer: Gemma 2's sandwich norms (the post ones with their own epsilon), a weightless embedding norm,
    # weightless q/k norms with q scaled, a gated attention output, full layers without RoPE, a plain last norm,
    # soft-capped logits
    "muse-glimmer": ("MuseGlimmerForConditionalGeneration", "MuseGlimmerConfig", dict(
        text_config=dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=32,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0), post_norm_eps=1e-3,
                         final_logit_softcapping=4.0, output_multiplier=2.0, eos_token_id=2, bos_token_id=1),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           pos_emb_height=4, pos_emb_width=4, patch_size=4),
        out_hidden_size=128, projector_hidden_size=64, image_token_id=511, video_token_id=510)),
    # DeepSeek-OCR 2: DeepSeek-V2's experts (group-limited, biased q/k/v/o) under Llama's multi-head attention, its
    # language model under the released `model.` names with the SAM and Qwen2 encoders' and the projector's beside it
    "deepseek-ocr2": ("DeepseekOcr2ForConditionalGeneration", "DeepseekOcr2Config", dict(
        text_config=dict(LLAMA, model_type="deepseek_ocr2_text", num_hidden_layers=3, num_key_value_heads=4,
                         attention_bias=True, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=2,
                         moe_intermediate_size=32, routed_scaling_factor=1.5, topk_method="group_limited_greedy",
                         n_group=4, topk_group=2, mlp_layer_types=["dense", "sparse", "sparse"], pad_token_id=0),
        vision_config=dict(sam_config=dict(hidden_size=32, output_channels=16, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=64, patch_size=16, window_size=2,
                                           global_attn_indexes=[0], downsample_channels=[16, 32]),
                           encoder_config=dict(vocab_size=16, hidden_size=32, intermediate_size=32,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)),
        image_token_id=511)),
    # Muse Spark: Muse Glimmer's layers with residual gates, an o_norm, weightless and input-scaled post norms, and
    # experts at a pooled width (the router on x, one input-scaled norm on every expert's output)
    "muse-spark": ("MuseSparkForConditionalGeneration", "MuseSparkConfig", dict(
        text_config=dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=32,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0), post_norm_eps=1e-3,
                         final_logit_softcapping=4.0, output_multiplier=2.0, eos_token_id=2, bos_token_id=1,
                         num_local_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, moe_hidden_size=48,
                         mlp_layer_types=["dense", "sparse", "sparse", "sparse"], routed_scaling_factor=1.5,
                         residual_gate_temperature=3.0),    # 0.3: float32 error past 1e-4 in transformers too,
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           pos_emb_height=4, pos_emb_width=4, patch_size=4),
        audio_config=dict(patch_sizes=[4, 2], hidden_sizes=[16, 32], depths=[1, 1], num_hidden_layers=2,
                          out_hidden_size=64),
        out_hidden_size=128, projector_hidden_size=64, image_token_id=511, video_token_id=510)),
    # Nemotron 3 Nano Omni: RADIO before a Nemotron-H (Mamba-2, attention and MoE blocks), saved under
    # language_model.backbone as released
    "nemotron-omni": ("NemotronH_Omni_Reasoning_V3", "NemotronH_Omni_Reasoning_V3_Config", dict(
        text_config=dict(LLAMA, model_type="nemotron_h", head_dim=16, num_hidden_layers=4, pad_token_id=0,
                         layers_block_type=["mamba", "moe", "attention", "moe"], mamba_num_heads=4, mamba_head_dim=16,
                         n_groups=2, ssm_state_size=16, n_routed_experts=8, num_experts_per_tok=2,
                         moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, n_group=2, topk_group=1,
                         routed_scaling_factor=2.5, tie_word_embeddings=False),
        vision_config=dict(model_type="radio", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=16, max_img_size=64, video_temporal_patch_size=2),
        vision_hidden_size=32, projector_hidden_size=32, image_token_id=511)),
}


FAMILY = {"llava": "llama", "llava-next": "llama", "llava-onevision": "qwen2", "idefics3": "llama",
          "smolvlm": "llama", "internvl": "qwen2", "aya-vision": "cohere2", "mllama": "llama", "glm4v": "glm4",
          "glm4v-moe": "glm4_moe", "command-a-vision": "cohere2", "voxtral": "llama",
          "got-ocr2": "qwen2", "deepseek-ocr2": "deepseek_ocr2_text", "cosmos3-edge": "arcee",
          "ernie4_5-vl-moe": "ernie4_5_vl_moe_text", "cohere-compass": "cohere_compass_text",
          "muse-glimmer": "muse_glimmer_text", "nemotron-omni": "nemotron_h",
          "muse-spark": "muse_spark_text"}


def _write(case: str, dest, seed: int = 0):
    model_cls, config_cls, cfg = CASES[case]
    return write_widened(model_cls, config_cls, cfg, dest, seed)


def _compiles_to(src, ref, dest):
    return compiles_to_match(src, ref, dest, IDS, TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_the_language_model_matches_the_whole_checkpoints_class(case, tmp_path):
    ref = _write(case, tmp_path / "hf")
    config = _compiles_to(tmp_path / "hf", ref, tmp_path / "art")
    (note,) = [n for n in config.notes if "language model" in n]
    tower = "audio" if case == "voxtral" else "vision"
    assert f"{tower} tower" in note and "projector" in note and "tensors) are not read" in note
    assert config.model.arch == FAMILY[case]


def test_llama_32_visions_language_model_saved_alone(tmp_path):
    """transformers' MllamaForCausalLM (model_type mllama_text_model; the language model saved alone): its
    self-attention layers read as a Llama, the cross-attention layer and the image rows left unread; the whole class is
    `kiln check`'s reference and the test's."""
    ref = write_widened("MllamaForCausalLM", "MllamaTextConfig", dict(MLLAMA_TEXT, tie_word_embeddings=False),
                        tmp_path / "hf", seed=2)
    config = _compiles_to(tmp_path / "hf", ref, tmp_path / "art")
    (note,) = [n for n in config.notes if "cross-attention" in n]
    assert "layers [1]" in note and config.model.arch == "llama" and config.model.config["num_hidden_layers"] == 2


def test_the_language_model_under_another_prefix(tmp_path):
    """LLaVA's tensors re-saved under model.language_model.* and lm_head (transformers 5's module names)."""
    ref = _write("llava", tmp_path / "hf", seed=1)
    path = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(str(path))
    renamed = {n.replace("language_model.model.", "model.language_model.").replace("language_model.lm_head",
                                                                                   "lm_head"): t
               for n, t in tensors.items()}
    assert "model.language_model.embed_tokens.weight" in renamed and "lm_head.weight" in renamed
    save_file(renamed, str(path), metadata={"format": "pt"})
    _compiles_to(tmp_path / "hf", ref, tmp_path / "art")


def test_a_wrapper_without_its_language_model_and_paligemma_are_refused(tmp_path):
    _write("llava-next", tmp_path / "hf", seed=2)
    path = tmp_path / "hf" / "config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in cfg.items() if k != "text_config"}))
    with pytest.raises(ModelLoadError, match="LlavaNextForConditionalGeneration without a text_config .*re-download"):
        load(tmp_path / "hf")
    path.write_text(json.dumps(cfg))
    weights = tmp_path / "hf" / "model.safetensors"
    save_file({n: t for n, t in load_file(str(weights)).items() if "embed_tokens" not in n}, str(weights),
              metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="language model has no embed_tokens under language_model.backbone / "
                                             "language_model.model"):
        load(tmp_path / "hf")
    path.write_text(json.dumps(dict(cfg, model_type="paligemma", architectures=["PaliGemmaForConditionalGeneration"],
                                    text_config=dict(LLAMA, model_type="gemma"))))
    with pytest.raises(ModelLoadError, match=r"PaliGemma \(paligemma\) is not supported yet: its prompt attended both"):
        load(tmp_path / "hf")


def test_internvl_in_its_own_codes_format(tmp_path):
    """InternVL as its own code (trust_remote_code) saves it: InternVLChatModel, the language model's config as
    llm_config, its tensors under language_model.model / language_model.lm_head beside vision_model.* and mlp1.*.
    transformers has no class for the whole, so the reference is its Qwen2 over the same tensors."""
    import shutil

    ref = write_widened("Qwen2ForCausalLM", "Qwen2Config", {k: v for k, v in LLAMA.items() if k != "model_type"},
                        tmp_path / "text", seed=3)
    dest = tmp_path / "internvl"
    shutil.copytree(tmp_path / "text", dest)
    llm = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({
        "architectures": ["InternVLChatModel"], "model_type": "internvl_chat", "llm_config": llm,
        "vision_config": {"model_type": "intern_vit_6b", "hidden_size": 32}, "template": "internvl2_5"}))
    tensors = {f"language_model.{n}": t for n, t in load_file(str(dest / "model.safetensors")).items()}
    tensors.update({"vision_model.embeddings.patch_embedding.weight": np.zeros((32, 3, 14, 14), np.float32),
                    "mlp1.1.weight": np.zeros((64, 32), np.float32)})
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    config = _compiles_to(dest, ref, tmp_path / "art")
    assert config.model.arch == "qwen2" and any("InternVL's language model (qwen2)" in n for n in config.notes)


# Wrappers checked without a compile: the language model kiln reads (its config, its renamed tensors) in its family's
# transformers class gives the wrapper's own class's logits on a text prompt; each family's compile is tested in its
# own module, the reading's compile by CASES above. The wrapper is built on the meta device but for its language
# model and head (its default, full-size towers never allocated), so a forward that touched a tower would fail.
QWEN3 = dict(LLAMA, model_type="qwen3", head_dim=16)
MROPE = dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])
LIGHT = {   # wrapper -> (its config class, its language model's config, more of its config)
    "Lfm2VlForConditionalGeneration": ("Lfm2VlConfig", dict(LLAMA, model_type="lfm2", pad_token_id=0,
                                                             layer_types=["conv", "full_attention"]), {}),
    "Lfm3VlForConditionalGeneration": ("Lfm3VlConfig", dict(LLAMA, model_type="lfm3", head_dim=16, sliding_window=8,
                                                             conv_L_cache=7, pad_token_id=0,
                                                             layer_types=["conv", "full_attention"]), {}),
    "Idefics2ForConditionalGeneration": ("Idefics2Config", dict(LLAMA, model_type="mistral"), {}),
    "VipLlavaForConditionalGeneration": ("VipLlavaConfig", LLAMA, {}),
    "LlavaNextVideoForConditionalGeneration": ("LlavaNextVideoConfig", LLAMA, {}),
    "VideoLlavaForConditionalGeneration": ("VideoLlavaConfig", LLAMA, {}),
    "LightOnOcrForConditionalGeneration": ("LightOnOcrConfig", QWEN3, {}),
    "Ovis2ForConditionalGeneration": ("Ovis2Config", dict(LLAMA, model_type="qwen2"), {}),
    "Ovis2_5ForConditionalGeneration": ("Ovis2_5Config", QWEN3, {}),
    "Glm46VForConditionalGeneration": ("Glm46VConfig", dict(GLM4V_TEXT, model_type="glm4v_text", head_dim=16), {}),
    "Exaone4_5_ForConditionalGeneration": ("Exaone4_5_Config", dict(QWEN3, model_type="exaone4", sliding_window=8,
                                                                     layer_types=["sliding_attention",
                                                                                  "full_attention"]), {}),
    "Kimi_K25ForConditionalGeneration": ("Kimi_K25Config", dict(
        LLAMA, model_type="deepseek_v3", q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, num_key_value_heads=4, pad_token_id=0, n_routed_experts=8, num_experts_per_tok=3,
        moe_intermediate_size=48, n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1), {}),
    "DeepseekVLForConditionalGeneration": ("DeepseekVLConfig", LLAMA, {}),
    "DeepseekVLHybridForConditionalGeneration": ("DeepseekVLHybridConfig", LLAMA, {}),
    "JanusForConditionalGeneration": ("JanusConfig", LLAMA, {}),
    "LlavaOnevision15ForConditionalGeneration": ("LlavaOnevision15Config", QWEN3,
                                                 dict(vision_config=dict(out_hidden_size=64))),
    "Qwen2_5OmniThinkerForConditionalGeneration": ("Qwen2_5OmniThinkerConfig", dict(
        LLAMA, model_type="qwen2_5_omni_text", rope_parameters=MROPE), {}),
    "Qwen3OmniMoeThinkerForConditionalGeneration": ("Qwen3OmniMoeThinkerConfig", dict(
        QWEN3, model_type="qwen3_omni_moe_text", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        rope_parameters=dict(MROPE, mrope_section=[4, 2, 2])), {}),
    # the head pruned to the text's first 504 ids; the embedding's last 8 the image and audio codes (none in IDS)
    "Apertus1p5ForConditionalGeneration": ("Apertus1p5Config", dict(
        LLAMA, model_type="apertus1p5_text", output_vocab_size=504, pad_token_id=0), dict(
        vision_config=dict(codebook_size=4), audio_config=dict(model_type="wavtokenizer_encoder", codebook_size=4),
        image_token_offset=504, audio_token_offset=508, image_token_id=3, audio_token_id=4)),
    "AriaForConditionalGeneration": ("AriaConfig", dict(LLAMA, model_type="aria_text", moe_num_experts=4, moe_topk=2,
                                                         moe_num_shared_experts=1, pad_token_id=0), {}),
    "Emu3ForConditionalGeneration": ("Emu3Config", dict(LLAMA, model_type="emu3_text_model", pad_token_id=0), dict(
        vocabulary_map={"<image>": 511, "<|extra_200|>": 510, "<|visual token 000000|>": 509})),
    "FuyuForCausalLM": ("FuyuConfig", dict(LLAMA, model_type="persimmon", num_key_value_heads=4, pad_token_id=0), {}),
    "MiniCPMV4_6ForConditionalGeneration": ("MiniCPMV4_6Config", dict(
        QWEN3, model_type="qwen3_5_text", linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
        linear_num_value_heads=4, layer_types=["linear_attention", "full_attention"], pad_token_id=0), {}),
    "VideoLlama3ForConditionalGeneration": ("VideoLlama3Config", dict(LLAMA, model_type="qwen2"), {}),
    "Granite4VisionForConditionalGeneration": ("Granite4VisionConfig", dict(
        LLAMA, model_type="granite4_vision_text", embedding_multiplier=2.0, residual_multiplier=0.5,
        attention_multiplier=0.2, logits_scaling=4.0, pad_token_id=0), dict(
        deepstack_layer_map=[[-1, 0]], spatial_target_layers=[0, 1, 0, 1], downsample_rate="1/2")),
    "GraniteDoclingForConditionalGeneration": ("GraniteDoclingConfig", dict(
        LLAMA, model_type="granite_docling_text", embedding_multiplier=2.0, residual_multiplier=0.5,
        attention_multiplier=0.2, logits_scaling=4.0, pad_token_id=0), dict(vision_config=dict(out_hidden_size=64))),
    "HunYuanVLForConditionalGeneration": ("HunYuanVLConfig", dict(
        LLAMA, model_type="hunyuan_vl_text", head_dim=16, pad_token_id=0,
        rope_parameters=dict(rope_type="xdrope", rope_theta=10000.0, alpha=1000.0, factor=1.0,
                             xdrope_section=[2, 2, 2, 2])), {}),
    "MiniCPMOcrForConditionalGeneration": ("MiniCPMOcrConfig", dict(
        QWEN3, model_type="qwen3_5_text", linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
        linear_num_value_heads=4, layer_types=["linear_attention", "full_attention"], pad_token_id=0), {}),
    "QianfanOCRForConditionalGeneration": ("QianfanOCRConfig", QWEN3, {}),
    "HyperCLOVAXVisionV2ForConditionalGeneration": ("HyperCLOVAXVisionV2Config", dict(
        LLAMA, model_type="hyperclovax", head_dim=16, embedding_multiplier=2.0, residual_multiplier=0.5,
        logits_scaling=0.7, pad_token_id=0), {}),
    "Cosmos3OmniForConditionalGeneration": ("Cosmos3OmniConfig", dict(
        QWEN3, model_type="qwen3_vl_text", rope_parameters=dict(MROPE, mrope_interleaved=True)), {}),
    "GlmOcrForConditionalGeneration": ("GlmOcrConfig", dict(GLM4V_TEXT, model_type="glm_ocr_text", head_dim=16), {}),
    "PaddleOCRVLForConditionalGeneration": ("PaddleOCRVLConfig", dict(
        LLAMA, model_type="paddleocr_vl_text", head_dim=16, use_bias=True, rope_parameters=MROPE, pad_token_id=0), {}),
    # FastVLM's and Perception LM's towers are timm's (FastViTHD, PE), which this suite does not install: CLIP's in
    # their place
    "FastVlmForConditionalGeneration": ("FastVlmConfig", dict(LLAMA, model_type="qwen2"), dict(vision_config=CLIP)),
    "PerceptionLMForConditionalGeneration": ("PerceptionLMConfig", LLAMA, dict(
        vision_config=dict(CLIP, model_args={"embed_dim": 32}))),
}
EMBEDDED = ("GraniteDoclingForConditionalGeneration",)          # given the ids' embeddings (the towers are on meta)
LANGUAGE_MODEL = ("model.language_model", "model.text_model")


def _language_model_only(wrapper: str, config_cls: str, text: dict, extra: dict, seed: int = 0):
    """The wrapper on the meta device but for its language model and head, those random (widened); with the
    tensors they hold under the wrapper's names (the tied head left out, as transformers saves it)."""
    import torch
    import transformers
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(text_config=text, **extra)
    config._attn_implementation = "eager"
    with torch.device("meta"):
        model = getattr(transformers, wrapper)(config)
    prefix = next(p for p in LANGUAGE_MODEL if f"{p}.embed_tokens.weight" in model.state_dict())
    parent, _, attr = prefix.rpartition(".")
    meta = model.get_submodule(prefix)
    setattr(model.get_submodule(parent), attr, type(meta)(meta.config))
    model.lm_head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=False)
    ours = lambda name: name.startswith(f"{prefix}.") or name == "lm_head.weight"      # noqa: E731
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ours(name):
                p.normal_(0.0, 0.08 if p.ndim == 2 else 0.3).add_(1.0 if p.ndim == 1 and "bias" not in name else 0.0)
        for name, b in model.named_buffers():       # DeepSeek-V3's router choice bias, zeros at init
            if ours(name) and name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.3)
    tensors = {name: t.detach().clone() for name, t in model.state_dict().items() if ours(name)}
    if getattr(config, "tie_word_embeddings", False):      # transformers ties by the outer config
        model.lm_head.weight = model.get_input_embeddings().weight
        del tensors["lm_head.weight"]
    return model.eval(), config, tensors


def _family_logits(source, ids):
    """transformers' class of the family kiln reads, from kiln's config and tensors."""
    import torch
    import transformers
    hf = {k: v for k, v in source.hf_config.items() if k != "architectures"}
    config = transformers.AutoConfig.for_model(**hf)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config)
    held = {n: torch.from_numpy(np.asarray(source.weights.get(n))) for n in source.weights.names()}
    missing = model.load_state_dict(held, strict=False).missing_keys
    assert missing in ([], ["lm_head.weight"]) and (missing == []) != bool(hf["tie_word_embeddings"]), missing
    with torch.no_grad():
        return model.eval()(torch.tensor([ids])).logits[0].numpy()


def _save(dest, config: dict, tensors: dict) -> None:
    from safetensors.torch import save_file
    dest.mkdir(parents=True)
    (dest / "config.json").write_text(json.dumps(config))
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(dest / "model.safetensors"),
              metadata={"format": "pt"})


@pytest.mark.parametrize("wrapper", list(LIGHT))
def test_the_language_model_read_is_the_wrappers_forward_on_text(wrapper, tmp_path):
    import torch
    model, config, tensors = _language_model_only(wrapper, *LIGHT[wrapper])
    ids = torch.tensor([IDS])
    with torch.no_grad():       # Granite-Docling moves the ids' embeddings to its first parameter's device (a tower's)
        given = dict(inputs_embeds=model.get_input_embeddings()(ids)) if wrapper in EMBEDDED else dict(input_ids=ids)
        expected = model(**given).logits[0].numpy()
    _save(tmp_path / "hf", dict(config.to_dict(), architectures=[wrapper]), tensors)
    source = load(tmp_path / "hf")
    (note,) = [n for n in source.notes if "language model" in n]
    assert note.startswith(f"{WRAPPERS[wrapper]}'s language model ({LIGHT[wrapper][1]['model_type']}) only")
    np.testing.assert_allclose(_family_logits(source, IDS), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("thinker", ["Qwen2_5OmniThinkerForConditionalGeneration",
                                     "Qwen3OmniMoeThinkerForConditionalGeneration"])
def test_an_omni_checkpoint_is_read_as_its_thinkers_language_model(thinker, tmp_path):
    """Qwen2.5-Omni / Qwen3-Omni as released: the thinker's config under thinker_config, its tensors under
    `thinker.` (`thinker.model.*` as the released files name them), a talker beside it; transformers' whole class
    has no forward (generate only), so kiln's reference is the language model's class (compiler/golden.py)."""
    whole = thinker.replace("Thinker", "")
    model, config, tensors = _language_model_only(thinker, *LIGHT[thinker], seed=5)
    released = {f"thinker.{n.replace('model.language_model.', 'model.')}": t for n, t in tensors.items()}
    released["talker.model.embed_tokens.weight"] = tensors["model.language_model.embed_tokens.weight"][:8].clone()
    _save(tmp_path / "hf", {"architectures": [whole], "model_type": config.model_type.replace("_thinker", ""),
                            "thinker_config": config.to_dict(), "talker_config": {"model_type": "talker"}}, released)
    source = load(tmp_path / "hf")
    assert any("towers, talker and speech decoder (1 tensors) are not read" in n for n in source.notes)
    if thinker.startswith("Qwen2_5"):       # the whole path once: compiled, against the thinker, `kiln check`
        write_tokenizer(tmp_path / "hf", LLAMA["vocab_size"])
        assert compiles_to_match(tmp_path / "hf", model, tmp_path / "art", IDS, TOL).model.arch == "qwen2"
    else:
        import torch
        with torch.no_grad():
            expected = model(input_ids=torch.tensor([IDS])).logits[0].numpy()
        np.testing.assert_allclose(_family_logits(source, IDS), expected, atol=1e-5, rtol=0)


def test_emu3_as_released(tmp_path):
    """Emu3's files keep its language model under text_model.* and its head as text_model.lm_head (transformers renames
    them on load and back on save): read there, the wrapper's logits on a text prompt."""
    import torch
    wrapper = "Emu3ForConditionalGeneration"
    model, config, tensors = _language_model_only(wrapper, *LIGHT[wrapper])
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([IDS])).logits[0].numpy()
    released = {("text_model.lm_head.weight" if n == "lm_head.weight" else n.removeprefix("model.")): t
                for n, t in tensors.items()}
    assert "text_model.embed_tokens.weight" in released
    _save(tmp_path / "hf", dict(config.to_dict(), architectures=[wrapper]), released)
    source = load(tmp_path / "hf")
    assert "lm_head.weight" in source.weights.names() and "VQ-VAE image tokenizer" in source.notes[0]
    np.testing.assert_allclose(_family_logits(source, IDS), expected, atol=1e-5, rtol=0)


def test_kimi_k25_as_released(tmp_path):
    """Kimi K2.5 / K2.6 as Moonshot's own code saves it (KimiK25ForConditionalGeneration: language_model.model.*,
    language_model.lm_head), transformers' class only reading it through its conversion: the same language model."""
    import torch
    wrapper = "Kimi_K25ForConditionalGeneration"
    model, config, tensors = _language_model_only(wrapper, *LIGHT[wrapper], seed=6)
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([IDS])).logits[0].numpy()
    released = {n.replace("model.language_model.", "language_model.model.").replace("lm_head", "language_model.lm_head"):
                t for n, t in tensors.items()}
    _save(tmp_path / "hf", dict(config.to_dict(), architectures=["KimiK25ForConditionalGeneration"]), released)
    source = load(tmp_path / "hf")
    assert source.hf_config["model_type"] == "deepseek_v3"
    np.testing.assert_allclose(_family_logits(source, IDS), expected, atol=1e-5, rtol=0)


def test_apertus15_text_model_with_its_pruned_head(tmp_path):
    """Apertus 1.5's language model alone (Apertus1p5TextForCausalLM): its head pruned to the text's first 504 ids
    (output_vocab_size), its embedding holding 8 more (image and audio codes): compiled as the model of the head's
    vocabulary, it gives transformers' logits and passes `kiln check`; an id past the head's is refused."""
    from kiln import Engine, SamplingParams
    from kiln.runtime.protocol import InvalidRequestError
    model = write_widened("Apertus1p5TextForCausalLM", "Apertus1p5TextConfig",
                          {k: v for k, v in dict(LLAMA, output_vocab_size=504, pad_token_id=0).items()
                           if k != "model_type"}, tmp_path / "hf", seed=9)
    source = load(tmp_path / "hf")
    assert source.hf_config["vocab_size"] == 504 and any("output_vocab_size" in n for n in source.notes)
    config = compiles_to_match(tmp_path / "hf", model, tmp_path / "art", IDS, TOL)
    assert (config.model.arch, config.vocab_size) == ("apertus", 504)
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        Engine(tmp_path / "art").generate([1, 2, 508], SamplingParams(max_tokens=1))


def test_minimax_m3_as_released(tmp_path):
    """MiniMax-M3 as transformers saves its whole class (MiniMaxM3SparseForConditionalGeneration), which is the
    released layout (language_model.model.*, block_sparse_moe, experts' w1 / w3 / w2, the indexer's index_*): its
    language model (test_families' minimax-m3: a sparse-attention layer, the context capped where its indexer picks
    every block) gives the whole class's logits on text and passes `kiln check`."""
    from test_families import CASES, SMALL
    text = dict(SMALL, **CASES["minimax-m3"][2], model_type="minimax_m3_vl_text")
    vision = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    model = write_widened("MiniMaxM3SparseForConditionalGeneration", "MiniMaxM3VLConfig",
                          dict(text_config=text, vision_config=vision), tmp_path / "hf", seed=12)
    from kiln.models import build
    _, read, _ = build(load(tmp_path / "hf"))
    assert read.released and any("capped at 64 tokens" in n for n in read.notes)
    config = compiles_to_match(tmp_path / "hf", model, tmp_path / "art", IDS, TOL)
    assert (config.model.arch, config.context_window_size) == ("minimax_m3", 64)


def test_minimax_m3_reads_its_released_config():
    """The released config.json's keys (qk_norm_type per_head, sparse_attention_config, moe_layer_freq) read as
    transformers' MiniMax-M3 reads them; MiniMax-M2's per_layer q/k norms refused by name."""
    from kiln.models.glm4_moe import MiniMaxM3Config
    from test_families import CASES, SMALL
    case = CASES["minimax-m3"][2]
    released = dict({k: v for k, v in dict(SMALL, **case).items() if k not in ("layer_types", "mlp_layer_types")},
                    architectures=["MiniMaxM3SparseForConditionalGeneration"], qk_norm_type="per_head",
                    use_qk_norm=True, use_gemma_norm=True, use_routing_bias=True, moe_layer_freq=[0, 1],
                    sparse_attention_config=dict(sparse_attention_freq=[1, 0], sparse_topk_blocks=16,
                                                 sparse_block_size=4))
    c = MiniMaxM3Config.from_hf(released)
    assert c.released and c.dense_layers == (0,) and c.context_window_size == 64
    assert c.flags().qk_norm and c.flags().qk_norm_heads
    with pytest.raises(ValueError, match="qk_norm_type"):
        MiniMaxM3Config.from_hf(dict(released, qk_norm_type="per_layer"))


def test_minimax_m3_gguf(tmp_path):
    """llama.cpp's minimax-m3 layout (tests/gguf_writer.py: MiniMaxM3Model's keys and tensors, every norm + 1, the
    indexer's keys and tensors) read back as test_families' minimax-m3 model: its logits."""
    import kiln
    from gguf_writer import write_gguf
    from test_families import write_family
    from tiny_models import assert_prefill_and_decode_match
    ref = write_family("minimax-m3", tmp_path / "hf", seed=13, swiglu_limit=7.0)   # the released limit: the
    path = write_gguf(tmp_path / "hf", tmp_path / "m3.gguf")                       # converter writes none
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, TOL, steps=2)
    assert kiln.check(art).ok


PHI4_MM = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=1024, original_max_position_embeddings=64,
               rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75,
                                    short_factor=[1.0 + 0.1 * i for i in range(6)],
                                    long_factor=[2.0 + 0.5 * i for i in range(6)]),
               tie_word_embeddings=True, sliding_window=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0,
               vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                  image_size=28, patch_size=14, crop_size=28, image_token_id=500),
               audio_config=dict(hidden_size=32, intermediate_size=64, num_blocks=1, num_attention_heads=2,
                                 ext_pw_out_channel=32, depthwise_separable_out_channel=32, nemo_conv_channels=32,
                                 audio_token_id=501))


@pytest.mark.parametrize("form", ["transformers", "released"])
def test_phi4_multimodal_reads_as_phi4_mini(form, tmp_path):
    """Phi-4-multimodal (Phi-4-mini's layers: partial rotary, LongRoPE, tied head) as transformers saves it and as
    released (Phi4MMForCausalLM: every adapted Linear's weights as base_layer beside vision and speech LoRA adapters,
    which a text prompt does not run): its image and audio embedders and the adapters left unread, with a note; the
    logits transformers' class gives on text."""
    import kiln
    ref = write_widened("Phi4MultimodalForCausalLM", "Phi4MultimodalConfig", PHI4_MM, tmp_path / "hf")
    if form == "released":
        weights, rng = load_file(tmp_path / "hf" / "model.safetensors"), np.random.default_rng(0)
        for name in [n for n in weights if n.startswith("model.layers.") and n.endswith("_proj.weight")]:
            base, out_in = name[:-len(".weight")], weights[name].shape
            weights[f"{base}.base_layer.weight"] = weights.pop(name)
            for mode in ("vision", "speech"):
                weights[f"{base}.lora_A.{mode}.weight"] = rng.normal(0, 0.5, (8, out_in[1])).astype(np.float32)
                weights[f"{base}.lora_B.{mode}.weight"] = rng.normal(0, 0.5, (out_in[0], 8)).astype(np.float32)
        save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
        path = tmp_path / "hf" / "config.json"
        path.write_text(json.dumps(dict(json.loads(path.read_text()), model_type="phi4mm",
                                        architectures=["Phi4MMForCausalLM"])))
    (note,) = [n for n in load(tmp_path / "hf").notes if "Phi-4-multimodal" in n]
    assert "image and audio embedders" in note and ("LoRA adapters (32)" in note) == (form == "released"), note
    if form == "transformers":
        _compiles_to(tmp_path / "hf", ref, tmp_path / "art")
    else:           # transformers' class does not read the released layout: no golden reference
        art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
        assert_prefill_and_decode_match(art, ref, IDS, TOL)


def test_cosmos3_edge_generation_branch_is_left_unread(tmp_path):
    """Cosmos 3 Edge as released holds its generation branch beside the reasoner (the *_moe_gen layers, the joint
    attention's add_q/k/v_proj, time and action embedders), which transformers' class drops: unread and counted,
    the reasoner's logits unchanged."""
    import torch
    model_cls, config_cls, cfg = CASES["cosmos3-edge"]
    ref = write_widened(model_cls, config_cls, cfg, tmp_path / "hf")
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    towers = len(weights) - len([n for n in weights if n.split(".")[0] in ("embed_tokens", "layers", "norm",
                                                                           "lm_head")])
    rng = np.random.default_rng(0)
    generation = {name: rng.normal(0, 1, (64, 64)).astype(np.float32) for name in (
        "layers.0.mlp_moe_gen.up_proj.weight", "layers.1.input_layernorm_moe_gen.weight",
        "layers.0.self_attn.add_q_proj.weight", "layers.1.self_attn.to_add_out.weight", "time_embedder.linear.weight",
        "norm_moe_gen.weight", "proj_in.weight")}
    save_file({**weights, **generation}, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    source = load(tmp_path / "hf")
    (note,) = [n for n in source.notes if "language model" in n]
    assert f"generation branch ({towers + len(generation)} tensors) are not read" in note, note
    with torch.no_grad():
        expected = ref(torch.tensor([IDS])).logits[0].numpy()
    np.testing.assert_allclose(_family_logits(source, IDS), expected, atol=1e-5, rtol=0)


MOLMO2_TEXT = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                   additional_vocab_size=16, num_hidden_layers=4, intermediate_size=96, max_position_embeddings=256,
                   rope_parameters=dict(rope_type="default", rope_theta=10000.0), rms_norm_eps=1e-6)
MOLMO2 = dict(vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                 num_key_value_heads=2, head_dim=16, image_size=[28, 28], patch_size=14),
              adapter_config=dict(vision_feature_layer=[-1], hidden_size=32, num_attention_heads=2,
                                  num_key_value_heads=2, head_dim=16, intermediate_size=64, text_hidden_size=64),
              image_start_token_id=512, low_res_image_start_token_id=513, image_end_token_id=514, image_patch_id=515,
              frame_start_token_id=516, frame_end_token_id=517)


@pytest.mark.parametrize("kind, text", [
    ("qwen3", dict(qk_norm_type="qwen3", norm_after=False)),            # Molmo2-4B / -8B
    ("olmo", dict(qk_norm_type="olmo", norm_after=True)),                # Molmo2-O
    ("olmo-scaled-layers", dict(qk_norm_type="olmo", norm_after=True, rope_scaling_layers=[1, 3],
                                rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                     original_max_position_embeddings=64))),
    ("qkv-bias", dict(qk_norm_type="qwen3", norm_after=False, qkv_bias=True))])
def test_molmo2_reads_as_its_language_model(kind, text, tmp_path):
    """Molmo 2 as transformers saves it (the original code's layout under model.transformer: the embedding in two
    parts, q/k/v fused, the MLP's up rows before gate's) gives the whole checkpoint's logits on text, for its Qwen3
    and OLMo forms (RoPE's scaling on the rope_scaling_layers only, q/k/v biases without o's)."""
    ref = write_widened("Molmo2ForConditionalGeneration", "Molmo2Config",
                        dict(MOLMO2, text_config=dict(MOLMO2_TEXT, **text)), tmp_path / "hf")
    config = _compiles_to(tmp_path / "hf", ref, tmp_path / "art")
    assert config.model.arch == "molmo2" and any("vision tower and adapter are not read" in n for n in config.notes)


def test_molmo2_in_its_released_config_form(tmp_path):
    """Molmo 2's config.json as released (its text config's qkv_bias, layer_norm_eps, rope_theta, use_qk_norm and
    rope_scaling_layers null: every layer), which transformers reads too: the same logits."""
    ref = write_widened("Molmo2ForConditionalGeneration", "Molmo2Config",
                        dict(MOLMO2, text_config=dict(MOLMO2_TEXT, qk_norm_type="qwen3", qkv_bias=True)),
                        tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    text = {k: v for k, v in config["text_config"].items()
            if k not in ("rope_parameters", "rms_norm_eps", "attention_bias", "rope_scaling_layers")}
    config["text_config"] = dict(text, qkv_bias=True, layer_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
                                 rope_scaling_layers=None, use_qk_norm=True)
    path.write_text(json.dumps(config))
    _compiles_to(tmp_path / "hf", ref, tmp_path / "art")


def deepseek_ocr_case() -> tuple[str, str, dict]:
    """CASES' DeepSeek-OCR 2 as DeepSeek-OCR is: greedy routing, no attention biases."""
    cls, config_cls, cfg = CASES["deepseek-ocr2"]
    return cls, config_cls, dict(cfg, text_config=dict(cfg["text_config"], topk_method="greedy", n_group=None,
                                                       topk_group=None, attention_bias=False))


def write_deepseek_ocr_released(hf) -> None:
    """deepseek_ocr_case's model (seed 1) with config.json in DeepSeek-OCR's released form (its own code's:
    DeepseekOCRForCausalLM, the language model as language_config: DeepSeek-V2 with use_mla false, its dense layers
    as first_k_dense_replace), which transformers does not read; the tensors as transformers saves them (the released
    names: model.layers.*, the towers' beside them)."""
    write_widened(*deepseek_ocr_case(), hf, seed=1)
    path = hf / "config.json"
    c = json.loads(path.read_text())
    text = {k: v for k, v in c["text_config"].items() if k not in ("mlp_layer_types", "model_type")}
    path.write_text(json.dumps(dict(architectures=["DeepseekOCRForCausalLM"], model_type="deepseek_vl_v2",
                                    language_config=dict(
        text, architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", use_mla=False, kv_lora_rank=None,
        q_lora_rank=None, qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0, n_group=1, topk_group=1,
        topk_method="greedy", first_k_dense_replace=c["text_config"]["mlp_layer_types"].count("dense")))))


def test_deepseek_ocr_in_its_released_form(tmp_path):
    """DeepSeek-OCR as released (its own code's config: language_config a DeepSeek-V2 without latent attention) reads
    as DeepSeek-OCR 2's language model: transformers' DeepSeek-OCR 2 class's logits for the same model."""
    import kiln
    write_deepseek_ocr_released(tmp_path / "hf")
    (note,) = [n for n in load(tmp_path / "hf").notes if "language model" in n]
    assert note.startswith("DeepSeek-OCR's language model (deepseek_v2 without latent attention) only"), note
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, write_widened(*deepseek_ocr_case(), tmp_path / "ref", seed=1), IDS, TOL)


def test_nemotron_omni_as_released_names_its_language_model_llm_config(tmp_path):
    """Nemotron 3 Nano Omni's released config.json holds the language model's config as llm_config (transformers:
    text_config); either reads the same, its tensors under `backbone.` as Nemotron-H's own checkpoints name them."""
    _write("nemotron-omni", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    cfg = json.loads(path.read_text())
    expected = load(tmp_path / "hf")
    released = {k: v for k, v in cfg.items() if k != "text_config"}
    path.write_text(json.dumps(dict(released, llm_config=cfg["text_config"])))
    source = load(tmp_path / "hf")
    assert source.hf_config == expected.hf_config and source.hf_config["model_type"] == "nemotron_h"
    assert "backbone.embeddings.weight" in source.weights.names() and "lm_head.weight" in source.weights.names()
    assert not any(n.startswith(("model.", "language_model.")) for n in source.weights.names())
