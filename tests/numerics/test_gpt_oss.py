"""gpt-oss as OpenAI released it: experts in MXFP4 (models/gpt_oss.py). The decoder against transformers'
own (integrations/mxfp4.py), and a checkpoint whose experts are MXFP4 codes against transformers running
the same values in float (the float model is tests/numerics/test_families.py's gpt-oss case) and against
transformers reading the MXFP4 checkpoint itself (the golden logits: Mxfp4Config(dequantize=True))."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln.models.gpt_oss import mxfp4_decode
from kiln.runtime import Artifact
from test_families import IDS, TOL, write_family
from tiny_models import assert_prefill_and_decode_match

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time


def _codes(rng, rows: int, cols: int, experts: int):
    """Random MXFP4 blocks [experts, rows, cols / 32, 16] and scales (2^-7 to 2^-3) for a [rows, cols] weight."""
    blocks = rng.integers(0, 256, size=(experts, rows, cols // 32, 16), dtype=np.uint8)
    scales = rng.integers(120, 125, size=(experts, rows, cols // 32), dtype=np.uint8)
    return blocks, scales


def test_mxfp4_decode_matches_transformers():
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    blocks, scales = _codes(np.random.default_rng(0), 6, 64, 3)
    blocks[0, 0, 0, :4] = [0x00, 0x08, 0x7F, 0xF7]             # +0, -0, 6 and -6 beside each other
    theirs = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    np.testing.assert_array_equal(mxfp4_decode(blocks, scales), theirs.transpose(1, 2).numpy())


def _mxfp4_checkpoint(tmp_path, **overrides):
    """(transformers' float model, a checkpoint dir of it whose experts are random MXFP4 codes as OpenAI stores
    them): the float model runs the codes' values."""
    import torch
    from safetensors.numpy import save_file
    ref = write_family("gpt-oss", tmp_path / "float", intermediate_size=64, **overrides)
    cfg = ref.config
    rng = np.random.default_rng(1)
    tensors = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    for i, layer in enumerate(ref.model.layers):
        experts, key = layer.mlp.experts, f"model.layers.{i}.mlp.experts"
        for name, rows, cols in (("gate_up_proj", 2 * cfg.intermediate_size, cfg.hidden_size),
                                 ("down_proj", cfg.hidden_size, cfg.intermediate_size)):
            blocks, scales = _codes(rng, rows, cols, cfg.num_local_experts)
            with torch.no_grad():                   # the reference runs the codes' values, in its [in, out] layout
                getattr(experts, name).copy_(torch.from_numpy(mxfp4_decode(blocks, scales).transpose(0, 2, 1)))
            del tensors[f"{key}.{name}"]
            tensors[f"{key}.{name}_blocks"], tensors[f"{key}.{name}_scales"] = blocks, scales
    dest = tmp_path / "mxfp4"
    dest.mkdir()
    for f in (tmp_path / "float").iterdir():
        if f.suffix != ".safetensors":
            (dest / f.name).write_bytes(f.read_bytes())
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((dest / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (dest / "config.json").write_text(json.dumps(config))
    return ref, dest


def test_mxfp4_checkpoint_matches_transformers_on_its_values(tmp_path):
    ref, dest = _mxfp4_checkpoint(tmp_path)
    art = kiln.compile(str(dest), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, TOL)
    report = kiln.check(art)            # the golden logits: transformers' own MXFP4 reading (dequantized)
    assert report.ok and report.reference.startswith("transformers"), report.table()
    # --quant auto keeps the stored experts: as-stored, 8-bit with power-of-two scales (exact)
    art = kiln.compile(str(dest), target="cpu", quant="auto", output=tmp_path / "stored")
    quant = Artifact.load(art).config.quantization
    assert quant["name"] == "as-stored" and quant["tensors"]["model.layers.1.mlp.experts_gate_up.weight"] == "q8"
    report = kiln.check(art)
    assert report.ok and max(p.max_logit_error for p in report.prompts) < TOL, report.table()


def test_mxfp4_gguf_matches_transformers_on_its_values(tmp_path):
    """The same codes as llama.cpp's converter writes them (ggml's MXFP4 blocks, gate and up apart, read back by
    gguf-py's own MXFP4 decoder): the GGUF's logits equal transformers' on the codes' values. The clamp is
    gpt-oss's 7, the one llama.cpp's graph runs."""
    from gguf import GGMLQuantizationType, GGUFReader

    from gguf_writer import write_gguf
    ref, dest = _mxfp4_checkpoint(tmp_path, swiglu_limit=7.0)
    path = write_gguf(dest, tmp_path / "oss.gguf")
    types = {t.name: t.tensor_type for t in GGUFReader(path).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.1.ffn_down_exps.weight"] == GGMLQuantizationType.MXFP4
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, TOL)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
    # as stored (--quant auto): the MXFP4 experts as q8 with power-of-two scales, which hold their values exactly
    art = kiln.compile(str(path), target="cpu", quant="auto", output=tmp_path / "stored")
    tensors = Artifact.load(art).config.quantization["tensors"]
    assert {tensors[f"model.layers.{i}.mlp.experts_{w}.weight"] for i in (0, 1) for w in ("gate_up", "down")} == {"q8"}
    report = kiln.check(art)
    assert report.ok and max(p.max_logit_error for p in report.prompts) < TOL, report.table()


def test_mxfp4_is_refused_outside_gpt_oss(tmp_path):
    from kiln.models import ModelLoadError, load
    write_family("qwen3-tied", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "quantization_config": {"quant_method": "mxfp4"}}))
    with pytest.raises(ModelLoadError, match="mxfp4, which kiln reads for gpt-oss's experts only"):
        load(tmp_path / "hf")
