"""Qwen (the first: QWenLMHeadModel, its own code's checkpoints) reads as Qwen2 under GPT-2's names: q0f32 on the
CPU gives transformers' Qwen2 logits for the same weights (transformers has no class of it), from its Hugging Face
layout (the context capped at seq_length where its log-n attention or dynamic NTK would act past it) and from a GGUF
of llama.cpp's qwen architecture (q, k and v as one attn_qkv; its converter needs Qwen's tiktoken tokenizer, so the
file is the test writer's qwen2 GGUF with its tensors and keys as the qwen converter writes them)."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import kiln
from gguf_writer import write_gguf
from kiln.models import ModelLoadError, build, load
from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(13).integers(0, 500, size=19).tolist()
QWEN2 = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=256, rms_norm_eps=1e-6, eos_token_id=2, bos_token_id=1,
             tie_word_embeddings=False)


def write_qwen(dest, **config):
    """The test's Qwen2 (returned) saved in Qwen's layout at dest / "hf" (its own at dest / "qwen2")."""
    ref = write_widened("Qwen2ForCausalLM", "Qwen2Config", QWEN2, dest / "qwen2", seed=2)
    tensors, hf = load_file(str(dest / "qwen2" / "model.safetensors")), dest / "hf"
    out = {"transformer.wte.weight": tensors["model.embed_tokens.weight"], "lm_head.weight": tensors["lm_head.weight"],
           "transformer.ln_f.weight": tensors["model.norm.weight"]}
    for i in range(QWEN2["num_hidden_layers"]):
        k, h = f"model.layers.{i}", f"transformer.h.{i}"
        for p in ("weight", "bias"):
            out[f"{h}.attn.c_attn.{p}"] = np.concatenate([tensors[f"{k}.self_attn.{x}_proj.{p}"] for x in "qkv"])
        out.update({f"{h}.attn.c_proj.weight": tensors[f"{k}.self_attn.o_proj.weight"],
                    f"{h}.ln_1.weight": tensors[f"{k}.input_layernorm.weight"],
                    f"{h}.ln_2.weight": tensors[f"{k}.post_attention_layernorm.weight"],
                    f"{h}.mlp.w1.weight": tensors[f"{k}.mlp.up_proj.weight"],
                    f"{h}.mlp.w2.weight": tensors[f"{k}.mlp.gate_proj.weight"],
                    f"{h}.mlp.c_proj.weight": tensors[f"{k}.mlp.down_proj.weight"]})
    hf.mkdir()
    save_file(out, str(hf / "model.safetensors"), metadata={"format": "pt"})
    (hf / "config.json").write_text(json.dumps(dict(dict(
        architectures=["QWenLMHeadModel"], model_type="qwen", vocab_size=512, hidden_size=64, intermediate_size=192,
        num_hidden_layers=2, num_attention_heads=4, kv_channels=16, layer_norm_epsilon=1e-6, rotary_emb_base=10000.0,
        rotary_pct=1.0, max_position_embeddings=256, seq_length=128, use_logn_attn=True, use_dynamic_ntk=True,
        no_bias=True, tie_word_embeddings=False, eos_token_id=2, bos_token_id=1), **config)))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf / name).write_bytes((dest / "qwen2" / name).read_bytes())
    return ref


def test_qwen_matches_qwen2_in_transformers(tmp_path):
    ref = write_qwen(tmp_path)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    config = load(tmp_path / "hf")
    _, built, _ = build(config)
    assert built.context_window_size == 128 and built.intermediate_size == 96
    assert any("capped at seq_length (128 tokens)" in n for n in built.notes)


def test_qwen_gguf_matches_qwen2_in_transformers(tmp_path):
    ref = write_qwen(tmp_path)
    qwen2 = write_gguf(tmp_path / "qwen2", tmp_path / "qwen2.gguf")
    art = kiln.compile(str(_as_qwen(qwen2, tmp_path / "qwen.gguf")), target="cpu", quant="q0f32",
                       output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)


def test_qwen_with_biases_everywhere_is_refused(tmp_path):
    write_qwen(tmp_path, no_bias=False)
    with pytest.raises(ModelLoadError, match="Qwen with no_bias false is not supported"):
        build(load(tmp_path / "hf"))


def _as_qwen(src, dest):
    """A qwen2 GGUF as llama.cpp's qwen converter writes the same model: general.architecture qwen, its keys under
    qwen. (feed_forward_length Qwen's intermediate_size, twice each half's), q, k and v (and their biases) as one
    attn_qkv."""
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dest), "qwen")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        name = field.name.replace("qwen2.", "qwen.", 1) if field.name.startswith("qwen2.") else field.name
        if name == "qwen.attention.head_count_kv":
            continue                                        # the qwen converter writes none (multi-head)
        value, kind = field.contents(), field.types[0]
        if name == "qwen.feed_forward_length":
            value *= 2                                      # Qwen's intermediate_size: w1's and w2's together
        if kind == gguf.GGUFValueType.ARRAY:
            w.add_array(name, value)
        else:
            w.add_key_value(name, value, kind)
    tensors = {t.name: np.array(t.data) for t in reader.tensors}
    for i in range(int(reader.fields["qwen2.block_count"].contents())):
        for p in ("weight", "bias"):
            w.add_tensor(f"blk.{i}.attn_qkv.{p}", np.concatenate([tensors.pop(f"blk.{i}.attn_{x}.{p}") for x in "qkv"]))
    for name, value in tensors.items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dest
