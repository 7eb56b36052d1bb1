"""Qwen2 (the causal-LM base with QKV bias), from a Hugging Face folder and from a GGUF that
llama.cpp's layout describes, against transformers' logits."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

import kiln
from kiln.models import gguf as kg
from tiny_models import assert_prefill_and_decode_match, write_tiny_qwen2

pytestmark = pytest.mark.numerics
TOL = 1e-4
IDS = np.random.default_rng(11).integers(0, 512, size=21).tolist()


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory) -> dict:
    """Tied and untied tiny Qwen2s: HF folder, q0f32 CPU artifact, transformers reference."""
    import transformers
    root = tmp_path_factory.mktemp("qwen2")
    out = {}
    for kind, tied in (("tied", True), ("untied", False)):
        d = write_tiny_qwen2(root / kind, tied=tied, seed=3 if tied else 4, rope_theta=1e6)   # Qwen2's theta
        art = kiln.compile(str(d), target="cpu", quant="q0f32", output=root / f"{kind}-art")
        ref = transformers.Qwen2ForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        out[kind] = (d, art, ref)
    return out


@pytest.mark.parametrize("kind", ["tied", "untied"])
def test_prefill_and_decode_logits_match_transformers(kind, qwen2):
    _, art, ref = qwen2[kind]
    cfg = kiln.Artifact.load(art).config
    assert cfg.model.arch == "qwen2" and any(p.endswith("qkv_proj.bias") for p in cfg.params)
    assert_prefill_and_decode_match(art, ref, IDS, TOL)


def test_sliding_window_layers_follow_max_window_layers():
    from kiln.models.qwen2 import Qwen2Config
    hf = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=4, num_attention_heads=4,
              max_position_embeddings=4096, use_sliding_window=True, sliding_window=1024, max_window_layers=1)
    c = Qwen2Config.from_hf(hf)         # transformers: layer i slides iff i >= max_window_layers
    assert c.context_window_size == 4096 and c.sliding_layers == (1, 2, 3) and c.sliding_window == 1024
    assert [a.kind for a in c.layer_attention()] == ["full", "sliding", "sliding", "sliding"]
    assert [a.window for a in c.layer_attention()] == [None, 1024, 1024, 1024]
    explicit = Qwen2Config.from_hf(dict(hf, layer_types=["sliding_attention", "full_attention"] * 2))
    assert explicit.sliding_layers == (0, 2)
    for off in (dict(use_sliding_window=False), dict(sliding_window=8192), dict(max_window_layers=4)):
        assert {a.kind for a in Qwen2Config.from_hf(dict(hf, **off)).layer_attention()} == {"full"}
    with pytest.raises(ValueError, match="layer_types lists 2 layers"):
        Qwen2Config.from_hf(dict(hf, layer_types=["full_attention"] * 2))


def write_qwen2_gguf(hf_dir, path, q8_layer: int | None = None) -> dict[str, np.ndarray]:
    """A qwen2 GGUF as llama.cpp writes one (names, metadata; no Q/K row permutation for qwen2);
    returns the HF tensors it was made from."""
    source = kiln.models.load(hf_dir)
    _, c, _ = kiln.models.build(source)
    to_gguf = {v: k for k, v in kg._GLOBAL_NAMES.items()}
    for i in range(c.num_hidden_layers):
        for k, v in kg._LAYER_NAMES.items():
            to_gguf.update({f"model.layers.{i}.{v}.{p}": f"blk.{i}.{k}.{p}" for p in ("weight", "bias")})
    w = gguf.GGUFWriter(str(path), "qwen2")
    for add, value in ((w.add_block_count, c.num_hidden_layers), (w.add_context_length, c.context_window_size),
                       (w.add_embedding_length, c.hidden_size), (w.add_feed_forward_length, c.intermediate_size),
                       (w.add_head_count, c.num_attention_heads), (w.add_head_count_kv, c.num_key_value_heads),
                       (w.add_layer_norm_rms_eps, c.norm_eps), (w.add_rope_freq_base, c.rope_theta)):
        add(value)
    tensors = {}
    for name in source.weights.names():
        t = tensors[name] = source.weights.get(name).astype(np.float32)
        if q8_layer is not None and name.startswith(f"model.layers.{q8_layer}.") and t.ndim == 2:
            w.add_tensor(to_gguf[name], gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(to_gguf[name], t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def test_gguf_reads_back_hf_tensors_in_hf_order(qwen2, tmp_path):
    hf_dir = qwen2["untied"][0]
    want = write_qwen2_gguf(hf_dir, tmp_path / "q.gguf", q8_layer=1)
    source = kg.load_gguf(tmp_path / "q.gguf")
    assert source.hf_config["model_type"] == "qwen2" and source.hf_config["architectures"] == ["Qwen2ForCausalLM"]
    w = source.weights
    assert set(w.names()) == set(want)
    for name, t in want.items():
        if name.startswith("model.layers.1.") and t.ndim == 2:
            q8 = gguf.quants.dequantize(gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0),
                                        gguf.GGMLQuantizationType.Q8_0)
            np.testing.assert_array_equal(w.get(name), q8, err_msg=name)
            ty, raw, _ = w.get_raw(name)                   # qwen2 rows are not permuted: raw = stored
            assert ty == "Q8_0"
            np.testing.assert_array_equal(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0).reshape(t.shape), q8)
        else:
            np.testing.assert_array_equal(w.get(name), t, err_msg=name)


def test_gguf_compiles_to_the_hf_folder_logits(qwen2, tmp_path):
    hf_dir, hf_art, ref = qwen2["untied"]
    write_qwen2_gguf(hf_dir, tmp_path / "f32.gguf")
    art = kiln.compile(str(tmp_path / "f32.gguf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert kiln.Artifact.load(art).config.model.arch == "qwen2"
    assert_prefill_and_decode_match(art, ref, IDS, TOL, steps=2)
