"""lm-eval (lm-evaluation-harness) scores a multiple-choice task through `kiln serve` unmodified:
local-completions with --batch_size 4 (a list of prompts per request, echo + logprobs, max_tokens 0/1),
and its per-choice loglikelihoods equal kiln's own prompt logprobs summed."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln import SamplingParams
from test_server import MODEL, server  # noqa: F401 (the served tiny model fixture)

pytestmark = pytest.mark.e2e

DOCS = [
    {"question": "The quick brown fox jumps over the", "choices": ["lazy dog", "moon", "fence"], "answer": 0},
    {"question": "Compilers turn programs into", "choices": ["fast code", "soup", "rain"], "answer": 0},
    {"question": "Paged attention keeps the KV cache in", "choices": ["pages", "boxes"], "answer": 0},
    {"question": "Numbers 0123", "choices": ["456789", "and", "!!"], "answer": 0},
    {"question": "batching shares the", "choices": ["weights", "cake", "road", "sky"], "answer": 0},
]


@pytest.mark.parametrize("backend", ["huggingface", "remote"])
def test_lm_eval_multiple_choice_equals_kiln_logprobs(server, tiny_dirs, tiny_artifacts, tmp_path, monkeypatch,
                                                      backend):
    """remote: lm-eval tokenizes through the server's /tokenizer_info, /tokenize and /detokenize."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "kiln_mc.yaml").write_text(
        f"task: kiln_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path / 'data.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n")
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=f"base_url={server.url}/v1/completions,model={MODEL},tokenizer={tiny_dirs['tied']},"
                   f"tokenizer_backend={backend},num_concurrent=1,max_retries=1",
        tasks=["kiln_mc"], task_manager=TaskManager(include_path=str(tmp_path)), batch_size=4, log_samples=True)
    samples = results["samples"]["kiln_mc"]
    assert len(samples) == len(DOCS) and 0.0 <= results["results"]["kiln_mc"]["acc,none"] <= 1.0

    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_dirs["tied"])
    engine = kiln.Engine(tiny_artifacts["tied"])
    for sample in samples:
        args = sample["arguments"]          # in process: [(context, continuation)]; the saved file: a dict
        pairs = [(a["arg_0"], a["arg_1"]) for a in args.values()] if isinstance(args, dict) else args
        for (context, continuation), resp in zip(pairs, sample["resps"]):
            special = backend == "huggingface"       # the remote tokenizer asks for no special tokens
            whole = tok.encode(context + continuation, add_special_tokens=special)
            ctx = tok.encode(context, add_special_tokens=special)
            out = engine.generate(whole, SamplingParams(max_tokens=0, prompt_logprobs=0))
            mine = sum(lp.logprob for lp in out.prompt_logprobs[len(ctx):])
            np.testing.assert_allclose(float(resp[0][0]), mine, atol=1e-4, rtol=0)
