"""models/prequantized.py: GPTQ, AWQ and compressed-tensors folders read as float weights, exactly, and
what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kiln import models
from kiln.models.source import ModelLoadError
from prequantized_writer import write_prequantized
from tiny_models import write_tiny_llama

pytestmark = pytest.mark.unit

LAYOUTS = {   # name -> write_prequantized's arguments
    "gptq-v1": dict(method="gptq", group=32),
    "gptq-v2": dict(method="gptq", group=32, checkpoint_format="gptq_v2"),
    "gptq-sym-ragged": dict(method="gptq", group=128, sym=True),        # K = 64 and 192: groups of 64
    "gptq-desc-act": dict(method="gptq", group=32, desc_act=True),
    "awq": dict(method="awq", group=32),
    "ct-sym-bf16": dict(method="compressed-tensors", group=32, sym=True, bf16_scales=True),
    "ct-asym": dict(method="compressed-tensors", group=32),
    "gptq-int8-v1": dict(method="gptq", group=32, bits=8),                  # Qwen's GPTQ-Int8 releases
    "gptq-int8-sym": dict(method="gptq", group=32, sym=True, bits=8),
    "ct-int8-sym": dict(method="compressed-tensors", group=32, sym=True, bits=8),     # llm-compressor's W8A16
    "ct-int8-asym": dict(method="compressed-tensors", group=32, bits=8),
}
LABEL = {"gptq": "GPTQ", "awq": "AWQ", "compressed-tensors": "compressed-tensors"}


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("pq") / "float", tied=False, intermediate_size=192)


def _written(float_dir: Path, root: Path, layout: str) -> tuple[Path, Path]:
    quantized, reference = root / layout, root / f"{layout}-values"
    write_prequantized(float_dir, quantized, reference, **LAYOUTS[layout])
    return quantized, reference


@pytest.mark.parametrize("container", ["safetensors", "bin"])
@pytest.mark.parametrize("dtype,stored", [(np.float16, "F16"), ("bfloat16", "BF16"), (np.float32, "F32")])
def test_float_tensors_beside_the_codes_keep_their_16_bits_under_as_stored(dtype, stored, container, float_dir,
                                                                            tmp_path):
    """A GPTQ checkpoint's float tensors (its LM head and embeddings: float16, or bfloat16 from a bfloat16
    model) report their stored type, so as-stored keeps them in 16 bits (f16 / bf16), not float32; in
    model.safetensors or in a pytorch_model.bin."""
    import torch
    from safetensors.torch import load_file, save_file
    from kiln.compiler.quantize import get_scheme
    quantized, _ = _written(float_dir, tmp_path, "gptq-v1")
    tensors = load_file(str(quantized / "model.safetensors"))
    float_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.from_numpy(np.zeros(1, dtype)).dtype
    floats = ("lm_head.weight", "model.embed_tokens.weight")          # the codes' scales stay as written
    tensors = {k: v.to(float_dtype) if k in floats else v for k, v in tensors.items()}
    if container == "bin":
        (quantized / "model.safetensors").unlink()
        torch.save(tensors, quantized / "pytorch_model.bin")
    else:
        save_file(tensors, str(quantized / "model.safetensors"))
    source = models.load(quantized)
    assert source.weights.tensor_type("lm_head.weight") == stored
    assert source.weights.tensor_type("model.layers.0.mlp.down_proj.weight") == "GPTQ"
    arch, config, model = models.build(source)
    plan = get_scheme("auto", source).apply(model, source, arch.weight_map(config))
    kinds = {name: fmt.kind if fmt else None for name, fmt in plan.formats.items()}
    half = {"F16": "f16", "BF16": "bf16"}.get(stored)
    assert kinds["lm_head.weight"] == kinds["model.embed_tokens.weight"] == half
    assert kinds["model.layers.0.mlp.down_proj.weight"] == "q4m"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_weights_read_as_the_values_the_codes_stand_for(layout, float_dir, tmp_path):
    quantized, reference = _written(float_dir, tmp_path, layout)
    source, values = models.load(quantized), models.load(reference)
    assert sorted(source.weights.names()) == sorted(values.weights.names())       # .qweight etc. -> .weight
    assert source.stored_quant == LABEL[LAYOUTS[layout]["method"]]
    for name in values.weights.names():
        got, want = source.weights.get(name), values.weights.get(name)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=name)
    q = "model.layers.1.mlp.down_proj.weight"
    form = source.weights.stored_form(q)
    if layout == "gptq-desc-act":
        assert form is None and source.weights.stored_codes(q) is None      # groups out of order: no exact form
    else:
        symmetric, group, bits = form
        assert symmetric == ("-sym" in layout) and group == (64 if layout == "gptq-sym-ragged" else 32)
        assert bits == LAYOUTS[layout].get("bits", 4)
        np.testing.assert_array_equal(source.weights.stored_codes(q).dequantize(), values.weights.get(q))
    assert source.notes[0].startswith(f"{LABEL[LAYOUTS[layout]['method']]} {LAYOUTS[layout].get('bits', 4)}-bit")


@pytest.mark.parametrize("change,message", [
    ({"quant_method": "hqq"}, "quant_method 'hqq', which kiln cannot read"),
    ({"quant_method": "aqlm"}, "unquantized checkpoint"),
    ({"quant_method": "fp8"}, "no tensor has a weight_scale_inv or weight_scale beside it"),
    ({"bits": 3}, "4- and 8-bit GPTQ checkpoints only"),
    ({"checkpoint_format": "marlin"}, "checkpoint_format 'marlin'"),
    ({"group_size": 12}, "group_size 12"),
])
def test_unreadable_quantization_configs_are_refused_by_name(change, message, float_dir, tmp_path):
    quantized, _ = _written(float_dir, tmp_path, "gptq-v1")
    cfg = json.loads((quantized / "config.json").read_text())
    cfg["quantization_config"].update(change)
    (quantized / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=message):
        models.load(quantized)


@pytest.mark.parametrize("change,message", [
    ({"load_in_4bit": False, "load_in_8bit": True}, "bitsandbytes 8-bit \\(LLM.int8, load_in_8bit\\)"),
    ({"bnb_4bit_quant_storage": "bfloat16"}, "stores bitsandbytes codes as bfloat16"),
    ({"bnb_4bit_quant_type": "int4"}, "bnb_4bit_quant_type 'int4'"),
])
def test_bitsandbytes_configs_kiln_cannot_read_are_refused(change, message, float_dir, tmp_path):
    from prequantized_writer import write_bnb
    write_bnb(float_dir, tmp_path / "q", tmp_path / "values")
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    cfg["quantization_config"].update(change)
    (tmp_path / "q" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=message):
        models.load(tmp_path / "q")


@pytest.mark.parametrize("config,message", [
    ("gptq", "quantization_config is str 'gptq', not an object"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized"}, "float-quantized but has no config_groups"),
])
def test_malformed_quantization_configs_are_named(config, message, float_dir, tmp_path):
    quantized, _ = _written(float_dir, tmp_path, "gptq-v1")
    cfg = json.loads((quantized / "config.json").read_text())
    (quantized / "config.json").write_text(json.dumps({**cfg, "quantization_config": config}))
    with pytest.raises(ModelLoadError, match=message):
        models.load(quantized)


@pytest.mark.parametrize("change,message", [
    ({"format": "int-quantized"}, "compressed-tensors format int-quantized; kiln reads 'pack-quantized'"),
    ({"num_bits": 2}, "2-bit int weights by group"),
    ({"input_activations": {"num_bits": 8, "type": "int"}}, "with quantized activations"),
    ({"second_group": True}, "2 different weight schemes"),
])
def test_compressed_tensors_schemes_other_than_w4a16_and_w8a16_are_refused(change, message, float_dir, tmp_path):
    quantized, _ = _written(float_dir, tmp_path, "ct-asym")
    cfg = json.loads((quantized / "config.json").read_text())
    group = cfg["quantization_config"]["config_groups"]["group_0"]
    if "format" in change:
        group["format"] = change["format"]
    elif "num_bits" in change:
        group["weights"]["num_bits"] = change["num_bits"]
    elif "input_activations" in change:
        group["input_activations"] = change["input_activations"]
    else:
        cfg["quantization_config"]["config_groups"]["group_1"] = {
            **group, "weights": {**group["weights"], "group_size": 128}, "targets": ["re:.*down_proj"]}
    (quantized / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=message):
        models.load(quantized)


def test_awq_other_packings_are_refused(float_dir, tmp_path):
    quantized, _ = _written(float_dir, tmp_path, "awq")
    cfg = json.loads((quantized / "config.json").read_text())
    cfg["quantization_config"]["version"] = "gemv"
    (quantized / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="version 'gemv'"):
        models.load(quantized)


def test_a_missing_plane_or_a_float_checkpoint_under_a_quantized_config_is_named(float_dir, tmp_path):
    from safetensors.numpy import load_file, save_file
    quantized, _ = _written(float_dir, tmp_path, "gptq-v1")
    tensors = load_file(str(quantized / "model.safetensors"))
    del tensors["model.layers.0.self_attn.q_proj.qzeros"]
    save_file(tensors, str(quantized / "model.safetensors"))
    source = models.load(quantized)
    with pytest.raises(ModelLoadError, match=r"q_proj.qweight has no .*q_proj.qzeros beside it"):
        source.weights.get("model.layers.0.self_attn.q_proj.weight")

    cfg = json.loads((quantized / "config.json").read_text())
    mislabeled = tmp_path / "mislabeled"
    mislabeled.mkdir()
    (mislabeled / "model.safetensors").write_bytes((float_dir / "model.safetensors").read_bytes())
    (mislabeled / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"no tensor is named \*.qweight"):
        models.load(mislabeled)


@pytest.mark.parametrize("producer,block", [("fp8", (128, 128)), ("fp8", (32, 48)), ("compressed-tensors", None),
                                            ("compressed-tensors", (64, 64))])
def test_fp8_weights_read_as_fp8_times_their_scales(producer, block, float_dir, tmp_path):
    """Blocks that do not divide the weight (32 x 48 of 64 x 192) included: block (i // 32, k // 48), as
    DeepSeek's weight_dequant and vLLM read them (transformers' CPU dequantization divides the weight by
    the scale grid instead); with blocks that divide it transformers gives the same values
    (tests/numerics/test_prequantized.py)."""
    from prequantized_writer import write_fp8
    write_fp8(float_dir, tmp_path / "q", tmp_path / "values", producer, block)
    source, values = models.load(tmp_path / "q"), models.load(tmp_path / "values")
    assert sorted(source.weights.names()) == sorted(values.weights.names())       # scales not listed
    for name in values.weights.names():
        np.testing.assert_array_equal(source.weights.get(name), values.weights.get(name), err_msg=name)
    assert source.stored_quant is None and source.notes[0].startswith("FP8 e4m3 weights")


def test_e4m3_bytes_decode_as_torch_does():
    import torch

    from kiln.models.fp8 import decode_e4m3
    raw = np.arange(256, dtype=np.uint8)
    want = torch.from_numpy(raw).view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(decode_e4m3(raw), want)


def test_desc_act_with_groups_in_order_is_still_kept_exact(float_dir, tmp_path):
    """A GPTQ config saying desc_act whose g_idx is k // G anyway (static groups) keeps its exact form."""
    quantized, reference = _written(float_dir, tmp_path, "gptq-v1")
    cfg = json.loads((quantized / "config.json").read_text())
    cfg["quantization_config"]["desc_act"] = True
    (quantized / "config.json").write_text(json.dumps(cfg))
    source, values = models.load(quantized), models.load(reference)
    name = "model.layers.0.mlp.gate_proj.weight"
    assert "desc_act" in source.notes[0] and source.weights.stored_form(name) == (False, 32, 4)
    np.testing.assert_array_equal(source.weights.stored_codes(name).dequantize(), values.weights.get(name))
