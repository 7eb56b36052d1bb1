"""LoRA adapters merged at compile time (models/lora.py, `kiln compile BASE --lora ADAPTER`): a tiny Llama with a
PEFT adapter (every Linear adapted, one module at its own rank and alpha, the embedding replaced by
modules_to_save) compiled q0f32 for the CPU gives PEFT's unmerged forward (W x + scale B A x) within 1e-4 and
passes `kiln check`; the merge equals PEFT's merge_and_unload for rsLoRA, alpha_pattern, a Conv1D base
(fan_in_fan_out) and embedding adapters; a merged tensor loses its stored quantized form; adapters kiln does
not merge, or trained on another model, are refused naming why."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln.models import ModelLoadError, load
from kiln.models.lora import with_adapter
from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
LLAMA = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=1)
IDS = np.random.default_rng(12).integers(3, 500, size=19).tolist()


def _adapter(base, dest, seed: int = 0, **lora):
    """A PEFT adapter on `base` with random A and B (init_lora_weights=False: B is not zero), saved to dest;
    returns the PeftModel (its forward unmerged)."""
    import peft
    import torch
    torch.manual_seed(seed)
    model = peft.get_peft_model(base, peft.LoraConfig(init_lora_weights=False, **lora))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.mul_(4.0)                 # updates as large as the weights: a wrong scale or layout shows
    model.save_pretrained(dest)
    return model.eval()


def test_an_adapted_llama_matches_peft(tmp_path):
    base = write_widened("LlamaForCausalLM", "LlamaConfig", LLAMA, tmp_path / "base", seed=1)
    peft_model = _adapter(base, tmp_path / "adapter", r=4, lora_alpha=8, target_modules="all-linear",
                          rank_pattern={"down_proj": 2}, alpha_pattern={"q_proj": 16},
                          modules_to_save=["embed_tokens"])
    art = kiln.compile(str(tmp_path / "base"), target="cpu", quant="q0f32", output=tmp_path / "art",
                       lora=tmp_path / "adapter")
    assert_prefill_and_decode_match(art, peft_model, IDS, 1e-4)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
    notes = json.loads((art / "kiln-config.json").read_text())["notes"]
    assert any("LoRA adapter adapter merged: 14 weights (rank 2/4, lora_alpha 8), 1 replaced" in n for n in notes)
    assert art.name == "art"


@pytest.mark.parametrize("case", ["rslora", "gpt2-conv1d", "embedding"])
def test_the_merge_is_peft_merge_and_unload(case, tmp_path):
    if case == "gpt2-conv1d":
        base = write_widened("GPT2LMHeadModel", "GPT2Config", dict(vocab_size=512, n_embd=64, n_layer=2, n_head=4,
                                                                     n_positions=128), tmp_path / "base", seed=2)
        lora = dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True)
    else:
        base = write_widened("LlamaForCausalLM", "LlamaConfig", LLAMA, tmp_path / "base", seed=2)
        lora = dict(r=8, lora_alpha=4, use_rslora=True, target_modules=["q_proj", "v_proj"],
                    alpha_pattern={"layers.1.self_attn.v_proj": 32}) if case == "rslora" else \
            dict(r=4, lora_alpha=8, target_modules=["embed_tokens", "o_proj"])
    peft_model = _adapter(base, tmp_path / "adapter", seed=3, **lora)
    merged = {n: t.detach().numpy() for n, t in peft_model.merge_and_unload().state_dict().items()}
    source = with_adapter(load(tmp_path / "base"), tmp_path / "adapter")
    changed = 0
    for name in source.weights.names():
        got = source.weights.get(name)
        np.testing.assert_allclose(got, merged[name], atol=1e-5, rtol=1e-5, err_msg=name)
        changed += source.weights.merged(name)
    assert changed == {"rslora": 4, "gpt2-conv1d": 8, "embedding": 3}[case]


def test_a_merged_gguf_tensor_loses_its_stored_form(tmp_path):
    """A GGUF base: the adapted tensors read as float32 (their blocks no longer hold them), the others keep
    their GGUF type and raw blocks for --quant as-stored."""
    from gguf_writer import write_gguf
    base = write_widened("LlamaForCausalLM", "LlamaConfig", LLAMA, tmp_path / "base", seed=4)
    gguf_path = write_gguf(tmp_path / "base", tmp_path / "m.gguf", default="Q8_0")
    _adapter(base, tmp_path / "adapter", seed=5, r=4, lora_alpha=8, target_modules=["q_proj"])
    plain, source = load(gguf_path), with_adapter(load(gguf_path), tmp_path / "adapter")
    q = "model.layers.0.self_attn.q_proj.weight"
    k = "model.layers.0.self_attn.k_proj.weight"
    assert source.weights.tensor_type(q) == "F32" and not source.weights.has_raw(q)
    assert source.weights.tensor_type(k) == plain.weights.tensor_type(k) != "F32" and source.weights.has_raw(k)
    assert not np.allclose(source.weights.get(q), plain.weights.get(q))
    np.testing.assert_array_equal(source.weights.get(k), plain.weights.get(k))
    assert source.content_hash != plain.content_hash and source.adapter == str(tmp_path / "adapter")


def test_adapters_kiln_does_not_merge_are_refused(tmp_path):
    base = write_widened("LlamaForCausalLM", "LlamaConfig", LLAMA, tmp_path / "base", seed=6)
    _adapter(base, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=["q_proj"])
    source = load(tmp_path / "base")
    with pytest.raises(ModelLoadError, match="has no adapter_config.json: --lora takes a PEFT LoRA adapter"):
        with_adapter(source, tmp_path / "base")
    cfg_path = tmp_path / "adapter" / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps(dict(cfg, use_dora=True)))
    with pytest.raises(ModelLoadError, match=r"uses DoRA .* merge_and_unload"):
        with_adapter(source, tmp_path / "adapter")
    cfg_path.write_text(json.dumps(cfg))
    other = write_widened("LlamaForCausalLM", "LlamaConfig", dict(LLAMA, hidden_size=32, intermediate_size=48),
                          tmp_path / "other", seed=7)
    del other
    with pytest.raises(ModelLoadError, match="trained on another model"):
        with_adapter(load(tmp_path / "other"), tmp_path / "adapter").weights.get(
            "model.layers.0.self_attn.q_proj.weight")
    with pytest.raises(ValueError, match="has no adapter_config.json"):
        kiln.compile(str(tmp_path / "base"), target="cpu", quant="q0f32", output=tmp_path / "art",
                     lora=tmp_path / "nowhere")
    assert not (tmp_path / "art").exists()


def test_an_adapter_folder_is_a_model_argument(tmp_path):
    """An adapter folder naming a local base (base_model_name_or_path) loads as that base with it merged, so every
    command that takes MODEL (compile, generate, chat, serve, bench) takes the adapter; a base kiln cannot reach
    is refused naming --lora."""
    from kiln.compiler.build import default_name
    base = write_widened("LlamaForCausalLM", "LlamaConfig", LLAMA, tmp_path / "base", seed=8)
    _adapter(base, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"])
    cfg_path = tmp_path / "adapter" / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps(dict(cfg, base_model_name_or_path="../base")))
    given, merged = load(tmp_path / "adapter"), with_adapter(load(tmp_path / "base"), tmp_path / "adapter")
    assert given.content_hash == merged.content_hash and given.path == tmp_path / "base"
    name = "model.layers.1.mlp.down_proj.weight"
    np.testing.assert_array_equal(given.weights.get(name), merged.weights.get(name))
    assert default_name(given, "q4f32", "cpu") == "base-adapter-q4f32-cpu"
    cfg_path.write_text(json.dumps(dict(cfg, base_model_name_or_path="HuggingFaceTB/SmolLM2-135M")))
    with pytest.raises(ModelLoadError, match=r"base model \(HuggingFaceTB/SmolLM2-135M\) is not a local path .*"
                                             r"kiln compile BASE --lora"):
        load(tmp_path / "adapter")


def _gguf_adapter(peft_dir, base_cfg: dict, dest):
    """llama.cpp's convert_lora_to_gguf.py output for a PEFT adapter on a Llama: each adapted tensor's lora_a and
    lora_b under its GGUF name, q's and k's B rows permuted as LlamaModel permutes the base's."""
    import gguf
    from safetensors.numpy import load_file
    tensors = load_file(str(peft_dir / "adapter_model.safetensors"))
    cfg = json.loads((peft_dir / "adapter_config.json").read_text())
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, base_cfg["num_hidden_layers"])
    heads = {"q_proj": base_cfg["num_attention_heads"], "k_proj": base_cfg["num_key_value_heads"]}
    w = gguf.GGUFWriter(str(dest), "llama")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(cfg["lora_alpha"]))
    for name, a in tensors.items():
        if ".lora_A." not in name:
            continue
        module = name[len("base_model.model."):].replace(".lora_A.weight", "")
        b = tensors[name.replace("lora_A", "lora_B")]
        n = next((n for part, n in heads.items() if module.endswith(part)), 0)
        if n:                                           # LlamaModel.permute of B's rows
            b = b.reshape(n, 2, b.shape[0] // n // 2, -1).swapaxes(1, 2).reshape(b.shape)
        base = names.get_name(f"{module}.weight", try_suffixes=(".weight",))
        w.add_tensor(f"{base}.lora_a", np.ascontiguousarray(a, np.float32))
        w.add_tensor(f"{base}.lora_b", np.ascontiguousarray(b, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dest


def test_a_gguf_adapter_on_a_gguf_base_matches_peft(tmp_path):
    """llama.cpp's way end to end: the base's GGUF and the adapter's, compiled, give PEFT's forward on the
    float base; the GGUF adapter merges into the same weights as its PEFT folder does."""
    from gguf_writer import write_gguf
    base = write_widened("LlamaForCausalLM", "LlamaConfig", LLAMA, tmp_path / "base", seed=9)
    peft_model = _adapter(base, tmp_path / "adapter", seed=10, r=4, lora_alpha=8,
                          target_modules=["q_proj", "k_proj", "o_proj", "up_proj"])
    adapter = _gguf_adapter(tmp_path / "adapter", LLAMA, tmp_path / "adapter.gguf")
    hf_peft, hf_gguf = (with_adapter(load(tmp_path / "base"), a) for a in (tmp_path / "adapter", adapter))
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                 "model.layers.1.mlp.up_proj.weight"):
        np.testing.assert_allclose(hf_gguf.weights.get(name), hf_peft.weights.get(name), atol=1e-6, rtol=0)
    base_gguf = write_gguf(tmp_path / "base", tmp_path / "base.gguf")
    art = kiln.compile(str(base_gguf), target="cpu", quant="q0f32", output=tmp_path / "art", lora=adapter,
                       golden=False)
    assert_prefill_and_decode_match(art, peft_model, IDS, 1e-4)
    with pytest.raises(ModelLoadError, match="is not a LoRA adapter GGUF"):
        with_adapter(load(tmp_path / "base"), base_gguf)
