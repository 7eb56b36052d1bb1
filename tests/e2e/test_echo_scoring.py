"""/v1/completions as lm-eval scores with it: echo + logprobs (+ max_tokens 0), lists of prompts (text
or token ids) answered as one choice per prompt times n; prompt logprobs equal transformers'."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from test_server import MODEL, server  # noqa: F401 (the served tiny model fixture)

pytestmark = pytest.mark.e2e
TOL = 1e-4


@pytest.fixture(scope="module")
def reference(tiny_dirs):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_dirs["tied"], torch_dtype=torch.float32).eval()


def _ref_logprobs(model, ids):
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1).numpy()


def test_echo_scores_a_batch_of_token_prompts(server, reference):
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, 512, size=n).tolist() for n in (12, 7, 20, 3)]
    body = {"model": MODEL, "prompt": prompts, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0}
    out = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).json()
    choices = sorted(out["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert out["usage"]["prompt_tokens"] == sum(map(len, prompts)) and out["usage"]["completion_tokens"] == 0
    for ids, c in zip(prompts, choices):
        lp = c["logprobs"]
        assert len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        ref = _ref_logprobs(reference, ids)
        np.testing.assert_allclose(lp["token_logprobs"][1:], [ref[i - 1, ids[i]] for i in range(1, len(ids))],
                                   atol=TOL, rtol=0)
        assert all(len(t) == 1 for t in lp["top_logprobs"][1:])
        assert c["finish_reason"] == "length"


def test_echo_with_generation_and_n_through_the_sdk(server):
    client = server.client()
    out = client.completions.create(model=MODEL, prompt=["hello there", "the cache"], max_tokens=3, n=2, echo=True,
                                    logprobs=2, temperature=0.8, seed=5)
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    for c in out.choices:
        prompt = ["hello there", "the cache"][c.index // 2]
        assert c.text.startswith(prompt)
        lp = c.logprobs
        n_prompt = len(lp.tokens) - 3
        assert lp.token_logprobs[0] is None and all(x is not None for x in lp.token_logprobs[1:])
        assert lp.text_offset[0] == 0 and "".join(lp.tokens[:n_prompt]) == prompt
    assert out.usage.completion_tokens == 12


def test_echo_streams_the_prompt_first(server):
    client = server.client()
    stream = client.completions.create(model=MODEL, prompt="hello there", max_tokens=4, echo=True, stream=True,
                                       temperature=0)
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    plain = client.completions.create(model=MODEL, prompt="hello there", max_tokens=4, temperature=0)
    assert chunks[0].choices[0].text.startswith("hello there")
    assert text == "hello there" + plain.choices[0].text
