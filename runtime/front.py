"""ModelFront: what a front end needs of an artifact without running it.

The tokenizer (and its chat template), the eos ids, prompt checks and the structured-output grammar
compiler. Engine is a ModelFront that also runs the model; the HTTP side of `kiln serve` with its engine
in a process of its own (runtime/engine_process.py) holds a bare ModelFront: it tokenizes, renders chat
templates and compiles grammars there, and sends the engine token ids.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from .artifact import Artifact
from .protocol import InvalidRequestError
from .tokenizer import Tokenizer


def generation_eos(path) -> set[int]:
    """The eos ids of the checkpoint's generation_config.json (copied into the artifact with the tokenizer),
    which transformers' generate and vLLM stop at too: Llama 3 Instruct's <|eot_id|>, gpt-oss's <|call|>
    beside config.json's <|return|>. An unreadable file adds none."""
    try:
        value = json.loads((Path(path) / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return set()
    values = value if isinstance(value, list) else [value]
    return {v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0}


class ModelFront:
    def __init__(self, artifact: Artifact, chat_template: str | None = None):
        self.artifact = artifact
        self.vocab_size = artifact.vocab_size
        has_tok = (artifact.path / "tokenizer.json").is_file()
        self.tokenizer = Tokenizer.from_dir(artifact.path) if has_tok else None
        if chat_template is not None and self.tokenizer is not None:
            self.tokenizer.set_chat_template(chat_template)
        eos = set(artifact.config.eos_token_ids) | generation_eos(artifact.path)
        self.eos_token_ids = frozenset(eos | set(self.tokenizer.eos_token_ids if self.tokenizer else ()))
        self._grammars = None
        self._grammars_lock = threading.Lock()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._need_tokenizer().encode(text, add_special_tokens)

    def check_tokens(self, ids: Sequence[int]) -> np.ndarray:
        """``ids`` as int32, or InvalidRequestError for a non-integer or an id outside the vocabulary."""
        if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in ids):
            raise InvalidRequestError("token ids must be a flat list of integers", "prompt")
        bad = [int(t) for t in ids if not 0 <= t < self.vocab_size]      # before any fixed-width conversion
        if bad:
            raise InvalidRequestError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size}); "
                                      "pass ids produced by this model's tokenizer", "prompt")
        return np.asarray(ids, dtype=np.int32)

    def render_chat(self, messages: list[dict]) -> list[int]:
        tok = self._need_tokenizer()
        try:
            text = tok.apply_chat_template(messages, add_generation_prompt=True)
        except InvalidRequestError:
            raise
        except ValueError as e:       # bad roles, contents, or a template that raised
            raise InvalidRequestError(str(e), "messages") from None
        return tok.encode(text, add_special_tokens=False)

    def grammar_compiler(self):
        """The GrammarCompiler of this vocabulary, built on first use (thread-safe: the server builds it, and
        compiles each new schema into its cache, off the engine thread)."""
        with self._grammars_lock:
            if self._grammars is None:
                from .grammar import GrammarCompiler
                self._grammars = GrammarCompiler(self._need_tokenizer(), self.vocab_size,
                                                stop_token_ids=sorted(self.eos_token_ids))
            return self._grammars

    def _need_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise InvalidRequestError(f"artifact {self.artifact.path} has no tokenizer; pass token ids instead "
                                      "of text, or compile from a model directory that has tokenizer.json")
        return self.tokenizer

