"""BitNet b1.58 (models/bitnet.py) against transformers: a tiny model whose decoder Linears are ternary, packed four
rows a byte as bitnet-b1.58-2B-4T is (quantization_config bitnet, BitLinear), compiled q0f32 for the CPU, gives
transformers' logits within 1e-4 (every prefill position, the last-token prefill, 5 decode steps: each Linear's input
rounded to 8 bits a token in the graph, the sub-norms, squared ReLU) and passes `kiln check`; each stored form
(BitLinear's packed codes over weight_scale, AutoBitLinear's codes times it, AutoBitLinear online's float weights)
reads as the weight transformers' layer multiplies by; configurations kiln does not compute are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln.models import ModelLoadError, build, load
from kiln.models.bitnet import ternary_of
from kiln.runtime.check import ROUNDED_ACTIVATIONS
from tiny_models import assert_prefill_and_decode_match, write_tokenizer

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=1,
              tie_word_embeddings=True)
IDS = np.random.default_rng(10).integers(3, 500, size=19).tolist()
PACKED = {"quant_method": "bitnet", "linear_class": "bitlinear", "quantization_mode": "offline"}


def _ternary(w, torch):
    """transformers' WeightQuant's codes and scale (s = 1 / mean|W|; W ~ round(W s).clip(-1, 1) / s)."""
    scale = 1.0 / w.abs().mean().clamp(min=1e-5)
    return (w * scale).round().clamp(-1, 1), scale


def _write_packed(dest, seed: int = 0):
    """A random BitNet (norm weights around 1) with its decoder Linears ternary and packed as the released
    checkpoint's (BitLinear: uint8 codes, four rows a byte, the output divided by weight_scale)."""
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers.integrations.bitnet import pack_weights
    torch.manual_seed(seed)
    model = transformers.BitNetForCausalLM(transformers.BitNetConfig(**CONFIG))
    tensors = {}
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08 if p.ndim == 2 else 0.3).add_(1.0 if p.ndim == 1 else 0.0)
        for name, p in model.state_dict().items():
            if p.ndim == 2 and ".layers." in name:
                codes, scale = _ternary(p, torch)
                tensors[name] = pack_weights(codes.to(torch.int8))      # it adds the 1 itself
                tensors[name.replace(".weight", ".weight_scale")] = scale.reshape(1)
            else:
                tensors[name] = p.clone()
    dest.mkdir(parents=True)
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    config = dict(model.config.to_dict(), architectures=["BitNetForCausalLM"], quantization_config=PACKED)
    (dest / "config.json").write_text(json.dumps(config))
    write_tokenizer(dest, CONFIG["vocab_size"])
    return transformers.AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32).eval()


def test_packed_bitnet_matches_transformers(tmp_path):
    import torch
    ref = _write_packed(tmp_path / "hf")
    assert type(ref.model.layers[0].self_attn.q_proj).__name__ == "BitLinear"
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    with torch.compiler.set_stance("force_eager"):      # transformers compiles BitLinear's steps with inductor
        assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    report = kiln.check(art)        # a value within float32's rounding of a grid midpoint may round either way
    assert report.tolerance == ROUNDED_ACTIVATIONS
    assert report.ok and report.reference.startswith("transformers"), report.table()


@pytest.mark.parametrize("form", ["bitlinear", "autobitlinear", "online"])
def test_each_stored_form_reads_as_the_weight_transformers_multiplies_by(form):
    """Against transformers' own layer: y = layer(x) equals x's 8-bit rounding (per token) times kiln's weight."""
    import torch
    from transformers.integrations.bitnet import AutoBitLinear, BitLinear, pack_weights
    torch.manual_seed(1)
    w = torch.randn(16, 24) * 0.1
    codes, scale = _ternary(w, torch)
    if form == "bitlinear":
        layer = BitLinear(24, 16, bias=False, dtype=torch.float32)
        layer.weight.copy_(pack_weights(codes.to(torch.int8)))
        layer.weight_scale.fill_(scale)
        stored, stored_scale = layer.weight.numpy(), layer.weight_scale.numpy()
    else:
        layer = AutoBitLinear(24, 16, bias=False, dtype=torch.float32, online_quant=form == "online")
        with torch.no_grad():
            layer.weight.copy_(w if form == "online" else codes)
            if form == "autobitlinear":
                layer.weight_scale.fill_(1.0 / scale)
        stored, stored_scale = layer.weight.detach().numpy(), getattr(layer, "weight_scale", None)
    x = torch.randn(5, 24)
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        expected = layer(x).numpy()
    peak = np.maximum(np.abs(x.numpy()).max(-1, keepdims=True), 1e-5)
    s = (127.0 / peak).astype(np.float32)
    rounded = np.clip(np.round(x.numpy() * s), -128, 127) / s
    weight = ternary_of(stored, None if stored_scale is None else np.asarray(stored_scale), form, 16)
    np.testing.assert_allclose(rounded @ weight.T, expected, atol=1e-5, rtol=1e-5)
    assert set(np.unique(np.round(weight * float(scale)))) <= {-1.0, 0.0, 1.0}


def test_refusals(tmp_path):
    _write_packed(tmp_path / "hf", seed=2)
    path = tmp_path / "hf" / "config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps(dict(cfg, quantization_config=dict(PACKED, use_rms_norm=True))))
    with pytest.raises(ModelLoadError, match="use_rms_norm .* not supported"):
        build(load(tmp_path / "hf"))
    path.write_text(json.dumps(dict(cfg, quantization_config=dict(PACKED, quantization_mode="online"))))
    with pytest.raises(ModelLoadError, match="bitlinear holds packed ternary weights"):
        build(load(tmp_path / "hf"))
    path.write_text(json.dumps(dict(cfg, model_type="llama", architectures=["LlamaForCausalLM"])))
    with pytest.raises(ModelLoadError, match="bitnet, which kiln reads for BitNet models only"):
        load(tmp_path / "hf")


def test_gguf_bitnet_reads_as_transformers_bitnet_online(tmp_path):
    """llama.cpp's GGUF bitnet (1bitLLM's bitnet_b1_58: SiLU-gated) as its converter writes it from the float master
    weights, each decoder Linear made ternary (round(W s).clip(-1, 1) / s): kiln reads it as transformers' BitNet
    (AutoBitLinear, every output scale 1), and the logits equal transformers' BitNet run online on the master weights
    (the same rounding, each Linear's input rounded to 8 bits a token) within 1e-4; `kiln check` passes against
    transformers on the tensors kiln read."""
    import torch
    import transformers
    from gguf_writer import write_gguf
    from safetensors.torch import save_file
    from kiln.models.gguf import load_gguf
    torch.manual_seed(3)
    model = transformers.BitNetForCausalLM(transformers.BitNetConfig(**CONFIG, hidden_act="silu"))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08 if p.ndim == 2 else 0.3).add_(1.0 if p.ndim == 1 else 0.0)
    dest = tmp_path / "hf"
    dest.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              str(dest / "model.safetensors"), metadata={"format": "pt"})
    online = dict(PACKED, linear_class="autobitlinear", quantization_mode="online")
    (dest / "config.json").write_text(json.dumps(dict(model.config.to_dict(), architectures=["BitNetForCausalLM"],
                                                      quantization_config=online)))
    write_tokenizer(dest, CONFIG["vocab_size"])
    ref = transformers.AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32).eval()
    assert type(ref.model.layers[0].mlp.down_proj).__name__ == "AutoBitLinear"
    path = write_gguf(dest, tmp_path / "bitnet.gguf")
    source = load_gguf(path)
    assert source.hf_config["quantization_config"]["linear_class"] == "autobitlinear"
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    with torch.compiler.set_stance("force_eager"):
        assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
