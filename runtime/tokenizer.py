"""Tokenizer stage: text <-> ids, chat templates, streaming detokenization, stop strings.

Reads exactly two files of a compiled artifact: ``tokenizer.json`` (a HF
``tokenizers`` file) and ``tokenizer_config.json`` (chat template and special
tokens, the file HF models ship). Behaviour follows transformers' fast
tokenizers so prompts tokenize the same way the model was trained on, without
importing transformers.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import processors

from .protocol import InvalidRequestError

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})
REPLACEMENT_CHAR = "\ufffd"  # what a lossy UTF-8 decode puts where a character is incomplete


def _token_text(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a plain string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


# Fill-in-the-middle's (prefix, suffix, middle) tokens by their names in a vocabulary (llama.cpp's list: a code model
# marks where the prefix and the suffix begin and where the middle it writes goes), and the tokens that end a middle
# besides EOS (padding, a file or repository separator: what a model writes past the hole).
FIM_TOKENS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),       # Qwen2.5 / Qwen3-Coder, CodeGemma
              ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),             # StarCoder 1 / 2, Granite Code
              ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
              ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),          # DeepSeek-Coder
              ("▁<PRE>", "▁<SUF>", "▁<MID>"), ("<PRE>", "<SUF>", "<MID>"),  # Code Llama
              ("<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"),    # GLM-4.5
              ("<|prefix|>", "<|suffix|>", "<|middle|>"))                   # Falcon-H1-Tiny-Coder
FIM_ENDS = ("<|fim_pad|>", "<fim_pad>", "<fim-pad>", "<|file_sep|>", "<file_sep>", "<|fim_repo|>", "<|repo_name|>",
            "<reponame>")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the printable character standing for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_LEVEL = _byte_level_alphabet()


def piece_bytes(piece: str) -> bytes | None:
    """The bytes a vocabulary piece stands for where it spells them itself: a byte-fallback token ("<0x0A>") or a
    byte-level BPE piece ("Ġhello"); None for a piece of another kind (its decoded text is its bytes)."""
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    if piece and all(c in _BYTE_LEVEL for c in piece):
        return bytes(_BYTE_LEVEL[c] for c in piece)
    return None


class Tokenizer:
    """A HF ``tokenizers`` tokenizer plus the special tokens and chat template of its config."""

    def __init__(self, tokenizer: HFTokenizer, config: dict[str, Any], name: str = "tokenizer") -> None:
        self._tok = tokenizer
        self._config = config
        self._name = name
        self.bos_token: str | None = _token_text(config.get("bos_token"))
        self.eos_token: str | None = _token_text(config.get("eos_token"))
        self.bos_token_id: int | None = self._id_of(self.bos_token)
        self.eos_token_id: int | None = self._id_of(self.eos_token)
        self.eos_token_ids: frozenset[int] = self._collect_eos_ids(config)
        self.special_token_ids: frozenset[int] = frozenset(
            i for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special
        )
        self._maybe_rebuild_post_processor(config)
        self._one: dict[int, str] = {}          # decode_one's
        self._bytes: dict[int, bytes] = {}      # token_bytes'
        self._template: jinja2.Template | None = None
        self._template_source: str | None = None

    @classmethod
    def from_dir(cls, path: Path) -> Tokenizer:
        """Load ``tokenizer.json`` and ``tokenizer_config.json`` from an artifact directory."""
        path = Path(path)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if not (path / name).is_file():
                raise ValueError(
                    f"artifact {path} has no {name}; recompile with `kiln compile` "
                    "(the artifact writer copies the model's tokenizer files)"
                )
        try:
            config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path / 'tokenizer_config.json'} is not valid JSON: {e}") from e
        return cls(HFTokenizer.from_file(str(path / "tokenizer.json")), config, name=str(path))

    # ---- ids and text -------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce, added tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def id_to_token(self, token_id: int) -> str | None:
        """The token string for an id (byte-level form, e.g. 'Ġhello'), or None if out of range."""
        return self._tok.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Tokenize ``text``; special tokens written in it (e.g. ``<|im_start|>``) become their ids.

        With ``add_special_tokens`` the BOS token is prepended when the config says
        ``add_bos_token: true`` (where the config is silent, when tokenizer.json's own
        post-processor adds it, as transformers does).
        """
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Turn ids back into text (no whitespace clean-up, like transformers for BPE)."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_one(self, token_id: int) -> str:
        """decode([token_id]), remembered: a stream decodes each new token alone once (at most one
        entry per vocabulary id)."""
        text = self._one.get(token_id)
        if text is None:
            text = self._one[token_id] = self._tok.decode([token_id], skip_special_tokens=False)
        return text

    def token_bytes(self, token_id: int) -> bytes:
        """A token's text as bytes, as llama.cpp's token_to_piece writes it with special tokens left out: b"" for a
        special token, a byte token's byte, a byte-level piece's bytes, a SentencePiece piece with its "▁" a space
        (remembered: at most one entry per vocabulary id)."""
        raw = self._bytes.get(token_id)
        if raw is None:
            piece = self.id_to_token(token_id) or ""
            text = self.decode_one(token_id)
            if token_id in self.special_token_ids:
                raw = b""
            elif "\ufffd" in text or piece.startswith("<0x"):
                raw = piece_bytes(piece) or text.encode("utf-8")
            else:
                raw = (" " + text if piece.startswith("▁") and not text.startswith(" ") else text).encode("utf-8")
            self._bytes[token_id] = raw
        return raw

    def fim_prompt(self, prefix: str, suffix: str, bos: bool = True) -> list[int] | None:
        """The ids of a fill-in-the-middle prompt, as llama.cpp's /infill and the code models' own FIM format build
        it: BOS where encode adds one, the prefix token, the prefix, the suffix token, the suffix, the middle token
        (the model writes the middle next); None where the vocabulary has no FIM tokens (FIM_TOKENS)."""
        marks = self.fim_marks()
        if marks is None:
            return None
        pre, suf, mid = marks
        first = [self.bos_token_id] if bos and self.adds_bos else []
        return [*first, pre, *self.encode(prefix, add_special_tokens=False), suf,
                *self.encode(suffix, add_special_tokens=False), mid]

    def fim_marks(self) -> tuple[int, int, int] | None:
        """The vocabulary's (prefix, suffix, middle) FIM token ids (FIM_TOKENS' first set it has whole), or None."""
        return next((tuple(ids) for names in FIM_TOKENS
                     if None not in (ids := [self._tok.token_to_id(n) for n in names])), None)

    def token_id_of(self, names: Iterable[str]) -> int | None:
        """The id of the first of ``names`` the vocabulary has, or None."""
        return next((i for n in names if (i := self._tok.token_to_id(n)) is not None), None)

    @functools.cached_property
    def adds_bos(self) -> bool:
        """Whether encode (with its special tokens) puts the BOS token first."""
        bos = self.bos_token_id
        plain = self.encode("a", add_special_tokens=False)
        return bos is not None and self.encode("a")[:1] == [bos] and plain[:1] != [bos]

    @property
    def fim_end_ids(self) -> tuple[int, ...]:
        """The vocabulary's FIM_ENDS tokens: a middle stops at them too."""
        return tuple(i for n in FIM_ENDS if (i := self._tok.token_to_id(n)) is not None)

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    def _collect_eos_ids(self, config: dict[str, Any]) -> frozenset[int]:
        """eos_token plus any extra stop tokens listed under "eos_token_ids" (ids or token strings)."""
        extra = config.get("eos_token_ids") or []
        if isinstance(extra, (int, str)):
            extra = [extra]
        ids = {self.eos_token_id}
        for item in extra:
            ids.add(item if isinstance(item, int) else self._id_of(_token_text(item)))
        return frozenset(i for i in ids if i is not None)

    def _maybe_rebuild_post_processor(self, config: dict[str, Any]) -> None:
        """Let add_bos_token / add_eos_token in the config decide which specials ``encode`` adds.

        Where the config names neither, tokenizer.json's own post-processor decides (for
        real models the two agree; transformers 5 always follows tokenizer.json).
        """
        explicit = "add_bos_token" in config or "add_eos_token" in config
        if not explicit and self._tok.post_processor is not None:
            return
        eos_id = self._id_of(self.eos_token)
        add_bos = bool(config.get("add_bos_token")) and self.bos_token_id is not None
        add_eos = bool(config.get("add_eos_token")) and eos_id is not None
        bos = [(self.bos_token, self.bos_token_id)] if add_bos else []
        eos = [(self.eos_token, eos_id)] if add_eos else []

        def sequence(piece: str, type_id: int) -> list[str]:
            return [f"{t}:{type_id}" for t, _ in bos] + [f"{piece}:{type_id}"] + [f"{t}:{type_id}" for t, _ in eos]

        self._tok.post_processor = processors.TemplateProcessing(
            single=sequence("$A", 0), pair=sequence("$A", 0) + sequence("$B", 1), special_tokens=bos + eos
        )

    # ---- chat template ------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """The special tokens' texts and the chat template (None without one), as the config gives them."""
        out = {key: text for key in ("bos_token", "eos_token", "pad_token", "unk_token")
               if (text := _token_text(self._config.get(key))) is not None}
        template = self._config.get("chat_template")
        return {**out, "chat_template": template if isinstance(template, str) else None}

    @property
    def chat_template(self) -> Any:
        """The chat template as the config gives it: jinja source, a list of named ones, or None."""
        return self._config.get("chat_template")

    def set_chat_template(self, source: str) -> None:
        """Use `source` (jinja) instead of the config's chat template (`--chat-template`)."""
        self._config = {**self._config, "chat_template": source}
        self._template = None

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, template: str | None = None,
        **extra: Any
    ) -> str:
        """Render ``messages`` with the model's jinja2 chat template (or ``template``'s source), as transformers does.

        ``extra`` is passed to the template (e.g. ``tools=[...]``); it overrides the
        special-token variables (bos_token, eos_token, ...) of the same name.
        """
        _validate_messages(messages)
        if template is not None:
            try:
                template = _given_template(template)
            except jinja2.TemplateError as e:
                raise ValueError(f"the chat template given does not parse: {e}") from None
        else:
            template = self._chat_template(has_tools=extra.get("tools") is not None)
        variables: dict[str, Any] = {
            key: token
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
            if (token := _token_text(self._config.get(key))) is not None
        }
        variables.update(extra)
        variables.setdefault("tools", None)
        variables.setdefault("documents", None)
        # Like transformers: drop None-valued keys, which templates handle worse than missing ones.
        plain = [{k: v for k, v in m.items() if v is not None} for m in messages]
        try:
            return template.render(messages=plain, add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.TemplateError as e:
            raise ValueError(f"the chat template of {self._name} rejected the conversation: {e}") from e

    def _chat_template(self, has_tools: bool) -> jinja2.Template:
        source = self._config.get("chat_template")
        if isinstance(source, list):  # older configs: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("tool_use") if has_tools and "tool_use" in named else named.get("default")
        if not source:
            raise ValueError(
                f"{self._name} has no chat template in tokenizer_config.json, so chat messages cannot be "
                "formatted; use `generate` with a plain text prompt instead"
            )
        if self._template is None or self._template_source != source:
            self._template = _jinja_env().from_string(source)
            self._template_source = source
        return self._template


@functools.lru_cache(maxsize=16)
def _given_template(source: str) -> jinja2.Template:
    """A chat template given with a request, compiled once (the last few kept)."""
    return _jinja_env().from_string(source)


def _validate_messages(messages: list[dict[str, Any]]) -> None:
    """Each message is a dict with a known role and string content; name the first bad one."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(message).__name__}")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise ValueError(f"messages[{i}] has role {role!r}; expected one of {sorted(CHAT_ROLES)}")
        if not isinstance(message.get("content"), str):
            raise ValueError(
                f"messages[{i}] ({role}) must have string 'content', got {type(message.get('content')).__name__}"
            )


def _jinja_env() -> ImmutableSandboxedEnvironment:
    """The sandboxed environment transformers renders chat templates in."""

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        # jinja's own tojson escapes HTML characters; chat templates expect plain json.dumps
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


class IncrementalDetokenizer:
    """Turns a stream of generated ids into text deltas.

    Concatenating every ``push`` result and ``flush()`` gives exactly
    ``tokenizer.decode(ids, skip_special_tokens)``, less an incomplete character at the very
    end (a reply cut by max_tokens inside a multi-byte character ends before it, not in U+FFFD). Each step decodes a small window:
    the ids of the previous delta (``[prefix, read)``) plus the ids not yet emitted
    (``[read, end)``), and emits the text past the previous delta's decoding (the
    prefix-offset / read-offset method of vLLM and HF's TextStreamer). The
    previous delta keeps first-token effects (e.g. a stripped leading space)
    out of the diff. While the window's text ends in U+FFFD the newest ids end
    inside a multi-byte character, so nothing is emitted until it completes.

    Decoding starts at the first generated id, as ``decode`` does, so no prompt
    ids are taken: prompt context would change how the first token's leading
    space decodes and break the equality above.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip = tokenizer.special_token_ids if skip_special_tokens else frozenset()
        self._ids: list[int] = []  # generated ids, minus skipped specials
        self._prefix = 0  # start of the window: first id of the last emitted delta
        self._read = 0  # first id whose text has not been emitted
        self._prefix_text = ""  # decode(ids[prefix:read])

    @property
    def ids(self) -> list[int]:
        """The ids pushed so far (special tokens left out when they are skipped)."""
        return list(self._ids)

    def push(self, token_id: int) -> str:
        """Add one generated id; return the text it completes (often "", never a partial character)."""
        if token_id in self._skip:
            # decode(skip_special_tokens=True) drops these before decoding, so leave them out entirely
            return ""
        self._ids.append(token_id)
        text = self._tokenizer.decode(self._ids[self._prefix:])
        if text.endswith(REPLACEMENT_CHAR) or len(text) <= len(self._prefix_text):
            return ""  # incomplete character (or nothing new yet): wait for more ids
        return self._advance(text)

    def flush(self) -> str:
        """Return whatever is held back at the end of a stream, without a trailing incomplete character."""
        if self._read >= len(self._ids):
            return ""
        text = self._tokenizer.decode(self._ids[self._prefix:]).rstrip(REPLACEMENT_CHAR)
        return self._advance(text) if len(text) > len(self._prefix_text) else ""

    def _advance(self, text: str) -> str:
        """Emit text past the window's prefix and slide the window forward to the new ids."""
        delta = text[len(self._prefix_text):]
        self._prefix, self._read = self._read, len(self._ids)
        window = self._ids[self._prefix:self._read]
        self._prefix_text = (self._tokenizer.decode_one(window[0]) if len(window) == 1
                             else self._tokenizer.decode(window))
        return delta


def bad_word_ids(tokenizer: Tokenizer | None, words: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """vLLM's bad_words as token sequences: each word (leading spaces stripped) as encoded alone, and as encoded after
    a space where that gives the same number of tokens with another first one (the word starting a later word)."""
    if words and tokenizer is None:
        raise InvalidRequestError("bad_words needs the model's tokenizer; this engine has none", "bad_words")
    out: list[tuple[int, ...]] = []
    for word in words:
        bare = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        out.append(bare)
        if len(spaced) == len(bare) and spaced[0] != bare[0]:
            out.append(spaced)
    return tuple(out)


class StopStringMatcher:
    """Cuts a text stream at the first stop string, holding back what might start one.

    ``feed`` returns text that can no longer become part of a stop string; a
    suffix that is a prefix of some stop string waits for the next delta.
    """

    def __init__(self, stop: Iterable[str]) -> None:
        self.stop: tuple[str, ...] = (stop,) if isinstance(stop, str) else tuple(stop)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {list(self.stop)!r}")
        self._held = ""
        self._quiet = 0                     # how many of the held chars were fed unmatched (no stop may end there)
        self.stopped = False
        self.matched: str | None = None     # the stop string that was hit (the first in the text)

    def feed(self, delta: str, match: bool = True) -> tuple[str, bool]:
        """Add ``delta``; return (text safe to emit, whether a stop string was hit).

        On a hit the returned text ends just before the stop string; later calls return ("", True).
        ``match`` False (vLLM's min_tokens not yet reached): no stop string may end in this delta, but one it
        begins and a later delta ends is found, as vLLM finds it, so its start is still held back.
        """
        if self.stopped:
            return "", True
        if not self.stop:                   # no stop strings (most requests): every token passes here
            return delta, False
        text = self._held + delta
        quiet = self._quiet if match else len(text)
        hits = [(i, s) for s in self.stop if (i := text.find(s, max(0, quiet - len(s) + 1))) >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda hit: hit[0])
            self.stopped, self._held = True, ""
            return text[:at], True
        keep = self._partial_stop_suffix(text)
        self._held = text[len(text) - keep:] if keep else ""
        self._quiet = max(0, quiet - (len(text) - keep))
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """Release held-back text at the end of the stream ("" after a stop string was hit)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_stop_suffix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest
