"""Reading GGUF metadata values (shared by the GGUF loader and its tokenizer)."""

from __future__ import annotations

import gguf

from .source import ModelLoadError

_MISSING = object()


def meta(reader: gguf.GGUFReader, key: str, default=_MISSING):
    """One metadata value as a Python value (int, float, bool, str or list)."""
    field = reader.get_field(key)
    if field is None:
        if default is _MISSING:
            raise ModelLoadError(
                f"GGUF metadata key {key!r} is missing; re-convert the model with llama.cpp's convert_hf_to_gguf.py"
            )
        return default
    return field.contents()
