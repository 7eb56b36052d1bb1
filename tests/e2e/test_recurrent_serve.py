"""A recurrent model (a tiny Mamba-2) behind the OpenAI-compatible server, driven by the official openai client: the
prefix cache keeps whole states, so conversations that begin alike start at the state cached where two of them
parted (a checkpoint, `kiln serve --min-checkpoint`), and a conversation's next turn continues its previous reply's
state; usage.prompt_tokens_details.cached_tokens says how much of each prompt that was, and every reply's text is
the one a cold engine (no prefix cache) gives."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.runtime.engine import Engine, EngineConfig, SamplingParams
from kiln.runtime.server import ServerArgs
from test_server import running_server
from tiny_models import write_widened

pytestmark = [pytest.mark.e2e]

MAMBA2 = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16, state_size=16,
              n_groups=2, expand=2, eos_token_id=2, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def mamba2(tmp_path_factory):
    root = tmp_path_factory.mktemp("mamba2-serve")
    write_widened("Mamba2ForCausalLM", "Mamba2Config", MAMBA2, root / "hf", seed=3)
    return kiln.compile(str(root / "hf"), target="cpu", quant="q0f32", output=root / "art")


def test_conversations_start_at_cached_states_with_a_cold_engines_text(mamba2):
    rng = np.random.default_rng(5)
    system = rng.integers(3, 500, size=40).tolist()
    chats = [system + rng.integers(3, 500, size=k).tolist() for k in (5, 9, 4)]
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    cold_engine = Engine(mamba2, EngineConfig(enable_prefix_cache=False))
    cold = cold_engine.generate(chats, greedy)
    turn = chats[0] + cold[0].token_ids + [7, 8, 9]           # the first conversation's next turn
    cold_turn = cold_engine.generate(turn, greedy)
    args = ServerArgs(model_name="mamba2", engine=EngineConfig(max_num_seqs=4, min_checkpoint=16))
    with running_server(mamba2, args) as server:
        client = server.client()

        def complete(ids):
            return client.completions.create(model="mamba2", prompt=ids, max_tokens=6, temperature=0,
                                             extra_body={"ignore_eos": True})
        replies = [complete(c) for c in chats]
        assert [r.choices[0].text for r in replies] == [c.text for c in cold]
        # the second stops its prefill once where it parts from the first (40 tokens: a checkpoint); the third
        # starts there
        assert [r.usage.prompt_tokens_details.cached_tokens for r in replies] == [0, 0, 40]
        again = complete(turn)
        assert again.choices[0].text == cold_turn.text
        assert again.usage.prompt_tokens_details.cached_tokens == len(chats[0]) + len(cold[0].token_ids) - 1
    with pytest.raises(ValueError, match="min_checkpoint"):
        Engine(mamba2, EngineConfig(min_checkpoint=0))
