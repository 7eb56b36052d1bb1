"""`kiln serve --speculative-tokens` (and `--draft-model`): a lone greedy stream through the OpenAI client gets the same text
as without speculation, in fewer forwards, with chunks that carry several tokens, and /metrics counts
the draft tokens checked and kept (through the engine process's pipe too)."""

from __future__ import annotations

import pytest

from kiln import Engine, EngineConfig, SamplingParams
from kiln.runtime.server import ServerArgs
from test_server import running_server

pytestmark = pytest.mark.e2e
PROMPT = [11, 12, 13, 14] * 6


@pytest.mark.parametrize("engine_process", [False, True], ids=["engine-thread", "engine-process"])
def test_a_speculating_server_streams_the_same_text(tiny_artifacts, engine_process):
    want = Engine(tiny_artifacts["tied"]).generate(PROMPT, SamplingParams(max_tokens=48, temperature=0,
                                                                          ignore_eos=True))
    config = EngineConfig(speculative_tokens=4, prompt_lookup_min=1)
    with running_server(tiny_artifacts["tied"], ServerArgs(model_name="m", engine=config),
                        engine_process=engine_process) as server:
        client = server.client()
        chunks = list(client.completions.create(model="m", prompt=PROMPT, max_tokens=48, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True}))
        assert "".join(c.choices[0].text for c in chunks) == want.text
        assert chunks[-1].choices[0].finish_reason == "length"
        assert len(chunks) < 48                                 # kept drafts arrive together
        drafted = server.metric("kiln_spec_decode_draft_tokens_total")
        kept = server.metric("kiln_spec_decode_accepted_tokens_total")
        assert 0 < kept <= drafted
        assert server.metric("kiln_forwards_total") < 48 + 1


def test_a_server_with_a_draft_model_streams_the_same_text(tiny_artifacts):
    """`kiln serve --draft-model`'s engine in its own process: the untied tiny Llama (same tokenizer,
    another model) drafts for the tied one; the chat stream's text is plain decoding's."""
    messages = [{"role": "user", "content": "hello there"}]
    plain = Engine(tiny_artifacts["tied"])
    want = plain.chat(messages, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    config = EngineConfig(draft_model=tiny_artifacts["untied"], speculative_tokens=2)
    with running_server(tiny_artifacts["tied"], ServerArgs(model_name="m", engine=config),
                        engine_process=True) as server:
        chunks = list(server.client().chat.completions.create(
            model="m", messages=messages, max_tokens=32, temperature=0, stream=True, extra_body={"ignore_eos": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
        assert server.metric("kiln_spec_decode_draft_tokens_total") > 0


def test_kiln_generate_with_a_draft_model(tiny_artifacts):
    """`kiln generate --draft-model ARTIFACT`: the greedy reply is the one without it."""
    import json
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "kiln.cli", "generate", str(tiny_artifacts["tied"]), "5,6,7,8",
                           "--ids", "--json", "--max-tokens", "24", "--temperature", "0",
                           "--draft-model", str(tiny_artifacts["untied"])], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    want = Engine(tiny_artifacts["tied"]).generate([5, 6, 7, 8], SamplingParams(max_tokens=24, temperature=0))
    assert json.loads(proc.stdout)["token_ids"] == want.token_ids
