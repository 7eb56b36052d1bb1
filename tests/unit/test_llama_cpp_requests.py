"""llama-server's requests as kiln reads them (runtime/llama_cpp_api): the sampling a /completion body asks for, and
/infill's prompt (infill_ids) against llama-server's format_prompt_infill, written out by hand: in a context past
llama.cpp's 2048-token batch the extra files come first (the repository's name, each file after a separator and its
name, the current file's separator), the prefix keeps its last 1536 tokens and the suffix its first 512 less the
prompt and two; without FIM_SEP each extra file follows a snippet line."""

from __future__ import annotations

import asyncio
import math
import re
import time

import pytest

from kiln.runtime.llama_cpp_api import SNIPPET, InfillRequest, LlamaCompletionRequest, infill_ids, nested_values, sampling
from kiln.runtime.llama_fields import editor_limits
from kiln.runtime.protocol import InvalidRequestError, StreamDelta
from kiln.runtime.tokenizer import Tokenizer
from tiny_models import write_tokenizer

pytestmark = pytest.mark.unit
FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


def _tokenizer(tmp_path, *more: str) -> Tokenizer:
    write_tokenizer(tmp_path, 512, specials=(*FIM, *more))
    return Tokenizer.from_dir(tmp_path)


def test_a_repository_level_prompt(tmp_path):
    tok = _tokenizer(tmp_path, "<|fim_repo|>", "<|file_sep|>")
    def enc(text):
        return tok.encode(text, add_special_tokens=False)
    pre, suf, mid = tok.fim_marks()
    repo, sep = tok.token_id_of(["<|fim_repo|>"]), tok.token_id_of(["<|file_sep|>"])
    prefix, suffix = "x = 1\n" * 600, "y = 2\n" * 300
    assert len(enc(prefix)) > 1536 and len(enc(suffix)) > 512
    req = InfillRequest(input_prefix=prefix, input_suffix=suffix, prompt="z",
                        input_extra=[{"filename": "a.py", "text": "A = 0\n"}, {"text": "B = 1\n"}])
    want = [repo, *enc("myproject\n"), sep, *enc("a.py\n"), *enc("A = 0\n"), sep, *enc("tmp\n"), *enc("B = 1\n"),
            sep, *enc("filename\n"), pre, *enc(prefix)[-1536:], *enc("z"), suf, *enc(suffix)[:512 - 3], mid]
    assert infill_ids(req, tok, n_predict=16, context_window=8192) == want
    extra = want[:want.index(pre)]
    assert len(extra) > 24
    cut = infill_ids(req, tok, n_predict=1012, context_window=4096)            # leaves 4096 - 2048 - 2024 = 24
    assert cut == extra[-24:] + want[len(extra):]
    assert infill_ids(req, tok, n_predict=1100, context_window=4096)[0] == pre                       # none left


def test_extra_files_after_a_snippet_line_without_file_separators(tmp_path):
    tok = _tokenizer(tmp_path)
    def enc(text):
        return tok.encode(text, add_special_tokens=False)
    pre, suf, mid = tok.fim_marks()
    req = InfillRequest(input_prefix="p", input_suffix="s", input_extra=[{"filename": "a.py", "text": "A"}])
    assert infill_ids(req, tok, 8, 8192) == [*enc(SNIPPET), *enc("A"), pre, *enc("p"), suf, *enc("s"), mid]


def test_a_bodys_sampling(tmp_path):
    """llama.cpp's defaults and chain order, n_predict -1 as the context's room, logit_bias pairs and maps (false:
    never; a text: each of its tokens), n_probs as top logprobs."""
    tok = _tokenizer(tmp_path)
    p = sampling(LlamaCompletionRequest(prompt="x"), prompt_len=10, context_window=256, tokenizer=tok)
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.temperature_last) == (0.8, 40, 0.95, 0.05, True)
    assert p.max_tokens == 246 and p.seed is None and not p.logprobs
    word = tok.encode("upon", add_special_tokens=False)
    body = LlamaCompletionRequest(prompt="x", n_predict=4, seed=5, n_probs=2, logit_bias=[[7, False], ["upon", 2]])
    p = sampling(body, 10, 256, tok)
    assert p.logit_bias == {7: -math.inf, **dict.fromkeys(word, 2.0)} and p.top_logprobs == 2 and p.seed == 5
    assert sampling(LlamaCompletionRequest(logit_bias={"7": False}), 1, 256, tok).logit_bias == {7: -math.inf}


def test_nulls_are_defaults_and_ranges_clamp_as_llama_server_reads_them(tmp_path):
    tok = _tokenizer(tmp_path)
    body = LlamaCompletionRequest(prompt="x", temperature=None, top_k=-5, top_p=1.5, min_p=None, repeat_penalty=1.2,
                                  repeat_last_n=-1)                   # -1: the whole context (older llama-servers)
    p = sampling(body, 5, 256, tok)
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty) == (0.8, 0, 1.0, 0.05, 1.2)
    assert sampling(LlamaCompletionRequest(prompt="x", top_p=0), 5, 256, tok).top_p > 0      # the likeliest only


@pytest.mark.parametrize("samplers, want", [
    (["top_k", "top_p", "infill"], dict(top_k=40, top_p=0.9, min_p=0.0, temperature=1.0, infill=True)),  # llama.vim's
    ("kpmt", dict(top_k=40, top_p=0.9, min_p=0.05, temperature=0.8, temperature_last=True, infill=False)),
    (["temp", "top-k", "minp"], dict(top_k=40, top_p=1.0, min_p=0.05, temperature=0.8, temperature_last=False)),
    (["penalties", "dry", "top_k", "xtc", "temperature"], dict(top_k=40, top_p=1.0, repetition_penalty=1.2)),
    ([], dict(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0, repetition_penalty=1.0)),    # the draw alone
])
def test_a_samplers_chain_turns_off_what_it_leaves_out(tmp_path, samplers, want):
    """A sampler not in the chain does nothing (llama.cpp builds the chain from the list alone): its field is off,
    temperature too (the final draw is at temperature 1); temperature first or last sets the order."""
    body = LlamaCompletionRequest(prompt="x", top_p=0.9, repeat_penalty=1.2, repeat_last_n=-1, samplers=samplers)
    p = sampling(body, 5, 256, _tokenizer(tmp_path))
    assert {k: getattr(p, k) for k in want} == pytest.approx(want)


@pytest.mark.parametrize("samplers, says", [
    (["top_p", "top_k"], "in that order"), (["top_k", "temperature", "top_p"], "not between"),
    (["top_k", "penalties"], "penalties first"), (["mirostat"], "unknown sampler 'mirostat'"), ("kq", "'q'"),
    (["adaptive_p"], "not implemented"), (["top_k", "top_k"], "once"), (["top_p", "infill"], "top_k (1 to 1000)"),
])
def test_chains_kiln_cannot_follow_are_a_400(tmp_path, samplers, says):
    body = LlamaCompletionRequest(prompt="x", repeat_penalty=1.2, repeat_last_n=-1, samplers=samplers)
    with pytest.raises(InvalidRequestError, match=re.escape(says)) as e:
        sampling(body, 5, 256, _tokenizer(tmp_path))
    assert e.value.param == "samplers"


def test_response_fields_pick_nested_values():
    result = {"content": "x", "timings": {"prompt_n": 3, "predicted_ms": 1.5}, "truncated": False}
    assert nested_values(result, ["content", "timings/prompt_n", "truncated", "nope", "content/x"]) == \
        {"content": "x", "timings/prompt_n": 3, "truncated": False}


def _deltas(*pieces: str | tuple[str, str], closed: list | None = None):
    """A choice's deltas, one token each ("text" or ("text", finish_reason)); ``closed`` gets True when the consumer
    closes them early (the engine's request then aborted)."""
    async def gen():
        try:
            for i, piece in enumerate(pieces):
                text, finish = piece if isinstance(piece, tuple) else (piece, None)
                yield StreamDelta(0, text, [i], finish)
        except GeneratorExit:
            closed.append(True) if closed is not None else None
            raise
    return gen()


def _limited(deltas, n_indent=0, t_max_predict_ms=0, clock=None):
    async def run():
        return [d async for d in editor_limits(deltas, 1, n_indent, t_max_predict_ms, clock=clock or time.monotonic)]
    return asyncio.run(run())


@pytest.mark.parametrize("pieces, n_indent, text, finish", [
    (["if x:", "\n    ", "y = 1", "\n", "z = 2", "\n"], 4, "if x:\n    y = 1\n", "length"),   # z's line: no indent
    (["def f():\n", "  a\n", "    b"], 4, "def f():\n  ", "length"),         # cut before the line's text
    (["x", "\n", "\n", "    y"], 4, "x\n", "length"),                          # a blank line ends it too
    (["x = 1", "\n", "    ", "\tq"], 4, "x = 1\n    \tq", None),              # tabs count as one each
    (["first line unchecked", " z"], 8, "first line unchecked z", None),
    (["a\n    b\n    c\n", ("    d", "stop")], 4, "a\n    b\n    c\n    d", "stop"),
])
def test_n_indent_ends_the_generation_at_the_first_line_indented_less(pieces, n_indent, text, finish):
    out = _limited(_deltas(*pieces), n_indent=n_indent)
    assert "".join(d.text for d in out) == text
    assert [d.finish_reason for d in out] == [None] * (len(out) - 1) + [finish]


def test_the_time_limit_ends_at_a_newline_past_it():
    """t_max_predict_ms counts from the first token; only a token with a newline ends the generation (kept)."""
    now, closed = iter([0.0, 0.1, 0.3, 0.4, 0.5, 0.6]), []
    out = _limited(_deltas("a", "\n", "b", "c", "d\ne", "f", closed=closed), t_max_predict_ms=250,
                   clock=lambda: next(now))
    assert [d.text for d in out] == ["a", "\n", "b", "c", "d\ne"] and out[-1].finish_reason == "length"
    assert closed == [True]                                       # the rest is not generated: the request aborted
