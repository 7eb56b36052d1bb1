"""The default model end to end: SmolLM2-135M-Instruct from its Q4_1 GGUF, compiled q0f32 for the CPU,
against transformers loading the same GGUF (weights dequantized to float32)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from kiln import Engine, SamplingParams

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONVERSATIONS = [
    [{"role": "user", "content": "Write a short story about a robot who learns to paint."}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Explain why the sky is blue, step by step."}],
]


@pytest.fixture(scope="module")
def reference(smollm2_transformers):
    return smollm2_transformers.tokenizer, smollm2_transformers.model()


@pytest.fixture(scope="module")
def engine(smollm2_artifact):
    return Engine(smollm2_artifact)


def _template_ids(tok, messages) -> list[int]:
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["story", "system+sky"])
def test_greedy_chat_matches_transformers_for_32_tokens(engine, reference, messages):
    tok, model = reference
    ids = engine.render_chat(messages)
    assert ids == _template_ids(tok, messages), "chat template or tokenizer differs from transformers"
    out = engine.generate(ids, SamplingParams(max_tokens=32, temperature=0.0))
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids):].tolist()
    assert out.token_ids == ref
    assert len(out.token_ids) == 32 and out.finish_reason == "length"
    assert out.text == tok.decode(ref)


def test_stream_equals_collected_text(engine):
    params = SamplingParams(max_tokens=24, temperature=0.8, seed=3)
    ids = engine.render_chat(CONVERSATIONS[0])
    streamed = "".join(d.text for d in engine.generate_stream(ids, params))
    assert streamed == engine.generate(ids, params).text    # same seed, same output


def test_cli_generate_json_equals_engine(engine, smollm2_artifact):
    proc = subprocess.run([sys.executable, "-m", "kiln.cli", "generate", str(smollm2_artifact),
                           "The three primary colors are", "--temperature", "0", "--max-tokens", "12", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    want = engine.generate("The three primary colors are", SamplingParams(max_tokens=12, temperature=0.0))
    assert got["token_ids"] == want.token_ids and got["text"] == want.text
