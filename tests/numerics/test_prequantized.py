"""GPTQ, AWQ and compressed-tensors checkpoints (4-bit, and GPTQ's and compressed-tensors' 8-bit) compiled as
stored: the artifact's planes hold the values the codes stand for bit for bit, and the logits match transformers
float32 on a float model of those values."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import kiln
from kiln import models
from kiln.compiler import quant_pack
from kiln.compiler.quant_modules import QuantFormat
from kiln.runtime import Artifact
from prequantized_writer import write_prequantized
from tiny_models import assert_prefill_and_decode_match, write_tiny_llama

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
IDS = [int(i) for i in np.random.default_rng(3).integers(0, 512, size=19)]
CASES = {   # name -> (write_prequantized's arguments, --quant, the kiln format of every quantized weight)
    "gptq-v1": (dict(method="gptq", group=32), "auto", "q4m"),
    "gptq-sym-g128": (dict(method="gptq", group=128, sym=True), "as-stored", "q4g64"),   # K 64 / 192: groups of 64
    "awq-f16": (dict(method="awq", group=64), "as-stored-f16", "q4mg64"),
    "compressed-tensors-sym": (dict(method="compressed-tensors", group=64, sym=True, bf16_scales=True), "auto",
                               "q4g64"),
    # 8-bit: Qwen's GPTQ-Int8 releases (zero points: q8m), llm-compressor's W8A16 (symmetric: q8)
    "gptq-int8": (dict(method="gptq", group=32, bits=8), "auto", "q8m"),
    "compressed-tensors-int8-sym": (dict(method="compressed-tensors", group=64, sym=True, bits=8), "auto", "q8g64"),
}
LABEL = {"gptq": "GPTQ", "awq": "AWQ", "compressed-tensors": "compressed-tensors"}


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("pqn") / "float", tied=False, intermediate_size=192)


def _planes_as_values(art: Path) -> dict[str, np.ndarray]:
    """{artifact weight prefix: float32 values} of every quantized weight, dequantized from its planes."""
    artifact = Artifact.load(art)
    params = dict(zip(artifact.config.params, artifact.load_params()))
    out = {}
    for name in (n for n in params if n.endswith(".qweight")):
        prefix = name[: -len(".qweight")]
        planes = {p: params[f"{prefix}.{p}"] for p in ("qweight", "scale", "min") if f"{prefix}.{p}" in params}
        byte = planes["qweight"].dtype in (np.int8, np.uint8)                  # q8 / q8m: a code a byte
        group = planes["qweight"].shape[1] * (1 if byte else 8) // planes["scale"].shape[1]
        kind = ("q8" if byte else "q4") + ("m" if "min" in planes else "")
        fmt = QuantFormat(kind, group, str(planes["scale"].dtype))
        out[prefix] = quant_pack.dequantize(fmt, planes, "float32")
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_prequantized_checkpoint_compiles_bit_exact_and_matches_transformers(case, float_dir, tmp_path):
    layout, quant, kind = CASES[case]
    quantized, values_dir = tmp_path / "q", tmp_path / "values"
    write_prequantized(float_dir, quantized, values_dir, **layout)
    art = kiln.compile(str(quantized), target="cpu", quant=quant, output=tmp_path / "art")
    cfg = json.loads((art / "kiln-config.json").read_text())
    assert cfg["quantization"]["name"] == ("as-stored" if quant == "auto" else quant)
    assert set(cfg["quantization"]["tensors"].values()) == {kind, cfg["quantization"]["dtype"]}
    method = LABEL[layout["method"]]
    assert f"{method} weights kept bit-exact (as-stored): 14 {method} as {kind}" in cfg["notes"]

    values, planes = models.load(values_dir).weights, _planes_as_values(art)
    for i in range(2):
        layer = f"model.layers.{i}"
        qkv = np.concatenate([values.get(f"{layer}.self_attn.{p}_proj.weight") for p in "qkv"])
        gate_up = np.concatenate([values.get(f"{layer}.mlp.{p}_proj.weight") for p in ("gate", "up")])
        for prefix, want in ((f"{layer}.self_attn.qkv_proj", qkv), (f"{layer}.mlp.gate_up_proj", gate_up),
                             (f"{layer}.self_attn.o_proj", values.get(f"{layer}.self_attn.o_proj.weight")),
                             (f"{layer}.mlp.down_proj", values.get(f"{layer}.mlp.down_proj.weight"))):
            np.testing.assert_array_equal(planes[prefix].view(np.uint32), want.view(np.uint32), err_msg=prefix)

    import transformers
    reference = transformers.AutoModelForCausalLM.from_pretrained(values_dir, dtype=torch.float32).eval()
    assert_prefill_and_decode_match(art, reference, IDS, tol=1e-4 if quant != "as-stored-f16" else 1e-2, steps=3)
    assert cfg["golden"]["reference"].endswith(f"float32 ({method} tensors as kiln reads them)"), cfg["golden"]


def test_desc_act_is_requantized_with_a_note(float_dir, tmp_path):
    """GPTQ's act-order puts an input's group anywhere (g_idx): no kiln form holds that, so the weights
    are re-quantized from their exact values (kiln's q4, lossy) and the notes say so."""
    quantized, values_dir = tmp_path / "q", tmp_path / "values"
    write_prequantized(float_dir, quantized, values_dir, method="gptq", group=32, desc_act=True)
    art = kiln.compile(str(quantized), target="cpu", quant="auto", output=tmp_path / "art")
    cfg = json.loads((art / "kiln-config.json").read_text())
    assert any(n.startswith("GPTQ tensors re-quantized to q4 (lossy): model.layers.{0-1}.") for n in cfg["notes"])
    assert set(cfg["quantization"]["tensors"].values()) == {"q4", "float32"}
    planes, values = _planes_as_values(art), models.load(values_dir).weights
    want = values.get("model.layers.0.mlp.down_proj.weight")
    err = np.abs(planes["model.layers.0.mlp.down_proj"] - want).max()
    assert 0 < err < 0.25 * np.abs(want).max()                       # re-rounded, near the values


def test_as_stored_refuses_float_weights(float_dir, tmp_path):
    with pytest.raises(ValueError, match="weights \\(hf\\) are floats; use q4f32, q4f16 or q8f32"):
        kiln.compile(str(float_dir), target="cpu", quant="as-stored", output=tmp_path / "art")


def test_fp8_checkpoint_matches_transformers_reading_it(float_dir, tmp_path):
    """transformers reads a FineGrainedFP8 folder itself (dequantized, on a CPU): the reference is its
    own reading of the same file."""
    from prequantized_writer import write_fp8
    write_fp8(float_dir, tmp_path / "q", tmp_path / "values", "fp8", (32, 64))     # blocks dividing 64 x 192
    art = kiln.compile(str(tmp_path / "q"), target="cpu", quant="q0f32", output=tmp_path / "art")
    cfg = json.loads((art / "kiln-config.json").read_text())
    assert cfg["notes"][0].startswith("FP8 e4m3 weights (blocks of 32 x 64) dequantized to float32")
    import transformers
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q", dtype=torch.float32).eval()
    assert_prefill_and_decode_match(art, reference, IDS, tol=1e-4, steps=3)
    with pytest.raises(ValueError, match="are floats"):
        kiln.compile(str(tmp_path / "q"), target="cpu", quant="as-stored", output=tmp_path / "art2")


@pytest.mark.parametrize("quant_type, double_quant, dtype", [("nf4", True, "bfloat16"), ("fp4", False, "float16")])
def test_bitsandbytes_checkpoint_reads_as_its_values(quant_type, double_quant, dtype, float_dir, tmp_path):
    """A bitsandbytes 4-bit folder (QLoRA's, unsloth's -bnb-4bit) reads as the values bitsandbytes dequantizes it
    to, bit for bit (tests/prequantized_writer.py's layout, checked once against bitsandbytes itself); q0f32 then
    matches transformers on a float model of those values, and auto re-quantizes NF4 / FP4 (no kiln form holds
    their uneven levels) to q4, saying so."""
    from prequantized_writer import write_bnb
    write_bnb(float_dir, tmp_path / "q", tmp_path / "values", quant_type, double_quant, dtype)
    source, values = models.load(tmp_path / "q"), models.load(tmp_path / "values").weights
    assert source.stored_quant == "bitsandbytes" and source.notes[0].startswith(f"bitsandbytes {quant_type.upper()}")
    assert sorted(source.weights.names()) == sorted(values.names())
    for name in values.names():
        got = source.weights.get(name)
        np.testing.assert_array_equal(got.view(np.uint32), values.get(name).view(np.uint32), err_msg=name)
    art = kiln.compile(str(tmp_path / "q"), target="cpu", quant="q0f32", output=tmp_path / "art")
    import transformers
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "values", dtype=torch.float32).eval()
    assert_prefill_and_decode_match(art, reference, IDS, tol=1e-4, steps=3)
    report = kiln.check(art)
    assert report.ok and report.reference.endswith("(bitsandbytes tensors as kiln reads them)"), report.table()
    auto = kiln.compile(str(tmp_path / "q"), target="cpu", quant="auto", output=tmp_path / "auto", golden=False)
    notes = json.loads((auto / "kiln-config.json").read_text())["notes"]
    assert any(n.startswith(f"{quant_type.upper()} tensors re-quantized to q4 (lossy)") for n in notes), notes
