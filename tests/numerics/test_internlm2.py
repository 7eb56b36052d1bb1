"""InternLM 2 / 2.5 (models/llama.py InternLM2Config): a tiny Llama re-saved as InternLM 2's own code saves it
(wqkv with its rows grouped by KV head, its names, `bias`, dynamic NTK RoPE) compiles q0f32 for the CPU to the
Llama's logits within 1e-4 (every prefill position, the last-token prefill, 5 decode steps), with biases and (as
InternVL 2's language model) without; its GGUF (llama.cpp's converter splits wqkv into a Llama's q, k, v) reads as a Llama and matches too."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import kiln
from kiln.models import build, load
from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
LLAMA = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=1)
IDS = np.random.default_rng(13).integers(3, 500, size=19).tolist()
NAMES = {"model.embed_tokens": "model.tok_embeddings", "lm_head": "output", "input_layernorm": "attention_norm",
         "post_attention_layernorm": "ffn_norm", "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1",
         "mlp.up_proj": "feed_forward.w3", "mlp.down_proj": "feed_forward.w2"}


def _as_internlm2(src, dest, bias: bool) -> None:
    """The Llama at `src` saved as InternLM 2's code saves it (its convert script's layout, inverted)."""
    import shutil
    shutil.copytree(src, dest)
    cfg = json.loads((dest / "config.json").read_text())
    t = load_file(str(dest / "model.safetensors"))
    heads, groups = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, per = cfg["hidden_size"] // heads, heads // groups
    out = {}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        for kind in ("weight", "bias") if bias else ("weight",):
            q, k, v = (t.pop(f"{p}.self_attn.{x}_proj.{kind}") for x in "qkv")
            shape = (groups, per, d, -1) if kind == "weight" else (groups, per, d)
            grouped = np.concatenate([q.reshape(shape), k.reshape((groups, 1, d, -1) if kind == "weight"
                                                                   else (groups, 1, d)),
                                      v.reshape((groups, 1, d, -1) if kind == "weight" else (groups, 1, d))], axis=1)
            out[f"{p}.attention.wqkv.{kind}"] = np.ascontiguousarray(grouped.reshape((-1, cfg["hidden_size"])
                                                                                     if kind == "weight" else -1))
    for name, tensor in t.items():
        for old, new in NAMES.items():
            name = name.replace(old, new)
        out[name] = tensor
    save_file(out, str(dest / "model.safetensors"), metadata={"format": "pt"})
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)      # its config is transformers 4's
    cfg = {k: v for k, v in cfg.items() if k not in ("attention_bias", "mlp_bias", "rope_parameters")}
    (dest / "config.json").write_text(json.dumps(dict(
        cfg, model_type="internlm2", architectures=["InternLM2ForCausalLM"], bias=bias, rope_theta=theta,
        rope_scaling={"type": "dynamic", "factor": 2.0},
        auto_map={"AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"})))


def test_internlm2_is_the_llama_it_was_saved_from(tmp_path):
    """With biases (wqkv's rows regrouped like its weight's); test_internvl2_with_internlm2_inside runs without."""
    ref = write_widened("LlamaForCausalLM", "LlamaConfig", dict(LLAMA, attention_bias=True), tmp_path / "llama",
                        seed=1)
    _as_internlm2(tmp_path / "llama", tmp_path / "internlm2", bias=True)
    _, config, _ = build(load(tmp_path / "internlm2"))
    assert config.rope_scaling is None and any("dynamic NTK" in n for n in config.notes)
    art = kiln.compile(str(tmp_path / "internlm2"), target="cpu", quant="q0f32", output=tmp_path / "art",
                       golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)


def test_internlm2_gguf_reads_as_a_llama(tmp_path):
    from gguf_writer import write_gguf
    ref = write_widened("LlamaForCausalLM", "LlamaConfig", LLAMA, tmp_path / "llama", seed=3)
    path = write_gguf(tmp_path / "llama", tmp_path / "internlm2.gguf", arch="internlm2")
    assert load(path).hf_config["model_type"] == "llama"
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()


def test_internvl2_with_internlm2_inside(tmp_path):
    """InternVL 2 / 2.5 as their code saves them (InternVLChatModel, llm_config an InternLM 2, its tensors under
    language_model.model.* and language_model.output): the InternLM 2 inside (models/vision_text.py)."""
    ref = write_widened("LlamaForCausalLM", "LlamaConfig", LLAMA, tmp_path / "llama", seed=4)
    _as_internlm2(tmp_path / "llama", tmp_path / "internvl", bias=False)
    dest = tmp_path / "internvl"
    llm = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({
        "architectures": ["InternVLChatModel"], "model_type": "internvl_chat", "llm_config": llm,
        "vision_config": {"model_type": "intern_vit_6b", "hidden_size": 32}}))
    tensors = {f"language_model.{n}": t for n, t in load_file(str(dest / "model.safetensors")).items()}
    tensors["mlp1.1.weight"] = np.zeros((64, 32), np.float32)
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    source = load(dest)
    assert source.hf_config["model_type"] == "internlm2" and "output.weight" in source.weights.names()
    art = kiln.compile(str(dest), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
