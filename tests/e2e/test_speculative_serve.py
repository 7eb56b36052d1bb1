"""`kiln serve --speculative-tokens`: a lone greedy stream through the OpenAI client gets the same text
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
