"""Gemma 4 as llama.cpp's converter writes it (tests/gguf_writer.py: Gemma4Model's keys, proportional RoPE as a
rope_freqs tensor, per-layer KV head counts and MLP widths, the per-layer embedding tensors, 26B-A4B's experts
as ffn_gate_up_exps / ffn_down_exps with the router's scales as .scale tensors, the "gemma4" tokenizer with its
merges): kiln reads the GGUF back into the Hugging Face model it was written from. The
logits equal transformers' within 1e-4 (q0f32: every prefill position past the 8-token window, the last-token
prefill, 5 decode steps), a Q8_0 file is kept exactly under --quant auto, and the tokenizer kiln rebuilds
from the metadata encodes and decodes as the checkpoint's tokenizer.json does."""

from __future__ import annotations

import gguf
import pytest

import kiln
from gguf_writer import write_gguf
from kiln.models.gguf import load_gguf
from kiln.models.gguf_tokenizer import build_gguf_tokenizer, gguf_tokenizer_config
from test_gemma4 import CASES, IDS, TOL, write_gemma4
from tiny_models import CORPUS, assert_prefill_and_decode_match, write_gemma_tokenizer

pytestmark = pytest.mark.numerics
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time


def _written(case: str, root, **types):
    ref = write_gemma4(case, root / "hf")
    write_gemma_tokenizer(root / "hf", CASES[case]["vocab_size"])
    return ref, write_gguf(root / "hf", root / f"{case}.gguf", **types)


@pytest.mark.parametrize("case", ["e2b", "k-eq-v", "moe"])
def test_gemma4_gguf_matches_transformers(case, tmp_path):
    ref, path = _written(case, tmp_path)
    config = load_gguf(path).hf_config
    assert config["model_type"] == "gemma4_text"
    assert config["attention_k_eq_v"] == (case == "k-eq-v")
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, TOL)
    report = kiln.check(art)        # golden: transformers on the config and tensors kiln read from the GGUF
    assert report.ok and report.reference.startswith("transformers"), report.table()


def test_a_q8_0_gemma4_gguf_is_kept_exactly(tmp_path):
    ref, path = _written("e2b", tmp_path, default="Q8_0", types={"proj": "F32"})   # 16 columns: no Q8_0 block
    art = kiln.compile(str(path), target="cpu", quant="auto", output=tmp_path / "art")
    report = kiln.check(art)
    assert report.ok, report.table()
    assert max(p.max_logit_error for p in report.prompts) < 1e-3, report.table()


def test_the_gemma4_tokenizer_encodes_as_the_checkpoints(tmp_path):
    from tokenizers import Tokenizer
    _, path = _written("e2b", tmp_path)
    reader = gguf.GGUFReader(str(path))
    ours, theirs = build_gguf_tokenizer(reader), Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    for text in [*CORPUS, "  two  spaces\tand a tab", "<start_of_turn>user\nhi<end_of_turn>", "unseen ᚠ glyph"]:
        ids = theirs.encode(text).ids
        assert ours.encode(text).ids == ids, text
        assert ours.decode(ids) == theirs.decode(ids)
    assert ours.encode("hi").ids[0] == 2                            # <bos> first, as the file says
    config = gguf_tokenizer_config(reader)
    assert (config["bos_token"], config["eos_token"], config["add_bos_token"]) == ("<bos>", "<eos>", True)
    assert config["eos_token_ids"] == [5]          # <end_of_turn>: a turn's end stops generation, as in llama.cpp
