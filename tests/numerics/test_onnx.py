"""ONNX exports of tiny Llama and Qwen2 models (torch.onnx's TorchScript and dynamo exporters) compiled by
kiln, against onnxruntime running the same file; the weight mapping (by name, module scope, position)
against the Hugging Face tensors; graphs kiln cannot map refused in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import kiln
from kiln.models import ModelLoadError
from tiny_models import write_tiny

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.numerics
TOL = 1e-4
IDS = np.random.default_rng(5).integers(0, 512, size=19).tolist()
SIDE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")


class LogitsOnly(torch.nn.Module):
    """input_ids -> logits, no KV cache: the graph onnxruntime runs on the whole sequence each step."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, input_ids):
        return self.m(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False).logits


def export(family: str, root: Path, tied: bool, seed: int, dynamo: bool, external: bool,
           **options) -> tuple[Path, Path]:
    """A tiny HF model (norm weights randomised too) and its ONNX export in optimum's layout:
    (HF folder, ONNX folder with model.onnx [+ model.onnx_data], config.json, tokenizer files)."""
    import transformers
    hf = write_tiny(family, root / "hf", tied=tied, seed=seed, **options.pop("config", {}))
    model = getattr(transformers, f"{family}ForCausalLM").from_pretrained(hf, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
    model.save_pretrained(hf)
    out = root / "onnx"
    out.mkdir()
    ids = torch.tensor([IDS[:7]])
    kw = (dict(dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=256)},), external_data=False) if dynamo
          else dict(dynamic_axes={"input_ids": {1: "seq"}, "logits": {1: "seq"}}, opset_version=17))
    torch.onnx.export(LogitsOnly(model).eval(), (ids,), str(out / "model.onnx"), input_names=["input_ids"],
                      output_names=["logits"], dynamo=dynamo, **kw, **options)
    if external:
        onnx.save_model(onnx.load(str(out / "model.onnx")), str(out / "model.onnx"), save_as_external_data=True,
                        all_tensors_to_one_file=True, location="model.onnx_data", size_threshold=0)
    for name in SIDE_FILES:
        shutil.copy2(hf / name, out / name)
    return hf, out


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """llama: untied, TorchScript exporter (`onnx::MatMul_N` weights), external data; qwen2: tied, dynamo
    exporter (`val_N` weights, name-scope metadata, the tied table under lm_head's name), one file."""
    root = tmp_path_factory.mktemp("onnx")
    return {"llama": export("Llama", root / "llama", tied=False, seed=7, dynamo=False, external=True),
            "qwen2": export("Qwen2", root / "qwen2", tied=True, seed=8, dynamo=True, external=False)}


@pytest.fixture(scope="module")
def compiled(exports, tmp_path_factory) -> dict[str, Path]:
    """q0f32 CPU artifacts: llama from its folder, qwen2 from the .onnx file itself."""
    root = tmp_path_factory.mktemp("onnx-art")
    return {"llama": kiln.compile(str(exports["llama"][1]), target="cpu", quant="q0f32", output=root / "llama"),
            "qwen2": kiln.compile(str(exports["qwen2"][1] / "model.onnx"), target="cpu", quant="q0f32",
                                  output=root / "qwen2")}


def ort_logits(session, ids: list[int]) -> np.ndarray:
    """onnxruntime's logits at every position [seq, vocab]."""
    return session.run(["logits"], {"input_ids": np.array([ids], dtype=np.int64)})[0][0]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_logits_match_onnxruntime(family, exports, compiled):
    from kiln.runtime.artifact import Artifact
    from kiln.runtime.model_runner import ModelRunner
    graph = exports[family][1] / "model.onnx"
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    art = Artifact.load(compiled[family])
    assert art.config.model.arch == family and art.config.model.source.format == "onnx"
    assert (compiled[family] / "tokenizer.json").exists()
    runner = ModelRunner(art)
    expected = ort_logits(session, IDS)
    assert np.abs(expected).max() > 0.5, "logits too small for the tolerance to mean anything"
    runner.add_sequence(0)                    # every prefill position
    np.testing.assert_allclose(runner.verify(0, IDS), expected, atol=TOL, rtol=0)
    runner.add_sequence(1)                    # last-token prefill, then greedy decode vs the growing sequence
    logits = runner.prefill([1], [IDS])[0]
    np.testing.assert_allclose(logits, expected[-1], atol=TOL, rtol=0)
    seq = list(IDS)
    for _ in range(3):
        seq.append(int(np.argmax(logits)))
        logits = runner.decode([1], [seq[-1]])[0]
        np.testing.assert_allclose(logits, ort_logits(session, seq)[-1], atol=TOL, rtol=0)


def test_external_data_layout(exports):
    d = exports["llama"][1]
    inits = onnx.load(str(d / "model.onnx"), load_external_data=False).graph.initializer
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in inits)       # every weight in model.onnx_data
    source = kiln.models.load(d)
    assert source.format == "onnx" and "by module scope" in source.notes[-1]
    (d / "model.onnx_data").rename(d / "elsewhere")
    try:
        with pytest.raises(ModelLoadError, match="model.onnx_data"):
            source.weights.get("model.embed_tokens.weight")
    finally:
        (d / "elsewhere").rename(d / "model.onnx_data")


def assert_same_weights(onnx_path: Path, hf: Path) -> list[str]:
    """Every weight kiln maps from the graph equals the HF tensor of that name; returns the load notes."""
    source, ref = kiln.models.load(onnx_path), kiln.models.load(hf)
    assert set(source.weights.names()) <= set(ref.weights.names())    # the load refuses a graph missing any
    for name in source.weights.names():
        np.testing.assert_array_equal(source.weights.get(name), ref.weights.get(name), err_msg=name)
    return source.notes


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_weights_map_to_the_hf_tensors(family, exports):
    hf, d = exports[family]
    assert_same_weights(d, hf)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_graph_without_names_maps_by_position(family, exports, tmp_path):
    """Node names and scope metadata stripped (as graph optimizers leave them): MatMul weights by position."""
    hf, d = exports[family]
    model = onnx.load(str(d / "model.onnx"))
    for node in model.graph.node:
        node.name = ""
        del node.metadata_props[:]
    for t in model.graph.initializer:       # and the embedding table renamed
        if t.name.endswith(("embed_tokens.weight", "lm_head.weight")):
            for node in model.graph.node:
                node.input[:] = ["anonymous_table" if x == t.name else x for x in node.input]
            t.name = "anonymous_table"
    onnx.save_model(model, str(tmp_path / "model.onnx"))
    for name in SIDE_FILES:
        shutil.copy2(d / name, tmp_path / name)
    notes = assert_same_weights(tmp_path / "model.onnx", hf)
    assert "by position" in notes[-1] and "by module scope" not in notes[-1], notes


def refusal(path: Path) -> str:
    with pytest.raises(ModelLoadError) as e:
        kiln.models.load(path)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_refusals_say_what_was_found(exports, tmp_path):
    d = exports["llama"][1]
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy2(d / "model.onnx", bare / "model.onnx")
    shutil.copy2(d / "model.onnx_data", bare / "model.onnx_data")
    msg = refusal(bare / "model.onnx")
    assert "no config.json" in msg and "initializers" in msg and "input_ids" in msg
    cfg = json.loads((d / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps(dict(cfg, architectures=["BertModel"], model_type="bert")))
    assert "BERT (bert) is not supported yet: its encoder" in refusal(bare)       # a family refused by name
    (bare / "config.json").write_text(json.dumps(dict(cfg, architectures=["RetNetModel"], model_type="retnet")))
    assert "unknown architecture: RetNetModel" in refusal(bare)
    (bare / "config.json").write_text(json.dumps(dict(cfg, num_hidden_layers=3)))
    msg = refusal(bare)
    assert "no initializer for" in msg and "model.layers.2." in msg and "config.json" in msg


def test_encoder_graph_is_refused(tmp_path, exports):
    from onnx import TensorProto, helper
    w = helper.make_tensor("embeddings.word_embeddings.weight", TensorProto.FLOAT, [8, 4], [0.0] * 32)
    node = helper.make_node("Gather", ["embeddings.word_embeddings.weight", "input_ids"], ["last_hidden_state"])
    graph = helper.make_graph([node], "bert", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 3])],
                              [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, 3, 4])],
                              initializer=[w])
    onnx.save_model(helper.make_model(graph), str(tmp_path / "model.onnx"))
    shutil.copy2(exports["llama"][1] / "config.json", tmp_path / "config.json")
    msg = refusal(tmp_path)
    assert "encoder" in msg and "last_hidden_state" in msg
    (tmp_path / "encoder_model.onnx").write_bytes(b"")
    assert "encoder-decoder" in refusal(tmp_path)


def test_folded_norms_are_refused_unfolded_ones_map(tmp_path):
    """Gemma's (1 + w) norms: the dynamo exporter's optimizer folds them into new tensors that no name or
    scope undoes (refused, saying how to export instead); exported with optimize=False they map by name."""
    gemma = dict(config=dict(head_dim=16))
    hf, folded = export("Gemma2", tmp_path / "folded", tied=True, seed=9, dynamo=True, external=False, **gemma)
    msg = refusal(folded)
    assert "no initializer for" in msg and "norm" in msg and "optimize=False" in msg
    hf, plain = export("Gemma2", tmp_path / "plain", tied=True, seed=9, dynamo=True, external=False,
                       optimize=False, **gemma)
    assert_same_weights(plain, hf)


def test_cli_refusal_is_one_line(exports, tmp_path):
    shutil.copy2(exports["qwen2"][1] / "model.onnx", tmp_path / "alone.onnx")
    proc = subprocess.run([sys.executable, "-P", "-m", "kiln.cli", "compile", str(tmp_path / "alone.onnx")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "no config.json" in errors[0] and "alone.onnx" in errors[0], proc.stderr
