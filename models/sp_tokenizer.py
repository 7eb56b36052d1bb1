"""A SentencePiece `tokenizer.model` (no tokenizer.json beside it: InternLM 2, Baichuan, older Llama-2 folders)
rebuilt as tokenizer.json, as transformers' fast conversion of a Llama-style tokenizer does.

The file is a protobuf ModelProto, read here without protobuf or sentencepiece: its pieces (text, score, type),
the trainer's model type, special ids and byte fallback, and the normalizer's add_dummy_prefix. A BPE model is
the vocabulary llama.cpp's "llama" GGUF tokenizer holds, so the GGUF path's builder makes it
(models/gguf_tokenizer.py: merges recovered from the scores, Metaspace, byte fallback). tokenizer_config.json's
add_bos_token (default on, as LlamaTokenizer) decides the BOS, and its added_tokens_decoder's tokens past the
model's pieces are added at their ids. A Unigram model (T5's kind), or one normalized otherwise than identity
(NFKC, whitespace runs collapsed), is left alone, with a note: the artifact then takes ids.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from .source import ModelLoadError

_BPE = 2                                    # TrainerSpec.ModelType


def read_model(path: Path) -> dict:
    """tokenizer.model -> {pieces: [(text, score, type)], model_type, unk_id, bos_id, eos_id, byte_fallback,
    add_dummy_prefix, normalizer (its rule's name), remove_extra_whitespaces}."""
    data = Path(path).read_bytes()
    out = {"pieces": [], "model_type": 1, "unk_id": 0, "bos_id": 1, "eos_id": 2, "byte_fallback": False,
           "add_dummy_prefix": True, "normalizer": "nmt_nfkc", "remove_extra_whitespaces": True}
    for field, value in _fields(data):
        if field == 1:                                          # SentencePiece
            piece = {1: b"", 2: 0.0, 3: 1}
            piece.update(dict(_fields(value)))
            out["pieces"].append((piece[1].decode("utf-8"), float(piece[2]), int(piece[3])))
        elif field == 2:                                        # TrainerSpec
            spec = dict(_fields(value))
            out.update(model_type=spec.get(3, 1), unk_id=_int32(spec.get(40, 0)), bos_id=_int32(spec.get(41, 1)),
                       eos_id=_int32(spec.get(42, 2)), byte_fallback=bool(spec.get(35, 0)))
        elif field == 3:                                        # NormalizerSpec
            spec = dict(_fields(value))
            out.update(add_dummy_prefix=bool(spec.get(3, 1)), remove_extra_whitespaces=bool(spec.get(4, 1)),
                       normalizer=spec.get(1, b"nmt_nfkc").decode("utf-8", "replace"))
    if not out["pieces"]:
        raise ModelLoadError(f"{path} holds no SentencePiece pieces; re-download the model's tokenizer.model")
    return out


def unconvertible(model: dict) -> str | None:
    """Why kiln does not rebuild this tokenizer.model (None where it does): a Unigram model, or a normalizer
    other than identity (NFKC, whitespace runs collapsed: tokenizer.json's Metaspace would not repeat it)."""
    if model["model_type"] != _BPE:
        return "a Unigram model"
    if model["normalizer"] != "identity" or model["remove_extra_whitespaces"]:
        return f"normalizer {model['normalizer']}" + (", whitespace runs collapsed" if model["remove_extra_whitespaces"]
                                                      else "")
    return None


def build_tokenizer(path: Path, tokenizer_config: dict):
    """tokenizer.model (BPE, identity normalizer: Llama's kind) + tokenizer_config.json -> (a
    tokenizers.Tokenizer, None), or (None, why not)."""
    from tokenizers import AddedToken

    from .gguf_tokenizer import _sentencepiece_tokenizer
    model = read_model(path)
    if (why := unconvertible(model)) is not None:
        return None, why
    pieces = model["pieces"]
    fields = {
        "general.architecture": "llama", "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [p[0] for p in pieces], "tokenizer.ggml.scores": [p[1] for p in pieces],
        "tokenizer.ggml.token_type": [p[2] for p in pieces],      # the same enum as GGUF's token types
        "tokenizer.ggml.add_space_prefix": model["add_dummy_prefix"],
        "tokenizer.ggml.add_bos_token": bool(tokenizer_config.get("add_bos_token", True)),
    }
    for key, name in (("unk_id", "unknown"), ("bos_id", "bos")):
        if 0 <= model[key] < len(pieces):
            fields[f"tokenizer.ggml.{name}_token_id"] = model[key]
    tok = _sentencepiece_tokenizer(_Fields(fields), each_piece=False)
    added = tokenizer_config.get("added_tokens_decoder") or {}
    for token_id in sorted(added, key=int):
        entry = added[token_id]
        if int(token_id) == tok.get_vocab_size(with_added_tokens=True):      # past the pieces: at its id
            tok.add_special_tokens([AddedToken(entry["content"], special=bool(entry.get("special", True)),
                                               normalized=False)])
    return tok, None


class _Fields:
    """A GGUF reader's get_field over plain values, for gguf_tokenizer's builder."""

    def __init__(self, values: dict) -> None:
        self._values = values

    def get_field(self, key: str):
        if key not in self._values:
            return None
        value = self._values[key]
        return type("Field", (), {"contents": staticmethod(lambda: value)})()


def tokenizer_config(folder: Path) -> dict:
    path = Path(folder) / "tokenizer_config.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}


def _fields(data: bytes):
    """A protobuf message's (field number, value) pairs: ints for varints, floats for fixed32, bytes for
    length-delimited fields."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 1:
            value, at = struct.unpack_from("<d", data, at)[0], at + 8
        elif wire == 2:
            size, at = _varint(data, at)
            value, at = data[at:at + size], at + size
        elif wire == 5:
            value, at = struct.unpack_from("<f", data, at)[0], at + 4
        else:
            raise ModelLoadError(f"tokenizer.model: protobuf wire type {wire} where SentencePiece writes none; "
                                 "the file is damaged (re-download it)")
        yield field, value


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data):
            raise ModelLoadError("tokenizer.model ends inside a number; the file is damaged (re-download it)")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def _int32(value: int) -> int:
    """A protobuf int32 read as a varint (negatives are 10-byte two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value
