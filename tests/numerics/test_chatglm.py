"""ChatGLM's own format (models/glm.py ChatGLMConfig: ChatGLM2 / ChatGLM3 / glm-4-9b-chat as first released, their
code's ChatGLMModel) q0f32 on the CPU. transformers' Glm is the same model converted (glm-4-9b-chat-hf): a tiny Glm's
weights written under ChatGLM's names and config keys must give that Glm's logits."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import kiln
from kiln.models import ModelLoadError, build, load
from tiny_models import assert_prefill_and_decode_match, write_tokenizer, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(17).integers(0, 500, size=17).tolist()
RATIO = 5.0                     # rope_ratio: RoPE's base 10000 x it (GLM-4-9B-chat-1m's 500)
GLM = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=256, pad_token_id=0,
           eos_token_id=2, bos_token_id=1, tie_word_embeddings=False,
           rope_parameters=dict(rope_type="default", rope_theta=10000.0 * RATIO, partial_rotary_factor=0.5))


def write_chatglm(dest, **config):
    """A tiny transformers Glm saved in ChatGLM's own format (its tensor names, q/k/v and gate/up fused, its config
    keys; `config` overrides them); returns the Glm."""
    from safetensors.torch import save_file
    glm = write_widened("GlmForCausalLM", "GlmConfig", GLM, dest / "glm", seed=3)
    w, out = glm.state_dict(), {"transformer.rotary_pos_emb.inv_freq": torch.ones(4)}   # a buffer it saves
    for i in range(GLM["num_hidden_layers"]):
        k, h = f"model.layers.{i}", f"transformer.encoder.layers.{i}"
        out.update({f"{h}.input_layernorm.weight": w[f"{k}.input_layernorm.weight"],
                    f"{h}.post_attention_layernorm.weight": w[f"{k}.post_attention_layernorm.weight"],
                    f"{h}.self_attention.dense.weight": w[f"{k}.self_attn.o_proj.weight"],
                    f"{h}.mlp.dense_h_to_4h.weight": w[f"{k}.mlp.gate_up_proj.weight"],
                    f"{h}.mlp.dense_4h_to_h.weight": w[f"{k}.mlp.down_proj.weight"]})
        for p in ("weight", "bias"):
            out[f"{h}.self_attention.query_key_value.{p}"] = torch.cat([w[f"{k}.self_attn.{x}_proj.{p}"]
                                                                        for x in "qkv"])
    out.update({"transformer.embedding.word_embeddings.weight": w["model.embed_tokens.weight"],
                "transformer.encoder.final_layernorm.weight": w["model.norm.weight"],
                "transformer.output_layer.weight": w["lm_head.weight"]})
    own = dest / "chatglm"
    own.mkdir()
    save_file({k: v.contiguous() for k, v in out.items()}, str(own / "model.safetensors"), metadata={"format": "pt"})
    (own / "config.json").write_text(json.dumps({
        "architectures": ["ChatGLMModel"], "model_type": "chatglm", "add_bias_linear": False, "add_qkv_bias": True,
        "apply_residual_connection_post_layernorm": False, "ffn_hidden_size": GLM["intermediate_size"],
        "hidden_size": GLM["hidden_size"], "kv_channels": GLM["head_dim"], "layernorm_epsilon": GLM["rms_norm_eps"],
        "multi_query_attention": True, "multi_query_group_num": GLM["num_key_value_heads"],
        "num_attention_heads": GLM["num_attention_heads"], "num_layers": GLM["num_hidden_layers"],
        "original_rope": True, "padded_vocab_size": GLM["vocab_size"], "post_layer_norm": True, "rmsnorm": True,
        "rope_ratio": RATIO, "seq_length": GLM["max_position_embeddings"], "tie_word_embeddings": False,
        "eos_token_id": 2, "pad_token_id": 0, **config}))
    write_tokenizer(own, GLM["vocab_size"])
    return glm


def test_chatglm_in_its_own_format_is_transformers_glm(tmp_path):
    ref = write_chatglm(tmp_path)
    art = kiln.compile(str(tmp_path / "chatglm"), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    assert kiln.check(art).ok


@pytest.mark.parametrize("config, message", [
    (dict(position_encoding_2d=True), "the first ChatGLM-6B"),
    (dict(add_bias_linear=True), "add_bias_linear True is not supported"),
])
def test_other_chatglm_layouts_are_refused(config, message, tmp_path):
    write_chatglm(tmp_path, **config)
    with pytest.raises(ModelLoadError, match=message):
        build(load(tmp_path / "chatglm"))


def test_chatglms_own_tokenizer_files_are_not_taken_for_its_tokenizer(tmp_path):
    """Its code adds the special tokens and the [gMASK]<sop> prefix: without a tokenizer.json kiln builds none from
    its tokenizer.model (a plain SentencePiece would lose them) and names the -hf release's tokenizer.json instead."""
    write_chatglm(tmp_path)
    (tmp_path / "chatglm" / "tokenizer.json").unlink()
    (tmp_path / "chatglm" / "tokenizer.model").write_bytes(b"not read")
    notes = " ".join(load(tmp_path / "chatglm").notes)
    assert "ChatGLM's own" in notes and "--tokenizer" in notes and "token ids only" in notes
