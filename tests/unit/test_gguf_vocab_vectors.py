"""kiln's GGUF tokenizers against real models' own tokenizers: llama.cpp's vocabulary-only GGUFs and the ids each
model's Hugging Face tokenizer gives for llama.cpp's test texts (tools/llama_cpp_files.py fetches them): every text
encodes to those ids (byte-level BPE with each pre-tokenizer's splits and Llama 3's whole-word tokens; SentencePiece
with the prefix space llama.cpp adds even before a leading space; Gemma 4's) and the ids decode back to the text."""

from __future__ import annotations

import pytest

from conftest import LLAMA_CPP_FILES as VOCABS
from kiln.models.gguf import MappedReader
from kiln.models.gguf_tokenizer import build_gguf_tokenizer

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", VOCABS.NAMES)
def test_gguf_tokenizer_gives_the_models_own_ids(name, llama_cpp_files):
    path = VOCABS.files(name, llama_cpp_files)[0]
    tok = build_gguf_tokenizer(MappedReader(path))
    cases = VOCABS.cases(name, llama_cpp_files)
    assert len(cases) >= 40
    wrong = [(text, got, want) for text, want in cases
             if (got := tok.encode(text, add_special_tokens=False).ids) != want]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ; first {wrong[0][0]!r}: {wrong[0][1]} != {wrong[0][2]}"
    for text, ids in cases:
        assert tok.decode(ids, skip_special_tokens=False) == text, text
