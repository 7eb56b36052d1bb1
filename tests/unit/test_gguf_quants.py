"""Every GGUF tensor type real files use, read by kiln against gguf-py's numpy dequantize.

For each type: the test quantizer's blocks decode (gguf-py) close to the input (the lattice i-quants, which
it cannot encode: random valid blocks); a GGUF holding
them loads (get() = gguf-py's values, llama q/k rows un-permuted); where a kiln kernel holds the
type exactly (quant_gguf.GGUF_EXACT) the planes dequantize to the same float32 bits, with float16
scale planes too where the type's block scales are float16 (HALF_SCALED; others refuse them). Any other
type is refused in one line naming the tensor, its type, the supported list and the fix.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QType

from gguf_quants import quantize
from gguf_writer import write_gguf
from kiln.compiler.quant_gguf import GGUF_EXACT, HALF_SCALED, from_gguf_blocks
from kiln.compiler.quant_modules import QuantFormat
from kiln.compiler.quant_pack import dequantize
from kiln.models import ModelLoadError
from kiln.models.gguf import SUPPORTED_TENSOR_TYPES, load_gguf
from tiny_models import write_tiny_llama

pytestmark = pytest.mark.unit
TYPES = [t for t in SUPPORTED_TENSOR_TYPES if t != "F32"]
RMS_BOUND = {"F16": 1e-3, "BF16": 5e-3, "Q8_0": 0.01, "Q6_K": 0.03, "Q5_0": 0.06, "Q5_1": 0.06, "Q5_K": 0.06,
             "Q4_0": 0.12, "Q4_1": 0.1, "Q4_K": 0.1, "Q3_K": 0.2, "Q2_K": 0.4, "MXFP4": 0.15, "IQ4_NL": 0.1,
             "IQ4_XS": 0.1, "TQ2_0": 1.0, "TQ1_0": 1.0}      # ternary: weights of -1, 0, 1 only (random ones: far)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("hf"), tied=False, hidden_size=256, intermediate_size=256,
                            num_hidden_layers=1, head_dim=64)


@pytest.mark.parametrize("type_name", TYPES)
def test_type_loads_as_gguf_py_dequantizes_it(type_name, hf_dir, tmp_path):
    w = np.random.default_rng(0).standard_normal((8, 512)).astype(np.float32)
    if type_name not in ("F16", "BF16"):
        raw = quantize(w, type_name)
        ref = gguf.quants.dequantize(raw, QType[type_name]).reshape(w.shape)
        if type_name in RMS_BOUND:                                      # not the random lattice blocks
            assert np.sqrt(((ref - w) ** 2).mean()) < RMS_BOUND[type_name]
        if type_name in GGUF_EXACT:
            kind, group = GGUF_EXACT[type_name]
            got = dequantize(QuantFormat(kind, group), from_gguf_blocks(type_name, raw))
            np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
            if type_name in HALF_SCALED:
                half = from_gguf_blocks(type_name, raw, "float16")
                assert all(half[p].dtype == np.float16 for p in half if p != "qweight")
                got = dequantize(QuantFormat(kind, group, "float16"), half)
                np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
            else:
                with pytest.raises(ValueError, match="not exactly float16"):
                    from_gguf_blocks(type_name, raw, "float16")
    path = write_gguf(hf_dir, tmp_path / "t.gguf", default=type_name)
    source, reader = load_gguf(path), gguf.GGUFReader(path)
    stored = {t.name: t for t in reader.tensors}
    for hf_name, gguf_name in (("model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight"),
                               ("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight")):
        t = stored[gguf_name]
        assert t.tensor_type.name == type_name == source.weights.tensor_type(hf_name)
        want = gguf.quants.dequantize(t.data, t.tensor_type).reshape(source.weights.shape(hf_name))
        if "k_proj" in hf_name:                        # llama.cpp permuted its rows: compare in HF order
            from kiln.models.gguf import unpermute_rows
            want = unpermute_rows(want, source.hf_config["num_key_value_heads"])
        np.testing.assert_array_equal(source.weights.get(hf_name).astype(np.float32), want, err_msg=hf_name)


def test_mapped_reader_reads_what_gguf_reads(hf_dir, tmp_path):
    """kiln's MappedReader (a plain ndarray over the map, not the np.memmap; arrays read in one pass): every
    field's values and every tensor's data the same bytes and dtypes as gguf.GGUFReader gives."""
    from kiln.models.gguf import MappedReader
    path = write_gguf(hf_dir, tmp_path / "m.gguf", default="Q4_1")
    mine, theirs = MappedReader(path), gguf.GGUFReader(path)
    assert type(mine.data) is np.ndarray and isinstance(theirs.data, np.memmap)
    assert list(mine.fields) == list(theirs.fields) and len(mine.fields) > 10
    for name, field in theirs.fields.items():
        got = mine.fields[name]
        assert (got.offset, got.types[0]) == (field.offset, field.types[0]), name
        assert got.contents() == field.contents(), name
        if field.types[-1] != gguf.GGUFValueType.STRING:       # numbers: the same dtypes
            assert got.parts[-1].dtype == field.parts[-1].dtype, name
    assert all(len(mine.fields[k].contents()) > 100 for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))
    assert [t.name for t in mine.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(mine.tensors, theirs.tensors):
        assert (a.tensor_type, a.data.dtype, a.data.shape) == (b.tensor_type, b.data.dtype, b.data.shape), a.name
        assert a.data.tobytes() == b.data.tobytes(), a.name


def test_unknown_type_is_refused_in_one_line(hf_dir, tmp_path):
    path = write_gguf(hf_dir, tmp_path / "iq.gguf")
    reader = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(str(tmp_path / "iq4.gguf"), "llama")
    for field in reader.fields.values():
        if field.name.startswith(("llama.", "tokenizer.")):
            w.add_key_value(field.name, field.contents(), field.types[0],
                            field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        if t.name == "blk.0.attn_v.weight":                # Q1_0: 128 weights in 18 bytes
            rows, cols = int(t.shape[1]), int(t.shape[0])
            w.add_tensor(t.name, np.zeros((rows, cols // 128 * 18), np.uint8), raw_dtype=QType.Q1_0)
        else:
            w.add_tensor(t.name, np.array(t.data))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ModelLoadError) as err:
        load_gguf(tmp_path / "iq4.gguf")
    message = str(err.value)
    assert "\n" not in message and "blk.0.attn_v.weight has type Q1_0" in message
    assert "Q2_K" in message and "Q6_K" in message and "llama-quantize" in message


@pytest.mark.parametrize("half_scales, quant", [(True, "as-stored"), (False, "as-stored"), (True, "as-stored-f16")])
def test_float16_block_scales_stay_float16_where_the_target_reads_them(half_scales, quant, hf_dir, tmp_path):
    """A Q4_1 / Q8_0 weight's scales are float16 in its blocks: kept so where the target's kernels read
    float16 scales (TargetProfile.half_scales: the CPUs) under float32 compute; a Q4_K weight's (a
    product of two scales) and every scale under float16 compute (where float32 ones keep the
    dequantized weight exact) stay float32."""
    from kiln import models
    from kiln.compiler.quantize import get_scheme
    path = write_gguf(hf_dir, tmp_path / "t.gguf", {"attn_q": "Q4_1", "attn_k": "Q4_1", "attn_v": "Q4_1",
                                                      "attn_output": "Q8_0", "ffn_down": "Q4_K"}, default="F32")
    source = models.load(path)
    arch, config, model = models.build(source)
    plan = get_scheme(quant, source).apply(model, source, arch.weight_map(config), half_scales=half_scales)
    fmts = {name.split(".")[-2]: fmt for name, fmt in plan.formats.items() if fmt is not None}
    half = half_scales and quant == "as-stored"
    want = "float16" if half else "float32"
    assert (fmts["qkv_proj"].kind, fmts["o_proj"].kind, fmts["down_proj"].kind) == ("q4m", "q8", "q4m")
    assert (fmts["qkv_proj"].scale_dtype, fmts["o_proj"].scale_dtype, fmts["down_proj"].scale_dtype) \
        == (want, want, "float32")
    planes = plan.convert("model.layers.0.self_attn.qkv_proj.weight",
                          arch.weight_map(config)["model.layers.0.self_attn.qkv_proj.weight"], source)
    assert {planes[f"model.layers.0.self_attn.qkv_proj.{p}"].dtype for p in ("scale", "min")} == {np.dtype(want)}
    labels = plan.describe()["tensors"]
    assert labels["model.layers.0.self_attn.qkv_proj.weight"] == ("q4m-f16scales" if half else "q4m")
    assert labels["model.layers.0.mlp.down_proj.weight"] == "q4m"
