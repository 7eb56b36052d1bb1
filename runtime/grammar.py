"""Structured output: JSON constrained by xgrammar token masks.

    GrammarCompiler(tokenizer, vocab_size)           once per engine
      .compile(response_format) -> GrammarState      once per request (None for "text")
    per step:  Sampler.prepare   -> state.fill_mask(bitmask, row)   (which tokens may come next)
               after sampling    -> state.accept(token)
               state.is_terminated() -> the request stops ("stop")

A GrammarState wraps one xgrammar GrammarMatcher. Once the JSON value is
complete the mask allows only the stop (eos) tokens; accepting one of them
terminates the matcher, which is how the engine learns the output is done
(Request.append asks is_terminated() after accept). The eos token therefore
has to be sampled even when the request says ignore_eos.

The vocabulary is handed to xgrammar from kiln's own Tokenizer (tokenizer.json),
never through transformers. xgrammar imports torch and transformers itself
when its package loads, so this module imports it lazily: engines that serve
no structured-output request never pay for it.
"""

from __future__ import annotations

import json
import os
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .protocol import InvalidRequestError
from .tokenizer import Tokenizer

if TYPE_CHECKING:
    import xgrammar

_OPENAI_WRAPPER_KEYS = frozenset({"name", "description", "strict", "schema"})


def bitmask_width(vocab_size: int) -> int:
    """int32 words per row of a packed token bitmask (bit j of word i is token 32 * i + j)."""
    return (vocab_size + 31) // 32


def unpack_bitmask(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """Packed int32 bitmask [rows, words] -> allowed [rows, vocab_size] bool (tokens past the mask: False)."""
    as_bytes = np.ascontiguousarray(bitmask, dtype="<i4").view(np.uint8)      # [rows, words * 4]
    bits = np.unpackbits(as_bytes, axis=-1, bitorder="little").view(bool)     # [rows, words * 32]
    if bits.shape[-1] >= vocab_size:
        return bits[..., :vocab_size]
    pad = np.zeros((*bits.shape[:-1], vocab_size - bits.shape[-1]), bool)
    return np.concatenate([bits, pad], axis=-1)


def _import_xgrammar():
    try:
        import xgrammar
    except ImportError as e:
        raise InvalidRequestError(
            "response_format json_object / json_schema needs the xgrammar package on the server; "
            "install it with `pip install 'kiln[serve]'` or send response_format {'type': 'text'}",
            "response_format") from e
    return xgrammar


class GrammarState:
    """One request's position in its grammar: the mask of the next token, accept, terminated."""

    def __init__(self, matcher: xgrammar.GrammarMatcher, vocab_size: int, stop_token_ids: Iterable[int]):
        self._matcher = matcher
        self.vocab_size = vocab_size          # mask width in tokens = the model's logits width
        self.stop_token_ids = frozenset(stop_token_ids)

    def fill_mask(self, bitmask: np.ndarray, index: int = 0) -> None:
        """Write the allowed next tokens into ``bitmask[index]`` (int32 [rows, bitmask_width(vocab)]).

        Once terminated nothing may follow, so only the stop tokens are left set
        (a request is normally finished by then and never asks).
        """
        if bitmask.dtype != np.int32 or bitmask.ndim != 2 or bitmask.shape[1] != bitmask_width(self.vocab_size):
            raise ValueError(f"bitmask must be int32 [rows, {bitmask_width(self.vocab_size)}], "
                             f"got {bitmask.dtype} {list(bitmask.shape)}")
        if self._matcher.is_terminated():
            words = bitmask.view(np.uint32)
            words[index] = 0
            for t in self.stop_token_ids:
                words[index, t // 32] |= np.uint32(1 << (t % 32))
            return
        self._matcher.fill_next_token_bitmask(bitmask, index)

    def allowed_mask(self) -> np.ndarray:
        """Allowed next tokens as bool [vocab_size] (for tests and inspection; the sampler packs masks)."""
        bitmask = np.full((1, bitmask_width(self.vocab_size)), -1, np.int32)
        self.fill_mask(bitmask)
        return unpack_bitmask(bitmask, self.vocab_size)[0]

    def accept(self, token_id: int) -> bool:
        """Advance by a sampled token. False: the grammar rejects it (cannot happen under its own mask)."""
        if self._matcher.is_terminated():
            return False      # nothing follows a stop token (and xgrammar would log a warning)
        return bool(self._matcher.accept_token(int(token_id)))

    def is_completed(self) -> bool:
        """The text so far is a complete value: a stop token is allowed now."""
        return bool(self._matcher.is_completed())

    def is_terminated(self) -> bool:
        """A stop token was accepted after a complete value: the request is done."""
        return bool(self._matcher.is_terminated())


class PreparedFormat(dict):
    """A response_format that carries its compiled grammar (GrammarCompiler.prepare): the engine
    thread then neither parses the schema nor looks it up. Pickled (to an engine in another process)
    it goes as the grammar's serialized form, deserialized there once per schema (``key``)."""

    def __init__(self, response_format: Mapping[str, Any], grammar: xgrammar.CompiledGrammar | None,
                 key: str = "", serialized: str | None = None):
        super().__init__(response_format)
        self.grammar = grammar              # None once it has crossed: compile() deserializes `serialized`
        self.key = key
        self.serialized = serialized

    def __reduce__(self):
        text = self.serialized if self.serialized is not None else self.grammar.serialize_json()
        return PreparedFormat, (dict(self), None, self.key, text)


class GrammarCompiler:
    """Compiles response_format into GrammarStates for one tokenizer; compiled grammars are cached.

    ``vocab_size`` is the model's logits width, which may exceed the tokenizer's
    (padded embeddings): the extra ids never decode, so they are never allowed.
    ``stop_token_ids`` default to the tokenizer's eos tokens; the engine should
    pass every id that ends a request (its eos set).
    """

    def __init__(self, tokenizer: Tokenizer, vocab_size: int | None = None,
                 stop_token_ids: Iterable[int] | None = None, cache_size: int = 128):
        xgr = _import_xgrammar()
        self.vocab_size = int(vocab_size or tokenizer.vocab_size)
        stops = sorted(t for t in set(stop_token_ids if stop_token_ids is not None else tokenizer.eos_token_ids)
                       if 0 <= t < self.vocab_size)
        if not stops:
            raise InvalidRequestError("this model cannot do structured output: its tokenizer has no eos token to "
                                      "end the JSON with; send response_format {'type': 'text'}", "response_format")
        self.stop_token_ids = tuple(stops)
        self.tokenizer_info = tokenizer_info(tokenizer, self.vocab_size, self.stop_token_ids)
        self._xgr = xgr
        # compiles run beside the engine thread (server.py compiles off it): leave that thread a core
        self._compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=max(1, min(8, (os.cpu_count() or 2) - 1)))
        self._cache: OrderedDict[str, xgrammar.CompiledGrammar] = OrderedDict()
        self._wire: OrderedDict[str, str] = OrderedDict()      # serialized grammars, for an engine process
        self._cache_size = cache_size

    @property
    def cached_grammars(self) -> int:
        """How many compiled grammars are cached (a schema compiles once, then every request reuses it)."""
        return len(self._cache)

    def compile(self, response_format: Mapping[str, Any] | None) -> GrammarState | None:
        """A fresh GrammarState for {"type": "json_object"} or {"type": "json_schema", ...}; None for text."""
        compiled = self._compiled(response_format)
        if compiled is None:
            return None
        return GrammarState(self._xgr.GrammarMatcher(compiled), self.vocab_size, self.stop_token_ids)

    def prepare(self, response_format: Mapping[str, Any] | None,
                serialized: bool = False) -> Mapping[str, Any] | None:
        """``response_format`` with its grammar compiled (slow for a new schema: call it off the engine
        thread); compile() of the result then only builds a matcher. Text formats come back as given.
        serialized: the result also carries the grammar as text, for an engine in another process
        (milliseconds for a 50k-token vocabulary, so kept per schema)."""
        compiled = self._compiled(response_format)
        if compiled is None:
            return response_format
        key = _key(response_format)
        text = None
        if serialized:
            text = self._wire.get(key)
            if text is None:
                text = self._wire[key] = compiled.serialize_json()
                if len(self._wire) > self._cache_size:
                    self._wire.popitem(last=False)
        return PreparedFormat(response_format, compiled, key, text)

    def _compiled(self, response_format: Mapping[str, Any] | None) -> xgrammar.CompiledGrammar | None:
        if isinstance(response_format, PreparedFormat) and response_format.grammar is not None:
            return response_format.grammar
        if isinstance(response_format, PreparedFormat):       # compiled in another process: serialized
            key, schema = response_format.key, None
        else:
            kind, schema = _parse_response_format(response_format)
            if kind == "text":
                return None
            key = _key(response_format)
        compiled = self._cache.get(key)
        if compiled is not None:
            self._cache.move_to_end(key)
            return compiled
        if isinstance(response_format, PreparedFormat):
            compiled = self._xgr.CompiledGrammar.deserialize_json(response_format.serialized, self.tokenizer_info)
        else:
            compiled = self._compile(kind, schema, key, response_format.get("param", "response_format"))
        self._cache[key] = compiled
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return compiled

    def _compile(self, kind: str, schema: dict | str | None, schema_json: str, param: str = "response_format"
                 ) -> xgrammar.CompiledGrammar:
        if kind == "structural_tag":
            return self._structural_tag(schema, param)
        if kind in ("regex", "grammar"):                   # guided decoding: xgrammar's own languages
            try:
                return (self._compiler.compile_regex if kind == "regex" else self._compiler.compile_grammar)(schema)
            except (RuntimeError, ValueError) as e:
                raise InvalidRequestError(f"{param} is not a {'regular expression' if kind == 'regex' else 'grammar'}"
                                          f" kiln compiles: {_reason(e)}", param) from None
        if schema is None:
            # OpenAI's json_object means a JSON object (not any value); compact whitespace keeps
            # greedy decoding from looping on spaces.
            return self._compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
        try:
            return self._compiler.compile_json_schema(schema_json, any_whitespace=False)
        except (RuntimeError, ValueError) as e:
            what = "response_format.json_schema" if param == "response_format" else param
            raise InvalidRequestError(f"{what} is not a usable JSON schema: {_reason(e)}", param) from None

    def _structural_tag(self, tag: dict, param: str) -> xgrammar.CompiledGrammar:
        """xgrammar's structural tag: vLLM's legacy form (structures of begin, JSON schema, end, dispatched where a
        trigger is written; free text elsewhere) or xgrammar's format tree ({"type": "structural_tag", "format"})."""
        xgr = self._xgr
        try:
            if "structures" in tag:
                extra = set(tag) - {"type", "structures", "triggers"}
                if extra:
                    raise ValueError(f"a structural tag with structures takes triggers beside them, not "
                                     f"{sorted(extra)}")
                items = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s.get("schema", {})), end=s["end"])
                         for s in tag["structures"]]
                return self._compiler.compile_structural_tag(items, list(tag.get("triggers", ())))
            return self._compiler.compile_structural_tag(json.dumps(tag))
        except (RuntimeError, ValueError, TypeError, KeyError) as e:
            raise InvalidRequestError(f"{param} is not a structural tag kiln compiles: {_reason(e)} (vLLM's "
                                      '{"structures": [{"begin", "schema", "end"}], "triggers": [...]}, or '
                                      'xgrammar\'s {"type": "structural_tag", "format": {...}})', param) from None


def _reason(error: Exception) -> str:
    """xgrammar's error's last line without its "[time] file.cc:123: " prefix."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    return re.sub(r"^\[[^\]]*\]\s*\S+\.cc:\d+:\s*", "", lines[-1])


def tokenizer_info(tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Iterable[int]) -> xgrammar.TokenizerInfo:
    """xgrammar's view of the vocabulary, built from tokenizer.json alone (no transformers).

    Ids are laid out as the model sees them (``vocab_size`` wide). Special added
    tokens other than the stop tokens are passed as empty strings, which
    xgrammar treats as never allowed: a chat marker cannot appear inside JSON.
    The vocabulary's encoding (byte-level BPE, byte-fallback, raw) is read from
    the tokenizer.json backend exactly as xgrammar's from_huggingface does.
    """
    xgr = _import_xgrammar()
    hf = tokenizer._tok
    stops = set(stop_token_ids)
    encoded: list[str] = [""] * vocab_size
    for token, i in hf.get_vocab(with_added_tokens=True).items():
        if i < vocab_size and (i not in tokenizer.special_token_ids or i in stops):
            encoded[i] = token
    meta = xgr.TokenizerInfo._detect_metadata_from_hf(hf.to_str())
    return xgr.TokenizerInfo(encoded, meta["vocab_type"], vocab_size=vocab_size,
                             stop_token_ids=sorted(stops), add_prefix_space=meta["add_prefix_space"])


def _key(response_format: Mapping[str, Any]) -> str:
    """The cache key of a json_object / json_schema / regex / grammar format (the schema's JSON: key order matters,
    it orders properties; the pattern or grammar tagged with its kind)."""
    kind, schema = _parse_response_format(response_format)
    if kind in ("regex", "grammar"):
        return f"{kind}:{schema}"
    if kind == "structural_tag":
        return f"{kind}:{json.dumps(schema)}"
    return "json_object" if schema is None else json.dumps(schema)


def _parse_response_format(rf: Mapping[str, Any] | None) -> tuple[str, dict | None]:
    """("text", None) | ("json_object", None) | ("json_schema", schema); names what is wrong otherwise.

    json_schema takes OpenAI's {"json_schema": {"name": ..., "schema": {...}}} or a
    bare schema under "json_schema".
    """
    if rf is None:
        return "text", None
    if not isinstance(rf, Mapping):
        raise InvalidRequestError(f"response_format must be an object, got {type(rf).__name__}", "response_format")
    kind = rf.get("type")
    if kind in ("text", "json_object"):
        return kind, None
    if kind in ("regex", "grammar"):          # guided decoding (openai_api.guided_format): a pattern or EBNF
        return kind, rf[kind]
    if kind == "structural_tag":
        tag = rf.get("structural_tag", rf)
        if not isinstance(tag, Mapping):
            raise InvalidRequestError("a structural tag is a JSON object", rf.get("param", "response_format"))
        return kind, {k: v for k, v in tag.items() if k != "param"}
    if kind != "json_schema":
        raise InvalidRequestError(f"response_format.type must be text, json_object or json_schema, got {kind!r}",
                                  "response_format")
    spec = rf.get("json_schema")
    if not isinstance(spec, Mapping):
        raise InvalidRequestError('response_format json_schema needs "json_schema": {"name": ..., "schema": {...}}',
                                  "response_format")
    if "schema" in spec:
        schema = spec["schema"]
    elif spec and set(spec) <= _OPENAI_WRAPPER_KEYS:
        raise InvalidRequestError('response_format.json_schema has no "schema"; put the JSON schema there',
                                  "response_format")
    else:
        schema = spec
    if not isinstance(schema, Mapping):
        raise InvalidRequestError(f"response_format.json_schema.schema must be an object, got {type(schema).__name__}",
                                  "response_format")
    try:
        return "json_schema", json.loads(json.dumps(schema))
    except (TypeError, ValueError) as e:
        raise InvalidRequestError(f"response_format.json_schema.schema is not JSON-serializable: {e}",
                                  "response_format") from None
