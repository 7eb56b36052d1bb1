"""llama-server's requests as kiln reads them (runtime/llama_cpp_api): the sampling a /completion body asks for, and
/infill's prompt (infill_ids) against llama-server's format_prompt_infill, written out by hand: in a context past
llama.cpp's 2048-token batch the extra files come first (the repository's name, each file after a separator and its
name, the current file's separator), the prefix keeps its last 1536 tokens and the suffix its first 512 less the
prompt and two; without FIM_SEP each extra file follows a snippet line."""

from __future__ import annotations

import math

import pytest

from kiln.runtime.llama_cpp_api import SNIPPET, InfillRequest, LlamaCompletionRequest, infill_ids, sampling
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
