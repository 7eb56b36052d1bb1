"""A model's tokenizer taken from elsewhere (`kiln compile --tokenizer PATH`, vLLM's `--tokenizer`): for checkpoints
that ship none (Apple's OpenELM uses Llama 2's; many base exports and ONNX folders hold weights alone) or ship one
to replace. PATH is a folder of tokenizer files as a checkpoint holds them (tokenizer.json; or tokenizer.model,
GPT-2's vocab.json + merges.txt, Kimi's tiktoken.model, which models/hf.py converts; tokenizer_config.json with its
chat template), one of those files (its folder is read), or a GGUF file (its tokenizer, as models/gguf_tokenizer.py
rebuilds it). The artifact then holds that tokenizer as if the checkpoint had shipped it."""

from __future__ import annotations

import dataclasses
import hashlib
import tempfile
from pathlib import Path

from .hf import TOKENIZER_NOTE_STARTS, tokenizer_files
from .source import ModelLoadError, ModelSource


def with_tokenizer(source: ModelSource, path: str | Path) -> ModelSource:
    """`source` with the tokenizer at `path` in place of its own; a ModelLoadError where `path` holds no tokenizer
    kiln reads, or one whose ids reach past the model's vocabulary (they would index outside its embedding)."""
    given = Path(path).expanduser()
    if given.suffix == ".gguf" and given.is_file():
        writer, why = _gguf_writer(given), "its GGUF metadata holds no tokenizer (tokenizer.ggml.model)"
    elif given.is_file() or given.is_dir():
        folder = given if given.is_dir() else given.parent
        writer, notes = tokenizer_files(folder, source.hf_config.get("model_type"))
        why = notes[0] if notes and notes[0].startswith("no tokenizer.json") else "no tokenizer.json"
    else:
        raise ModelLoadError(f"--tokenizer {given} does not exist; pass a folder with the tokenizer's files "
                             "(tokenizer.json, tokenizer.model, ...) or a GGUF file")
    with tempfile.TemporaryDirectory(prefix="kiln-tokenizer-") as tmp:
        written = writer(Path(tmp)) if writer is not None else []
        if "tokenizer.json" not in written:
            raise ModelLoadError(f"--tokenizer {given}: {why.split(':')[0]}; pass a folder with the model's "
                                 "tokenizer.json (or tokenizer.model, vocab.json + merges.txt) or a GGUF file")
        from tokenizers import Tokenizer
        size = Tokenizer.from_file(str(Path(tmp) / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
        files = {name: (Path(tmp) / name).read_bytes() for name in written}     # built once: the artifact's
    digest = hashlib.sha256(source.content_hash.encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    hf = source.hf_config
    vocab = hf.get("vocab_size") or (hf.get("text_config") or {}).get("vocab_size")
    if isinstance(vocab, int) and size > vocab:
        raise ModelLoadError(f"--tokenizer {given} has {size} tokens, more than the model's vocabulary of {vocab}: "
                             "its ids past that would index outside the embedding; pass the tokenizer the model "
                             "was trained with")
    notes = [n for n in source.notes if not n.startswith(TOKENIZER_NOTE_STARTS)]

    def write_tokenizer(dest: Path) -> list[str]:
        for name, data in files.items():
            (dest / name).write_bytes(data)
        return list(files)

    return dataclasses.replace(source, write_tokenizer=write_tokenizer, content_hash=digest.hexdigest(),
                               notes=[*notes, f"tokenizer from {given} (--tokenizer, {size} tokens)"])


def _gguf_writer(path: Path):
    """The tokenizer writer of the GGUF at `path`, None where its metadata holds none."""
    from .gguf import _open_reader
    from .gguf_tokenizer import _check_tokenizer, write_gguf_tokenizer
    reader = _open_reader(path)
    if reader.get_field("tokenizer.ggml.model") is None:
        return None
    _check_tokenizer(reader)
    return lambda dest: write_gguf_tokenizer(reader, dest)
