"""llama-server's own /completion route on the served tiny model (both engine placements: test_server's fixture),
as llama.cpp's clients call it over HTTP: its prompt shapes, defaults, result fields, stream (no [DONE]) and token
probabilities, against the in-process engine's greedy run; what kiln does not implement is a 400 naming the field.
/infill is tested beside the FIM model (test_fill_in_the_middle.py)."""

from __future__ import annotations

import json
import math
import re

import httpx
import pytest

from test_server import HELLO, MODEL, server  # noqa: F401 (the served tiny model fixture)
from test_vllm_extensions import _greedy

pytestmark = pytest.mark.e2e
GREEDY = {"temperature": 0, "ignore_eos": True, "n_predict": 8}


def _post(server, body: dict, path: str = "/completion") -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def _events(server, body: dict) -> list[str]:
    with httpx.stream("POST", f"{server.url}/completion", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        return [line for line in r.iter_lines() if line]


def test_a_completion_is_the_greedy_run_with_llama_servers_fields(server, tiny_artifacts):
    engine, prompt, ids = _greedy(tiny_artifacts, "Once upon a time")
    out = _post(server, {"prompt": "Once upon a time", "return_tokens": True, **GREEDY}).json()
    assert out["tokens"] == ids and out["content"] == engine.tokenizer.decode(ids)
    assert out["stop"] is True and out["stop_type"] == "limit" and out["tokens_predicted"] == 8
    assert out["tokens_evaluated"] == len(prompt) and out["prompt"] == engine.tokenizer.decode(prompt)
    assert out["model"] == MODEL and out["generation_settings"]["n_predict"] == 8
    assert out["has_new_line"] == ("\n" in out["content"]) and out["timings"]["predicted_n"] == 8
    mixed = _post(server, {"prompt": [*prompt[:2], engine.tokenizer.decode(prompt[2:])], **GREEDY}).json()
    assert mixed["content"] == out["content"] and mixed["tokens"] == []         # tokens only with return_tokens
    by_ids = _post(server, {"prompt": prompt, **GREEDY}).json()
    assert by_ids["content"] == out["content"] and by_ids["tokens_evaluated"] == len(prompt)
    nothing = _post(server, {"prompt": prompt, "n_predict": 0}).json()               # the prompt evaluated only
    assert (nothing["content"], nothing["tokens_predicted"], nothing["stop_type"]) == ("", 0, "limit")


def test_the_stream_sends_content_and_tokens_then_a_final_result(server, tiny_artifacts):
    engine, _, ids = _greedy(tiny_artifacts, "Once upon a time")
    lines = _events(server, {"prompt": "Once upon a time", **GREEDY})
    assert all(line.startswith("data: ") for line in lines) and lines[-1] != "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines]
    assert [c["stop"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert "".join(c["content"] for c in chunks) == engine.tokenizer.decode(ids)
    assert [t for c in chunks[:-1] for t in c["tokens"]] == ids
    assert chunks[-1]["content"] == "" and chunks[-1]["stop_type"] == "limit" and chunks[-1]["tokens_predicted"] == 8


def test_several_prompts_answer_an_array(server, tiny_artifacts):
    engine, _, ids = _greedy(tiny_artifacts, "Once upon a time")
    out = _post(server, {"prompt": ["Once upon a time", "Hello"], **GREEDY, "n_predict": 4}).json()
    assert [r["index"] for r in out] == [0, 1] and out[0]["content"] == engine.tokenizer.decode(ids[:4])
    assert out[1]["tokens_evaluated"] == len(engine.encode("Hello"))


def test_n_probs_gives_each_tokens_top_probabilities(server, tiny_artifacts):
    engine, _, ids = _greedy(tiny_artifacts, "Once upon a time")
    out = _post(server, {"prompt": "Once upon a time", "n_probs": 3, **GREEDY, "n_predict": 4}).json()
    probs = out["completion_probabilities"]
    assert [p["id"] for p in probs] == ids[:4]
    for p in probs:
        assert len(p["top_logprobs"]) == 3 and p["top_logprobs"][0]["id"] == p["id"]      # greedy: the top one
        assert math.isclose(p["logprob"], p["top_logprobs"][0]["logprob"]) and p["logprob"] <= 0
        assert bytes(p["bytes"]).decode(errors="ignore") == p["token"]


def test_stop_words_logit_bias_and_grammar(server, tiny_artifacts):
    engine, _, ids = _greedy(tiny_artifacts, "Once upon a time")
    text = engine.tokenizer.decode(ids)
    word = text[len(text) // 2:len(text) // 2 + 2]
    out = _post(server, {"prompt": "Once upon a time", "stop": [word], **GREEDY}).json()
    assert out["content"] == text[:text.index(word)] and out["stop_type"] == "word" and out["stopping_word"] == word
    banned = _post(server, {"prompt": "Once upon a time", "logit_bias": [[ids[0], False]], "return_tokens": True,
                            **GREEDY}).json()
    assert banned["tokens"][0] != ids[0]
    as_map = _post(server, {"prompt": "Once upon a time", "logit_bias": {str(ids[0]): False}, "return_tokens": True,
                            **GREEDY}).json()
    assert as_map["tokens"] == banned["tokens"]
    shaped = _post(server, {"prompt": "Once upon a time", "grammar": 'root ::= "x" [0-9] [0-9]', "temperature": 0.8,
                            "seed": 3}).json()
    assert re.fullmatch(r"x[0-9]{2}", shaped["content"]) and shaped["stop_type"] == "eos"


def test_llama_cpp_defaults_and_seeds_sample_reproducibly(server):
    body = {"prompt": "Once upon a time", "n_predict": 6, "seed": 7, "ignore_eos": True}
    first, again = _post(server, body).json(), _post(server, body).json()
    assert first["content"] == again["content"]
    settings = first["generation_settings"]
    assert (settings["temperature"], settings["top_k"], settings["top_p"], settings["min_p"]) == (0.8, 40, 0.95, 0.05)


@pytest.mark.parametrize("extra, param", [
    ({"mirostat": 2}, "mirostat"),
    ({"dry_multiplier": 0.8}, "dry_multiplier"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"repeat_penalty": 1.1}, "repeat_last_n"),                 # over the last 64 tokens: not kiln's rule
    ({"seed": -2}, "seed"),
    ({"grammar": "root ::= \"a\"", "json_schema": {}}, "json_schema"),
    ({"logit_bias": [[5]]}, "logit_bias"),
    ({"n_probs": 50}, "n_probs"),
    ({"no_such_field": 1}, "no_such_field"),
])
def test_what_kiln_does_not_do_is_a_400_naming_the_field(server, extra, param):
    r = _post(server, {"prompt": "Once upon a time", "n_predict": 2, **extra})
    assert r.status_code == 400 and param in json.dumps(r.json()["error"])


def test_repeat_penalty_over_the_whole_context_is_kiln_s(server):
    """repeat_penalty with repeat_last_n covering the context: the /v1/completions repetition_penalty's reply."""
    window = httpx.get(f"{server.url}/v1/models/{MODEL}").json()["max_model_len"]
    body = {"prompt": "Once upon a time", **GREEDY, "repeat_penalty": 1.5, "repeat_last_n": window}
    got = _post(server, body).json()["content"]
    want = server.client().completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0,
                                              extra_body={"ignore_eos": True, "repetition_penalty": 1.5})
    assert got == want.choices[0].text


def test_infill_needs_fim_tokens(server):
    r = _post(server, {"input_prefix": "def f(", "input_suffix": ")\n", "n_predict": 2}, "/infill")
    assert r.status_code == 400 and "input_prefix" in json.dumps(r.json())


def test_llama_servers_tokenize_and_detokenize(server, tiny_artifacts):
    """/tokenize's content (no BOS unless add_special; with_pieces: each id's text) and /detokenize's content."""
    engine, _, _ = _greedy(tiny_artifacts, "Once upon a time")
    tok = engine.tokenizer
    ids = tok.encode("Once upon a time", add_special_tokens=False)
    out = _post(server, {"content": "Once upon a time"}, "/tokenize").json()
    assert out["tokens"] == ids
    pieces = _post(server, {"content": "Once upon a time", "with_pieces": True}, "/tokenize").json()["tokens"]
    assert [p["id"] for p in pieces] == ids and "".join(p["piece"] for p in pieces) == "Once upon a time"
    assert _post(server, {"tokens": ids}, "/detokenize").json()["content"] == "Once upon a time"
    refused = _post(server, {"content": "a", "parse_special": False}, "/tokenize")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "parse_special"


def test_apply_template_renders_the_chat_as_the_chat_route_does(server, tiny_artifacts):
    """/apply-template's prompt, sent to /completion, gives the chat route's greedy reply."""
    engine, _, _ = _greedy(tiny_artifacts, "x")
    prompt = _post(server, {"messages": HELLO}, "/apply-template").json()["prompt"]
    assert prompt == engine.tokenizer.apply_chat_template(HELLO, add_generation_prompt=True)
    bare = _post(server, {"messages": HELLO, "add_generation_prompt": False}, "/apply-template").json()["prompt"]
    assert prompt.startswith(bare) and len(prompt) > len(bare)
    chat = server.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, temperature=0,
                                                   extra_body={"ignore_eos": True})
    completed = _post(server, {"prompt": prompt, "n_predict": 6, "temperature": 0, "ignore_eos": True}).json()
    assert completed["content"] == chat.choices[0].message.content
    refused = _post(server, {"messages": HELLO, "temperature": 0.5}, "/apply-template")
    assert refused.status_code == 400 and "temperature" in json.dumps(refused.json())


def test_n_indent_cuts_the_first_line_indented_less(server):
    """A grammar writes four lines; with n_indent 4 the answer ends before "c" (indented 2), its blanks kept, as a
    length limit; the stream sends no more than that."""
    body = {"prompt": "Once upon a time", "grammar": 'root ::= "a\\n    b\\n  c\\nd"', "temperature": 0,
            "n_predict": 32, "n_indent": 4}
    out = _post(server, body).json()
    assert out["content"] == "a\n    b\n  " and out["stop_type"] == "limit"
    assert _post(server, {**body, "n_indent": 2}).json()["content"] == "a\n    b\n  c\n"      # "d" is indented 0
    chunks = [json.loads(line[6:]) for line in _events(server, body)]
    assert "".join(c["content"] for c in chunks) == out["content"] and chunks[-1]["stop_type"] == "limit"


def test_t_max_predict_ms_ends_at_a_newline_past_it(server):
    """A grammar writes forty short lines; past 1 ms from the first token the next newline ends the answer (kept)."""
    lines = "".join(f"{i}\\n" for i in range(40))
    body = {"prompt": "x", "grammar": f'root ::= "{lines}"', "temperature": 0, "n_predict": 200}
    full = _post(server, body).json()
    out = _post(server, {**body, "t_max_predict_ms": 1}).json()
    assert full["stop_type"] == "eos", full
    assert full["content"].startswith(out["content"]) and len(out["content"]) < len(full["content"])
    assert out["content"].endswith("\n") and out["stop_type"] == "limit"


def test_ignore_eos_never_takes_an_end_token(server, tiny_artifacts):
    """llama-server's ignore_eos bans the end-of-generation tokens (kiln's OpenAI routes only keep going past them):
    EOS biased to the top is still never written."""
    engine, _, _ = _greedy(tiny_artifacts, "Once upon a time")
    eos = engine.tokenizer.eos_token_id
    out = _post(server, {"prompt": "Once upon a time", "temperature": 0, "n_predict": 6, "return_tokens": True,
                         "ignore_eos": True, "logit_bias": [[eos, 100]]}).json()
    assert len(out["tokens"]) == 6 and eos not in out["tokens"] and out["stop_type"] == "limit"
    ended = _post(server, {"prompt": "Once upon a time", "temperature": 0, "n_predict": 6, "return_tokens": True,
                           "logit_bias": [[eos, 100]]}).json()
    assert ended["tokens_predicted"] == 1 and ended["stop_type"] == "eos"


def test_props_tell_the_context_defaults_and_template(server, tiny_artifacts):
    """GET /props, what llama-server's clients read first: the served context, the default sampling (llama.cpp's),
    the slots (sequences at once), the chat template and special tokens; POST /props (llama-server's with --props)
    is a 405."""
    engine, _, _ = _greedy(tiny_artifacts, "x")
    props = httpx.get(f"{server.url}/props", timeout=30).json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == engine.artifact.context_window and props["total_slots"] == 16
    assert (settings["params"]["temperature"], settings["params"]["top_k"]) == (0.8, 40)
    assert props["chat_template"] == engine.tokenizer.chat_template and props["model_alias"] == MODEL
    assert props["eos_token"] == engine.tokenizer.eos_token and props["modalities"]["vision"] is False
    assert httpx.post(f"{server.url}/props", json={"n_ctx": 8}, timeout=30).status_code == 405


# what llama.cpp's web UI sends to /v1/chat/completions (its default settings), max_tokens and seed set
WEB_UI = {"stream": True, "timings_per_token": True, "temperature": 0.8, "max_tokens": 8, "dynatemp_range": 0,
          "dynatemp_exponent": 1, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "xtc_probability": 0, "xtc_threshold": 0.1,
          "typ_p": 1, "repeat_last_n": 64, "repeat_penalty": 1, "presence_penalty": 0, "frequency_penalty": 0,
          "dry_multiplier": 0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
          "samplers": "edkypmxt", "seed": 4, "ignore_eos": True}


def test_llama_cpps_web_ui_chats_through_the_openai_route(server):
    """llama-server's fields on /v1/chat/completions, as its web UI sends them: accepted, its chain followed (temperature
    last: the reply is /completion's of the same prompt and seed), and timings on every chunk and the response."""
    messages = [{"role": "user", "content": "Hello"}]
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json={"messages": messages, **WEB_UI},
                      timeout=120) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert all("timings" in c for c in chunks) and chunks[-1]["timings"]["predicted_n"] == 8
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    whole = _post(server, {"messages": messages, **WEB_UI, "stream": False}, "/v1/chat/completions").json()
    assert whole["choices"][0]["message"]["content"] == content and whole["timings"]["predicted_n"] == 8
    prompt = _post(server, {"messages": messages, "add_generation_prompt": True}, "/apply-template").json()["prompt"]
    completed = _post(server, {"prompt": prompt, "n_predict": 8, "seed": 4, "ignore_eos": True}).json()
    assert completed["content"] == content


@pytest.mark.parametrize("extra, param", [
    ({"mirostat": 2}, "mirostat"), ({"typ_p": 0.9}, "typ_p"), ({"repeat_penalty": 1.2}, "repeat_last_n"),
    ({"repeat_penalty": 1.1, "repetition_penalty": 1.2}, "repeat_penalty"), ({"samplers": ["top_p", "top_k"]}, "samplers"),
])
def test_llama_fields_the_openai_routes_cannot_follow_are_a_400(server, extra, param):
    r = _post(server, {"prompt": "x", "max_tokens": 2, **extra}, "/v1/completions")
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_repeat_penalty_over_the_whole_context_is_repetition_penalty(server):
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    want = _post(server, {**body, "repetition_penalty": 1.5}, "/v1/completions").json()["choices"][0]["text"]
    got = _post(server, {**body, "repeat_penalty": 1.5, "repeat_last_n": -1}, "/v1/completions").json()
    assert got["choices"][0]["text"] == want
    off = _post(server, {**body, "repeat_penalty": 1.5, "repeat_last_n": 0}, "/v1/completions").json()
    assert off["choices"][0]["text"] == _post(server, body, "/v1/completions").json()["choices"][0]["text"]


def test_llama_servers_grammar_and_json_schema_on_the_openai_routes(server):
    messages = [{"role": "user", "content": "Hello"}]
    base = {"messages": messages, "max_tokens": 24, "temperature": 1.0, "seed": 2}
    shaped = _post(server, {**base, "grammar": 'root ::= "x" [0-9] [0-9]'}, "/v1/chat/completions").json()
    assert re.fullmatch(r"x[0-9]{2}", shaped["choices"][0]["message"]["content"])
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    out = _post(server, {**base, "json_schema": schema, "max_tokens": 60}, "/v1/chat/completions").json()
    assert out["choices"][0]["message"]["content"] == _post(
        server, {**base, "guided_json": schema, "max_tokens": 60}, "/v1/chat/completions").json()["choices"][0][
        "message"]["content"]
    both = _post(server, {**base, "grammar": 'root ::= "x"', "json_schema": schema}, "/v1/chat/completions")
    assert both.status_code == 400 and both.json()["error"]["param"] == "json_schema"


def test_timings_per_token_times_every_partial_result(server):
    """/completion's stream with timings_per_token: each partial result carries llama-server's timings, its
    predicted_n the tokens so far; without it only the final result has them."""
    chunks = [json.loads(line[6:]) for line in _events(server, {"prompt": "Once upon a time", **GREEDY,
                                                                 "timings_per_token": True})]
    partial = [c for c in chunks if not c["stop"]]
    assert [c["timings"]["predicted_n"] for c in partial] == [c["tokens_predicted"] for c in partial]
    assert chunks[-1]["timings"]["predicted_n"] == 8
    plain = [json.loads(line[6:]) for line in _events(server, {"prompt": "Once upon a time", **GREEDY})]
    assert all("timings" not in c for c in plain if not c["stop"])
