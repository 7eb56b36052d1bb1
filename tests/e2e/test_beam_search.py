"""vLLM's use_beam_search through the official openai client (extra_body), on the served tiny model (both engine
placements: test_server's fixture): the choices are the best beams of a search written here from vLLM's description
(each beam's 2n most likely next tokens, EOS-ended beams set aside, the best n of the rest kept; ranked by cumulative
logprob / (prompt + generated tokens) ** length_penalty), the next tokens' logprobs taken from the in-process engine;
one beam is greedy decoding; what a beam search cannot honour is a 400 naming it."""

from __future__ import annotations

import openai
import pytest

from kiln import SamplingParams
from test_server import HELLO, MODEL, server  # noqa: F401 (the served tiny model fixture)
from test_vllm_extensions import _greedy

pytestmark = pytest.mark.e2e


def reference_beams(engine, prompt: list[int], width: int, steps: int, length_penalty: float, eos: set[int]):
    """[(tokens, cumulative logprob)] of the best `width` beams, best first."""
    def score(beam):
        tokens, logprob = beam
        return logprob / (len(prompt) + len(tokens) - (tokens[-1] in eos)) ** length_penalty
    live, ended = [((), 0.0)], []
    for _ in range(steps):
        grown = []
        for tokens, logprob in live:
            lp = engine.generate([prompt + list(tokens)], SamplingParams(
                max_tokens=1, temperature=0, logprobs=True, top_logprobs=2 * width, ignore_eos=True))[0].logprobs[0]
            for token, value in lp.top:
                child = ((*tokens, token), logprob + value)
                (ended if token in eos else grown).append(child)
        live = sorted(grown, key=score, reverse=True)[:width]
    return sorted(ended + live, key=score, reverse=True)[:width]


@pytest.mark.parametrize("width, length_penalty", [(3, 1.0), (2, 0.5)])
def test_the_choices_are_the_best_beams(server, tiny_artifacts, width, length_penalty):
    engine, prompt, _ = _greedy(tiny_artifacts, "Once upon a time")
    want = reference_beams(engine, prompt, width, 5, length_penalty, set(engine.eos_token_ids))
    out = server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0, n=width,
                                             extra_body={"use_beam_search": True, "length_penalty": length_penalty})
    assert [c.text for c in out.choices] == [engine.tokenizer.decode(list(t)) for t, _ in want]
    assert all(c.finish_reason == "length" for c in out.choices) and out.usage.completion_tokens == 5 * width
    streamed = server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0, n=width,
                                                  stream=True, extra_body={"use_beam_search": True,
                                                                           "length_penalty": length_penalty})
    texts = {}
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert [texts[i] for i in range(width)] == [c.text for c in out.choices]


def test_one_beam_is_greedy_decoding(server, tiny_artifacts):
    engine, _, ids = _greedy(tiny_artifacts, "Once upon a time")
    out = server.client().completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0,
                                             extra_body={"use_beam_search": True, "ignore_eos": True})
    assert out.choices[0].text == engine.tokenizer.decode(ids)
    chat = server.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, temperature=0,
                                                   extra_body={"use_beam_search": True, "ignore_eos": True})
    greedy = server.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, temperature=0,
                                                     extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == greedy.choices[0].message.content


@pytest.mark.parametrize("extra, param", [
    ({"use_beam_search": True, "stop": ["x"]}, "stop"),
    ({"use_beam_search": True, "top_p": 0.5}, "top_p"),
    ({"use_beam_search": True, "logprobs": 0}, "logprobs"),
    ({"use_beam_search": True, "n": 11}, "n"),
    ({"length_penalty": 0.5}, "length_penalty"),
])
def test_what_a_beam_search_cannot_honour_is_a_400(server, extra, param):
    body = {k: v for k, v in extra.items() if k in ("stop", "top_p", "logprobs", "n")}
    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, **body,
                                           extra_body={k: v for k, v in extra.items() if k not in body})
    assert e.value.body["param"] == param
