"""vLLM's request extensions through the official openai client (extra_body), on the served tiny model (both engine
placements: test_server's fixture): guided decoding (guided_choice, guided_regex, guided_grammar, guided_json, and
structured_outputs, their form since vLLM 0.12, with xgrammar's structural tags; each compiled by xgrammar as
response_format's schemas are), stop_token_ids, and a chat's add_generation_prompt and
continue_final_message; what cannot go together is a 400 naming the field."""

from __future__ import annotations

import json
import re

import openai
import pytest

from test_server import HELLO, MODEL, server  # noqa: F401 (the served tiny model fixture)

pytestmark = pytest.mark.e2e


def _chat(server, max_tokens: int = 24, **extra):
    return server.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=max_tokens, temperature=1.0,
                                                   seed=3, extra_body=extra).choices[0]


def test_guided_choice_answers_one_of_its_strings(server):
    choices = ["red", "green", "deep blue"]
    for seed in (1, 2, 3):
        out = server.client().completions.create(model=MODEL, prompt="Pick a colour:", max_tokens=24, seed=seed,
                                                 temperature=1.0, extra_body={"guided_choice": choices})
        assert out.choices[0].text in choices and out.choices[0].finish_reason == "stop"


def test_guided_regex_and_grammar_shape_the_text(server):
    out = _chat(server, guided_regex="[0-9]{3}-[a-z]{2}")
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", out.message.content) and out.finish_reason == "stop"
    out = _chat(server, guided_grammar='root ::= "x" digit digit\ndigit ::= [0-9]')
    assert re.fullmatch(r"x[0-9]{2}", out.message.content)


def test_guided_json_follows_its_schema(server):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    for given in (schema, json.dumps(schema)):           # an object, or its JSON text (vLLM takes both)
        out = server.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=60, temperature=1.0,
                                                      seed=5, extra_body={"guided_json": given})
        assert out.choices[0].finish_reason == "stop"
        assert set(json.loads(out.choices[0].message.content)) == {"n"}


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def test_structured_outputs_are_vllms_constraints(server):
    """vLLM's structured_outputs (its guided_* fields since v0.12): each constraint shapes the text, the JSON schema
    compiled as guided_json's (the same seeded draw)."""
    json_out = _chat(server, structured_outputs={"json": SCHEMA, "disable_any_whitespace": True}, max_tokens=60)
    assert json_out.finish_reason == "stop" and set(json.loads(json_out.message.content)) == {"n"}
    assert json_out.message.content == _chat(server, guided_json=SCHEMA, max_tokens=60).message.content
    assert re.fullmatch(r"[0-9]{3}", _chat(server, structured_outputs={"regex": "[0-9]{3}"}).message.content)
    assert _chat(server, structured_outputs={"choice": ["yes", "no"]}).message.content in ("yes", "no")
    assert re.fullmatch(r"x[0-9]", _chat(server, structured_outputs={"grammar": 'root ::= "x" [0-9]'}).message.content)
    as_object = _chat(server, structured_outputs={"json_object": True}).message.content
    assert as_object.startswith("{") and as_object == _chat(server, response_format={"type": "json_object"}).message.content


def test_a_structural_tag_shapes_what_its_trigger_begins(server, tiny_artifacts):
    """xgrammar's structural tags: a tag format is written whole (begin, its content, end); vLLM's legacy form
    (structures and triggers, in response_format) leaves text free until a trigger is written, then writes the
    structure's begin and its JSON schema's object: "<" pushed to the top is the trigger here. (A structure's JSON
    allows any whitespace, as xgrammar compiles it, so the random model is not asked to finish it.)"""
    tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<a>", "end": "</a>",
                                                "content": {"type": "regex", "pattern": "[0-9]{2}"}}}
    for given in (tag, json.dumps(tag)):
        out = _chat(server, structured_outputs={"structural_tag": given})
        assert re.fullmatch(r"<a>[0-9]{2}</a>", out.message.content) and out.finish_reason == "stop"
    engine, _, _ = _greedy(tiny_artifacts, "x")
    [lt] = engine.tokenizer.encode("<", add_special_tokens=False)
    legacy = {"type": "structural_tag", "structures": [{"begin": "<a>", "schema": SCHEMA, "end": "</a>"}],
              "triggers": ["<"]}
    out = server.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=1.0, seed=3,
                                                  logit_bias={str(lt): 100}, response_format=legacy).choices[0]
    assert out.message.content.startswith("<a>{")
    free = server.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=1.0,
                                                   seed=3, logit_bias={str(lt): 100}).choices[0]
    assert free.message.content.startswith("<<")                   # unconstrained, "<" is written again


def _greedy(tiny_artifacts, text: str, n: int = 8) -> tuple[object, list[int], list[int]]:
    """(an in-process engine over the served artifact, the prompt's ids, its first n greedy tokens)."""
    from kiln import Engine, SamplingParams
    engine = Engine(tiny_artifacts["tied"])
    prompt = engine.encode(text)
    return engine, prompt, engine.generate([prompt], SamplingParams(max_tokens=n, temperature=0.0,
                                                                    ignore_eos=True))[0].token_ids


def test_stop_token_ids_end_a_choice(server, tiny_artifacts):
    """A token of the greedy run (its first repeat-free one after the first), given as a stop token id, ends the
    choice there, the text before it returned."""
    engine, prompt, ids = _greedy(tiny_artifacts, "Once upon a time")
    j = next(j for j in range(1, len(ids)) if ids[j] not in ids[:j])
    out = server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                             extra_body={"ignore_eos": True, "stop_token_ids": [ids[j]]})
    assert out.choices[0].finish_reason == "stop" and out.choices[0].text == engine.tokenizer.decode(ids[:j])


@pytest.mark.parametrize("extra, param", [
    ({"guided_choice": ["a"], "guided_regex": "b"}, "guided_choice"),
    ({"guided_regex": "b", "response_format": {"type": "json_object"}}, "response_format"),
    ({"guided_regex": "[0-9"}, "guided_regex"),
    ({"guided_grammar": "root ::= "}, "guided_grammar"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_json": "[1, 2]"}, "guided_json"),
    ({"guided_choice": []}, "guided_choice"),
    ({"response_format": {"type": "regex", "regex": "a"}}, "response_format"),
    ({"guided_regex": "[0-9]+", "min_tokens": 2}, "min_tokens"),
    ({"min_tokens": 30}, "min_tokens"),                                           # above max_tokens (24)
    ({"allowed_token_ids": [99999]}, "allowed_token_ids"),
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"bad_words": ["  "]}, "bad_words"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"json": SCHEMA, "whitespace_pattern": " *"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a"}, "guided_json": SCHEMA}, "structured_outputs"),
    ({"structured_outputs": {"regex": "[0-9"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"structural_tag": "{not json"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": {"structural_tag": {"type": "structural_tag", "format": {"type": "nope"}}}},
     "structured_outputs.structural_tag"),
    ({"response_format": {"type": "structural_tag", "structures": [{"begin": "<a>"}], "triggers": ["<"]}},
     "response_format"),
])
def test_guided_fields_that_cannot_be_run_are_a_400(server, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        _chat(server, **extra)
    assert e.value.body["param"] == param


def test_min_tokens_holds_back_stop_tokens_and_strings(server, tiny_artifacts):
    """The greedy run's token j as a stop token id ends it at j; with min_tokens j + 1 it cannot be token j (masked),
    the j tokens before unchanged. A stop string met in the first min_tokens tokens does not end it either."""
    engine, prompt, ids = _greedy(tiny_artifacts, "Once upon a time")
    j = next(j for j in range(1, len(ids)) if ids[j] not in ids[:j])
    client = server.client()
    args = dict(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=0)
    out = client.completions.create(**args, extra_body={"ignore_eos": True, "stop_token_ids": [ids[j]],
                                                        "min_tokens": j + 1}).choices[0]
    tokens = out.logprobs.tokens
    assert len(tokens) >= j + 1 and "".join(tokens[:j]) == engine.tokenizer.decode(ids[:j])
    assert tokens[j] != engine.tokenizer.decode([ids[j]])
    first = engine.tokenizer.decode(ids[:1])
    held = client.completions.create(**args, stop=[first], extra_body={"ignore_eos": True, "min_tokens": 3}).choices[0]
    assert held.text.startswith(first) and len(held.logprobs.tokens) >= 3


def test_a_stop_string_begun_before_min_tokens_ends_after_it(server, tiny_artifacts):
    """vLLM's min_tokens: a stop string may end only in a token after the first min_tokens, but it may begin before:
    one from greedy token j - 2's last character to token j's first ends the text with min_tokens j (so the first
    characters of it, streamed unmatched, were held back), not with min_tokens j + 1."""
    engine, prompt, ids = _greedy(tiny_artifacts, "Once upon a time")
    texts = [engine.tokenizer.decode(ids[:n]) for n in range(len(ids) + 1)]
    j = next(j for j in range(2, len(ids) - 1) if len(texts[j + 1]) > len(texts[j]) > len(texts[j - 1]) > 0)
    stop = texts[j + 1][len(texts[j - 1]) - 1:len(texts[j]) + 1]
    args = dict(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stop=[stop])
    cut = server.client().completions.create(**args, extra_body={"ignore_eos": True, "min_tokens": j}).choices[0]
    assert cut.finish_reason == "stop" and cut.text == texts[j - 1][:-1]
    late = server.client().completions.create(**args, extra_body={"ignore_eos": True, "min_tokens": j + 1}).choices[0]
    assert len(late.text) > len(cut.text) and texts[-1].startswith(late.text)     # cut later, if it recurs


def _ends(ids: list[int], words) -> list[int]:
    """Where in ``ids`` one of the token sequences ``words`` ends."""
    return [i for i in range(len(ids)) for w in words if len(w) <= i + 1 and tuple(ids[i + 1 - len(w):i + 1]) == w]


@pytest.mark.parametrize("span", [1, 2])
def test_bad_words_are_never_generated(server, tiny_artifacts, span):
    """vLLM's bad_words: a word of the greedy run (one token, or two) is not generated; the run is the greedy one up to
    the token that would have completed it, which is then another."""
    from kiln.runtime.tokenizer import bad_word_ids
    engine, prompt, ids = _greedy(tiny_artifacts, "Once upon a time")
    word = engine.tokenizer.decode(ids[:span])
    banned = bad_word_ids(engine.tokenizer, [word])
    assert tuple(ids[:span]) in banned
    out = server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=0,
                                             extra_body={"ignore_eos": True, "bad_words": [word],
                                                         "return_tokens_as_token_ids": True}).choices[0]
    got = [int(t.removeprefix("token_id:")) for t in out.logprobs.tokens]
    k = _ends(ids, banned)[0]
    assert got[:k] == ids[:k] and got[k] != ids[k] and not _ends(got, banned)


def test_include_stop_str_in_output_keeps_the_stop_string(server, tiny_artifacts):
    engine, prompt, ids = _greedy(tiny_artifacts, "Once upon a time")
    text = engine.tokenizer.decode(ids)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop.strip() and text.index(stop) > 0
    args = dict(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stop=[stop])
    cut = server.client().completions.create(**args, extra_body={"ignore_eos": True}).choices[0]
    kept = server.client().completions.create(**args, extra_body={"ignore_eos": True,
                                                                  "include_stop_str_in_output": True}).choices[0]
    assert cut.text == text[:text.index(stop)] and kept.text == cut.text + stop
    assert kept.finish_reason == cut.finish_reason == "stop"


def test_allowed_token_ids_and_skip_special_tokens(server, tiny_artifacts):
    """allowed_token_ids: every sampled token is one of them; skip_special_tokens: a special token sampled (here the
    only one allowed besides a word's) leaves no text."""
    engine, prompt, ids = _greedy(tiny_artifacts, "Once upon a time")
    client = server.client()
    allowed = sorted(set(ids[:3]))
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=1.0, seed=2, logprobs=0,
                                    extra_body={"ignore_eos": True, "allowed_token_ids": allowed}).choices[0]
    texts = {engine.tokenizer.decode([t]) for t in allowed}
    assert out.logprobs.tokens and set(out.logprobs.tokens) <= texts
    special = engine.tokenizer.encode("<|im_start|>", add_special_tokens=False)
    assert len(special) == 1 and special[0] in engine.tokenizer.special_token_ids
    both = dict(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                logit_bias={str(special[0]): 100})                   # the special token every time
    shown = client.completions.create(**both, extra_body={"ignore_eos": True}).choices[0].text
    skipped = client.completions.create(**both, extra_body={"ignore_eos": True,
                                                            "skip_special_tokens": True}).choices[0].text
    assert shown == "<|im_start|>" * 6 and skipped == ""


def test_truncate_prompt_tokens_keeps_the_prompts_end(server, tiny_artifacts):
    engine, prompt, _ = _greedy(tiny_artifacts, "Once upon a time there was a compiler")
    client = server.client()
    args = dict(model=MODEL, max_tokens=6, temperature=0)
    whole = client.completions.create(prompt=prompt[-4:], **args)
    cut = client.completions.create(prompt=prompt, **args, extra_body={"truncate_prompt_tokens": 4})
    assert cut.choices[0].text == whole.choices[0].text and cut.usage.prompt_tokens == 4


def test_return_tokens_as_token_ids_names_the_sampled_ids(server, tiny_artifacts):
    """Logprobs' tokens as "token_id:N", the greedy run's ids in order (completions, with the echoed prompt's; chat)."""
    engine, prompt, ids = _greedy(tiny_artifacts, "Once upon a time", n=6)
    client = server.client()
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=1, echo=True,
                                    extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True}).choices[0]
    assert out.logprobs.tokens == [f"token_id:{t}" for t in [*prompt, *ids]]
    assert all(set(top) <= {f"token_id:{t}" for t in range(512)} for top in out.logprobs.top_logprobs[1:])
    chat = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, temperature=0, logprobs=True,
                                          extra_body={"return_tokens_as_token_ids": True}).choices[0]
    assert all(re.fullmatch(r"token_id:\d+", c.token) and bytes(c.bytes) == c.token.encode()
               for c in chat.logprobs.content)


STORY = [{"role": "user", "content": "Tell me a story"}, {"role": "assistant", "content": "Once upon a"}]
RENDERED = "<|im_start|>user\nTell me a story<|im_end|>\n<|im_start|>assistant\nOnce upon a"     # the ChatML


@pytest.mark.parametrize("extra, prompt", [
    ({"continue_final_message": True, "add_generation_prompt": False}, RENDERED),
    ({"add_generation_prompt": False}, RENDERED + "<|im_end|>\n"),
])
def test_a_chat_rendered_without_its_generation_prompt_or_continuing_its_last_message(server, extra, prompt):
    """The chat's reply is the completion of the prompt the template renders so: the assistant's own text continued
    (its end-of-turn cut off), or the turns as they are, no new turn opened."""
    client = server.client()
    chat = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True, **extra})
    text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    assert chat.choices[0].message.content == text and chat.usage.prompt_tokens == len(
        server.engine.engine.tokenizer.encode(prompt, add_special_tokens=False))


def test_a_chats_echo_begins_the_reply_with_the_assistants_last_message(server):
    """vLLM's chat echo: continuing the assistant's message, each choice's content (streamed or not) is that message's
    content and then the reply without echo; after a user's message nothing is echoed."""
    client = server.client()
    args = dict(model=MODEL, max_tokens=8, temperature=0,
                extra_body={"continue_final_message": True, "add_generation_prompt": False})
    plain = client.chat.completions.create(messages=STORY, **args).choices[0].message.content
    args["extra_body"] = {**args["extra_body"], "echo": True}
    echoed = client.chat.completions.create(messages=STORY, n=2, **args)
    assert [c.message.content for c in echoed.choices] == [STORY[-1]["content"] + plain] * 2
    stream = client.chat.completions.create(messages=STORY, stream=True, **args)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == STORY[-1]["content"] + plain
    after_user = dict(model=MODEL, messages=STORY[:1], max_tokens=8, temperature=0)
    assert (client.chat.completions.create(**after_user, extra_body={"echo": True}).choices[0].message.content
            == client.chat.completions.create(**after_user).choices[0].message.content)


def test_a_requests_own_chat_template(server):
    """chat_template: the reply is the completion of the prompt that template renders; one that does not parse is a
    400 naming messages (the chat could not be rendered)."""
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]"
    client = server.client()
    chat = client.chat.completions.create(model=MODEL, messages=STORY[:1], max_tokens=6, temperature=0,
                                          extra_body={"ignore_eos": True, "chat_template": template})
    text = client.completions.create(model=MODEL, prompt="[user] Tell me a story\n[assistant]", max_tokens=6,
                                     temperature=0, extra_body={"ignore_eos": True}).choices[0].text
    assert chat.choices[0].message.content == text
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=STORY[:1], max_tokens=4,
                                       extra_body={"chat_template": "{% for m in messages %}"})
    assert e.value.body["param"] == "messages" and "does not parse" in e.value.body["message"]


@pytest.mark.parametrize("messages, extra", [
    (STORY, {"continue_final_message": True}),                                    # a new turn's prompt after it
    (STORY[:1], {"continue_final_message": True, "add_generation_prompt": False}),  # the last message the user's
])
def test_continuing_what_cannot_be_continued_is_a_400(server, messages, extra):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=4, extra_body=extra)
    assert e.value.body["param"] == "continue_final_message"


def test_prompt_logprobs_give_each_prompt_tokens_logprob_rank_and_alternatives(server, tiny_artifacts):
    """vLLM's prompt_logprobs: None for the first prompt token, then the token's own logprob (the engine's prompt
    scoring's), its rank (1 + the likelier tokens: checked against 20 alternatives) and k ranked alternatives."""
    from kiln import SamplingParams
    engine, prompt, _ = _greedy(tiny_artifacts, "Once upon a time there was")
    wide = engine.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=20))[0].prompt_logprobs
    client = server.client()
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, n=2, temperature=0,
                                    extra_body={"prompt_logprobs": 2})
    for choice in out.choices:
        got = choice.model_extra["prompt_logprobs"]
        assert got[0] is None and len(got) == len(prompt)
        for token, entry, ref in zip(prompt[1:], got[1:], wide[1:]):
            own = entry[str(token)]
            assert own["logprob"] == pytest.approx(ref.logprob, abs=1e-5)
            likelier = sum(v > ref.logprob + 1e-6 for _, v in ref.top)
            assert own["rank"] == likelier + 1 or (likelier == 20 and own["rank"] > 20)
            assert {1, 2} <= {v["rank"] for v in entry.values()} and len(entry) in (2, 3)    # the 2 likeliest too
            assert own["decoded_token"] == engine.tokenizer.decode([token])
    chat = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1, extra_body={"prompt_logprobs": 0})
    scored = chat.model_extra["prompt_logprobs"]
    assert scored[0] is None and all(len(e) == 1 for e in scored[1:]) and len(scored) == chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, stream=True,
                                  extra_body={"prompt_logprobs": 1})
    assert e.value.body["param"] == "prompt_logprobs"


def test_cache_salt_keeps_a_cached_prefix_to_its_salt(server):
    """vLLM's cache_salt: a prompt cached under one salt is reused by that salt's next request (usage's
    cached_tokens: all but the last prompt token), never by another salt's or an unsalted one; the text is the
    same either way. A salt vLLM would refuse is a 400."""
    prompt = "Salted caches keep one tenant's prompts from another's timing. " * 3

    def run(**extra):
        out = server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0,
                                                 extra_body={"ignore_eos": True, **extra})
        return out.usage.prompt_tokens_details.cached_tokens, out.choices[0].text, out.usage.prompt_tokens

    cold, text, n = run(cache_salt="tenant-a")
    assert cold == 0
    assert run(cache_salt="tenant-b")[0] == 0 and run()[0] == 0
    warm, warm_text, _ = run(cache_salt="tenant-a")
    assert warm == n - 1 and warm_text == text
    assert run()[0] == n - 1                                      # the unsalted request cached its own
    for bad in ("", "a/b", "x" * 129):
        with pytest.raises(openai.BadRequestError) as e:
            run(cache_salt=bad)
        assert e.value.body["param"] == "cache_salt"
