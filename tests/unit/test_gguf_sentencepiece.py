"""SentencePiece GGUF tokenizers (`tokenizer.ggml.model` "llama") rebuilt by kiln against transformers
building the same file's metadata (but for the prefix space before a leading space, which transformers' converter
leaves out): a Llama-style vocabulary (prefix space, merges ranked by score)
and a Gemma-style one (no prefix space, runs of spaces stored as real spaces, control and
user-defined tokens). The real Gemma 3 file is tests/numerics/test_gguf_gemma3_real.py."""

from __future__ import annotations

import gguf
import pytest

from kiln.models.gguf_tokenizer import build_gguf_tokenizer, gguf_tokenizer_config

pytestmark = pytest.mark.unit
SP = "\u2581"
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world"]
TEXTS = ["the quick brown fox", "  hello   world", "jumps over\nthe lazy dog\n\n", "théé 🦊 qu", "", " ", "a\tb",
         "<start_of_turn>user\nhello<end_of_turn>\n", "dogdogdog thethe"]


def _pieces() -> list[str]:
    """Single characters, then every prefix pair of the words (so each is reachable by merges)."""
    chars = sorted(set("".join(WORDS)) | {SP, "\n", "\t"})
    found: list[str] = []
    for word in WORDS:
        for w in (word, SP + word):
            found += [w[:n] for n in range(2, len(w) + 1) if w[:n] not in found]
    return chars + found


def _write(path, arch: str, extra: list[tuple[str, int]], add_space_prefix: bool | None, scores: bool = True):
    pieces = _pieces()
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [t for t, _ in extra] + pieces
    types = [2, 3, 3] + [6] * 256 + [ty for _, ty in extra] + [1] * len(pieces)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    if scores:
        w.add_token_scores([0.0] * (3 + 256 + len(extra)) + [-float(i) for i in range(len(pieces))])
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _reference(path):
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer
    arch, tokenizer_dict, _ = get_gguf_tokenizer(str(path))
    return convert_gguf_tokenizer(arch, tokenizer_dict)[0]


@pytest.mark.parametrize("arch, extra, prefix", [
    ("llama", [], None),
    ("llama", [], True),
    ("gemma3", [("  ", 4), ("   ", 4), ("\n\n", 4), ("<start_of_turn>", 3), ("<end_of_turn>", 3)], False),
])
def test_sentencepiece_matches_transformers(arch, extra, prefix, tmp_path):
    path = _write(tmp_path / "spm.gguf", arch, extra, prefix)
    reader = gguf.GGUFReader(str(path))
    mine, ref = build_gguf_tokenizer(reader), _reference(path)
    for text in TEXTS:
        ids = mine.encode(text, add_special_tokens=False).ids
        # transformers' GGUF converter prefixes no space to a text that starts with one (Metaspace's "first"), where
        # llama.cpp and Llama's own tokenizer.json do (" hi" -> "▁▁hi": tests/unit/test_gguf_vocab_vectors.py)
        spaced = arch == "llama" and prefix is not False and text.startswith(" ")
        assert ids == ref.encode(" " * spaced + text, add_special_tokens=False).ids, text
        assert mine.decode(ids) == ref.decode(ids), text
    # llama.cpp adds BOS for SentencePiece unless the file says otherwise.
    assert mine.encode("the dog").ids[0] == 1
    assert gguf_tokenizer_config(reader)["add_bos_token"] is True


def test_no_space_prefix_when_the_file_says_so(tmp_path):
    """tokenizer.ggml.add_space_prefix = false, as llama.cpp reads it (transformers' GGUF reader
    ignores the flag for Llama-style vocabularies and prepends one anyway)."""
    tok = build_gguf_tokenizer(gguf.GGUFReader(str(_write(tmp_path / "spm.gguf", "llama", [], False))))
    enc = tok.encode("the quick brown fox", add_special_tokens=False)
    assert enc.tokens == ["the", f"{SP}quick", f"{SP}brown", f"{SP}fox"]
    assert tok.decode(enc.ids) == "the quick brown fox"



def test_a_vocabulary_without_scores_ranks_its_merges_by_token_order(tmp_path):
    """A llama-model vocabulary written without tokenizer.ggml.scores (XVERSE's, a BPE vocabulary converted as
    llama's) merges as the same file whose scores fall with the token's position: _write's."""
    ranked = build_gguf_tokenizer(gguf.GGUFReader(str(_write(tmp_path / "scored.gguf", "llama", [], None))))
    bare = build_gguf_tokenizer(gguf.GGUFReader(str(_write(tmp_path / "bare.gguf", "llama", [], None, scores=False))))
    for text in TEXTS:
        assert bare.encode(text).ids == ranked.encode(text).ids, text
    assert bare.encode("the lazy dog", add_special_tokens=False).tokens == [f"{SP}the", f"{SP}lazy", f"{SP}dog"]
