"""The OpenAI-compatible server end to end: a real uvicorn server on 127.0.0.1 over a tiny compiled
Llama, driven by the official openai client (and httpx for raw HTTP checks).

The main server keeps the prefix cache on (its kiln_kv_pages_used gauge counts pages of live
requests only; cached pages are kiln_kv_pages_cached) and admits 16 sequences at once, so 32
concurrent streams queue. The keyed server runs the other artifact with an API key and no
prefix cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import httpx
import numpy as np
import openai
import pytest
import uvicorn

from kiln.runtime.async_engine import AsyncEngine
from kiln.runtime.engine import Engine, EngineConfig
from kiln.runtime.engine_process import EngineClient
from kiln.runtime.server import ServerArgs, create_app
from kiln.runtime.tokenizer import Tokenizer

pytestmark = [pytest.mark.e2e]

MODEL = "tiny-chat"
API_KEY = "sk-kiln-test"
HELLO = [{"role": "user", "content": "Say hello to the world."}]


@dataclass
class Server:
    url: str
    model: str
    engine: AsyncEngine | EngineClient | None = None

    def client(self, api_key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=120)

    def metric(self, name: str) -> float:
        """One unlabelled sample of /metrics."""
        for line in httpx.get(f"{self.url}/metrics").text.splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return float(value)
        raise KeyError(f"{name} is not in /metrics")


@contextlib.contextmanager
def running_server(artifact: Path, args: ServerArgs, engine_process: bool = False) -> Iterator[Server]:
    """create_app over a fresh engine (stepped by a thread, or in a process of its own), served by uvicorn
    in a thread on a free loopback port."""
    if engine_process:
        aengine = EngineClient(artifact, args.engine, args.stream_interval)
    else:
        aengine = AsyncEngine(Engine(artifact, args.engine), args.stream_interval)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(aengine, args), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, what="the server to start")
        yield Server(f"http://127.0.0.1:{sock.getsockname()[1]}", args.model_name or Path(artifact).name, aengine)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        aengine.stop()
        sock.close()


def wait_for(condition: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module", params=["engine-thread", "engine-process"])
def server(tiny_artifacts, request) -> Iterator[Server]:
    """Every test of the server runs against both: the engine stepped by a thread of the server's process,
    and in a process of its own (`kiln serve --engine-process on`), where everything crosses the pipe."""
    args = ServerArgs(model_name=MODEL, engine=EngineConfig(max_num_seqs=16))
    with running_server(tiny_artifacts["tied"], args, engine_process=request.param == "engine-process") as s:
        yield s


@pytest.fixture(scope="module")
def keyed_server(tiny_artifacts) -> Iterator[Server]:
    args = ServerArgs(api_key=API_KEY, engine=EngineConfig(enable_prefix_cache=False))
    with running_server(tiny_artifacts["untied"], args) as s:
        yield s


def collect_stream(stream) -> tuple[dict[int, str], dict[int, str | None], list]:
    """(text per choice, finish reason per choice, all chunks) of a chat or completions stream."""
    texts: dict[int, str] = {}
    reasons: dict[int, str | None] = {}
    chunks = list(stream)
    for chunk in chunks:
        for c in chunk.choices:
            piece = c.delta.content if hasattr(c, "delta") else c.text
            texts[c.index] = texts.get(c.index, "") + (piece or "")
            reasons[c.index] = c.finish_reason or reasons.get(c.index)
    return texts, reasons, chunks


# -- basics --------------------------------------------------------------------------------
def test_health_models_and_loopback_default(server):
    assert ServerArgs().host == "127.0.0.1"
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    for probe in (httpx.get(f"{server.url}/v1/health"), httpx.get(f"{server.url}/ping"),
                  httpx.post(f"{server.url}/ping")):                    # llama-server's and vLLM's names for it
        assert probe.json() == {"status": "ok"}
    import kiln
    assert httpx.get(f"{server.url}/version").json() == {"version": kiln.__version__}
    ids = [m.id for m in server.client().models.list()]
    assert ids[0] == MODEL and len(ids) == 2          # the given name, then the artifact folder's as an alias
    reply = server.client().completions.create(model=ids[1], prompt="hi", max_tokens=1)
    assert reply.model == MODEL


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.8, "seed": 1234}],
                         ids=["greedy", "seeded"])
def test_chat_stream_matches_non_stream(server, sampling):
    client = server.client()
    full = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=24, **sampling)
    texts, reasons, chunks = collect_stream(client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=24, stream=True, **sampling))
    assert full.object == "chat.completion" and full.id.startswith("chatcmpl-")
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
    assert texts == {0: full.choices[0].message.content}
    assert reasons == {0: full.choices[0].finish_reason} and reasons[0] in ("stop", "length")
    assert full.usage.completion_tokens <= 24
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens


def test_completions_text_and_token_ids_agree_streaming_or_not(server, tiny_artifacts):
    client = server.client()
    prompt = "Once upon a time"
    ids = Tokenizer.from_dir(tiny_artifacts["tied"]).encode(prompt)
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=16, temperature=0)
    texts, reasons, chunks = collect_stream(client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stream=True))
    assert full.object == "text_completion" and chunks[0].object == "text_completion"
    assert full.usage.prompt_tokens == len(ids)
    assert by_ids.choices[0].text == full.choices[0].text == texts[0]
    assert reasons[0] == full.choices[0].finish_reason


def test_stop_strings_cut_the_text_and_are_named(server):
    """A stop string ends a choice before it (finish_reason "stop"), and the choice's stop_reason (vLLM's field)
    names which one, collected and streamed; a choice that ran out of tokens has none."""
    client = server.client()
    full = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0)
    text = full.choices[0].text
    assert len(text) >= 6 and full.choices[0].stop_reason is None, text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    cut = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0,
                                    stop=["\x00never", stop])
    assert cut.choices[0].text == text[:text.index(stop)]
    assert (cut.choices[0].finish_reason, cut.choices[0].stop_reason) == ("stop", stop)
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0,
                                            stop=[stop], stream=True))
    assert "".join(c.choices[0].text for c in chunks) == cut.choices[0].text
    assert chunks[-1].choices[0].stop_reason == stop


def test_stream_include_usage(server):
    client = server.client()
    full = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0)
    _, _, chunks = collect_stream(client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    streamed, collected = last.usage.model_dump(), full.usage.model_dump()
    assert streamed["prompt_tokens_details"]["cached_tokens"] == collected["prompt_tokens"] - 1   # the same prompt
    streamed.pop("prompt_tokens_details")
    collected.pop("prompt_tokens_details")
    assert streamed == collected
    assert all(c.usage is None for c in chunks[:-1])


def test_n2_gives_two_different_choices(server):
    client = server.client()
    kw = dict(model=MODEL, messages=HELLO, max_tokens=16, temperature=1.0, seed=7, n=2)
    full = client.chat.completions.create(**kw)
    assert [c.index for c in full.choices] == [0, 1]
    assert full.choices[0].message.content != full.choices[1].message.content
    assert full.usage.completion_tokens >= 2                # both choices' tokens, the prompt's once
    texts, _, _ = collect_stream(client.chat.completions.create(**kw, stream=True))
    assert texts == {c.index: c.message.content for c in full.choices}


# -- logprobs and structured output ----------------------------------------------------------
def test_chat_logprobs_shape_and_values(server):
    client = server.client()
    kw = dict(model=MODEL, messages=HELLO, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5)
    full = client.chat.completions.create(**kw)
    content = full.choices[0].logprobs.content
    assert len(content) == full.usage.completion_tokens
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True)
        assert entry.logprob <= 0 and all(t <= 0 for t in tops) and sum(map(math.exp, tops)) <= 1 + 1e-5
        assert entry.logprob == pytest.approx(tops[0], abs=1e-5)      # greedy picks the most likely
        assert isinstance(entry.bytes, list) and all(0 <= b < 256 for b in entry.bytes)
    _, _, chunks = collect_stream(client.chat.completions.create(**kw, stream=True))
    streamed = [e for ch in chunks for c in ch.choices if c.logprobs for e in c.logprobs.content]
    # the same tokens and bytes; logprobs to float32's noise (a batch another request shares can round them
    # otherwise: the kernels follow the batch's size)
    assert len(streamed) == len(content)
    for got, want in zip(streamed, content):
        assert (got.token, got.bytes, [t.token for t in got.top_logprobs]) == \
            (want.token, want.bytes, [t.token for t in want.top_logprobs])
        assert [got.logprob, *(t.logprob for t in got.top_logprobs)] == \
            pytest.approx([want.logprob, *(t.logprob for t in want.top_logprobs)], abs=1e-5)


def test_completions_logprobs_shape(server):
    full = server.client().completions.create(model=MODEL, prompt="The cat", max_tokens=6, temperature=0,
                                              logprobs=3)
    lp = full.choices[0].logprobs
    n = full.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert all(v <= 0 for v in lp.token_logprobs)
    assert all(1 <= len(top) <= 3 and all(v <= 0 for v in top.values()) for top in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_response_format_json_object_parses(server):
    client = server.client()
    stopped = 0
    for seed in (1, 2, 3):
        out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "JSON please"}],
                                              max_tokens=200, temperature=1.0, seed=seed,
                                              response_format={"type": "json_object"})
        choice = out.choices[0]
        if choice.finish_reason == "stop":     # the grammar ended the value: it must parse
            json.loads(choice.message.content)
            stopped += 1
    assert stopped >= 1


def test_response_format_json_schema_follows_schema(server):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    out = server.client().chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=200, temperature=1.0, seed=5,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    assert out.choices[0].finish_reason == "stop"
    value = json.loads(out.choices[0].message.content)
    assert set(value) == {"ok"} and isinstance(value["ok"], bool)


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


# -- load, disconnects, metrics --------------------------------------------------------------
def test_32_concurrent_streams_complete_and_pages_drain(server):
    tokens_before = server.metric("kiln_generation_tokens_total")
    ttft_before = server.metric("kiln_time_to_first_token_seconds_count")

    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str | None, int]:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Request number {i}"}], max_tokens=48,
            temperature=0.7, seed=i, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        reason, usage = None, 0
        async for chunk in stream:
            reason = next((c.finish_reason for c in chunk.choices if c.finish_reason), reason)
            usage = chunk.usage.completion_tokens if chunk.usage else usage
        return reason, usage

    def watch_gauges(peaks: dict[str, float], done: threading.Event) -> None:
        """Polls /metrics from its own thread, so the clients' event loop cannot starve it."""
        with httpx.Client() as http:
            while not done.is_set():
                for line in http.get(f"{server.url}/metrics").text.splitlines():
                    name, _, value = line.partition(" ")
                    if name in peaks:
                        peaks[name] = max(peaks[name], float(value))
                time.sleep(0.005)

    async def main() -> list[tuple[str | None, int]]:
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    peaks = dict.fromkeys(("kiln_kv_pages_used", "kiln_requests_running", "kiln_requests_waiting"), 0.0)
    done = threading.Event()
    watcher = threading.Thread(target=watch_gauges, args=(peaks, done))
    watcher.start()
    try:
        results = asyncio.run(main())
    finally:
        done.set()
        watcher.join()
    assert all(reason in ("stop", "length") and n >= 1 for reason, n in results)
    assert peaks["kiln_kv_pages_used"] > 0 and 0 < peaks["kiln_requests_running"] <= 16, peaks
    wait_for(lambda: server.metric("kiln_kv_pages_used") == 0 and server.metric("kiln_requests_running") == 0
             and server.metric("kiln_requests_waiting") == 0, what="KV pages to drain")
    assert server.metric("kiln_generation_tokens_total") - tokens_before == sum(n for _, n in results)
    assert server.metric("kiln_time_to_first_token_seconds_count") - ttft_before == 32
    assert server.metric("kiln_kv_pages_total") > 0


def test_client_disconnect_mid_stream_aborts_and_frees_pages(server):
    tokens_before = server.metric("kiln_generation_tokens_total")
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 220, "temperature": 1.0, "seed": 3,
            "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{server.url}/v1/chat/completions",
                                                       json=body) as resp:
        assert resp.status_code == 200
        events = 0
        for line in resp.iter_lines():
            events += line.startswith("data: ")
            if events == 2:
                break                       # leaving the block closes the connection mid-stream
    wait_for(lambda: server.metric("kiln_kv_pages_used") == 0 and server.metric("kiln_requests_running") == 0,
             what="the aborted request's pages to be freed")
    assert server.metric("kiln_generation_tokens_total") - tokens_before < 220    # it did not run to the end
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_client_gone_before_a_non_streaming_reply_aborts(server):
    tokens_before = server.metric("kiln_generation_tokens_total")
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 220, "n": 8, "temperature": 1.0, "seed": 4,
            "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):    # the client gives up and closes the connection
        httpx.post(f"{server.url}{CHAT}", json=body, timeout=httpx.Timeout(60, read=0.05))
    wait_for(lambda: server.metric("kiln_kv_pages_used") == 0 and server.metric("kiln_requests_running") == 0,
             what="the abandoned request's pages to be freed")
    assert server.metric("kiln_generation_tokens_total") - tokens_before < 8 * 220


def test_usage_counts_the_prompt_tokens_the_prefix_cache_held(server, keyed_server):
    """usage.prompt_tokens_details.cached_tokens (OpenAI's field): 0 for a prompt the server has not seen (a chat's
    template's opening at most), then all but the prompt's last token (computed for its logits) when the same
    prompt comes again, in chat (collected and streamed) and completions replies; 0 where the prefix cache is off."""
    client = server.client()
    messages = [{"role": "user", "content": "Count the cached tokens of this conversation, please."}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0)
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens // 2
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    usage = [c.usage for c in stream if c.usage is not None]
    assert [u.prompt_tokens_details.cached_tokens for u in usage] == [again.usage.prompt_tokens - 1]
    ids = [int(t) for t in np.random.default_rng(11).integers(3, 500, size=50)]
    replies = [client.completions.create(model=MODEL, prompt=ids, max_tokens=1) for _ in range(2)]
    assert [r.usage.prompt_tokens_details.cached_tokens for r in replies] == [0, len(ids) - 1]
    keyed = [keyed_server.client(API_KEY).completions.create(model=keyed_server.model, prompt=ids, max_tokens=1)
             for _ in range(2)]
    assert [r.usage.prompt_tokens_details.cached_tokens for r in keyed] == [0, 0]


def test_metrics_exposition(server):
    for _ in range(2):                      # the second request reuses the first one's cached prompt KV
        server.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, temperature=0)
    resp = httpx.get(f"{server.url}/metrics")
    assert resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    for name in ("kiln_time_to_first_token_seconds_bucket", "kiln_time_per_output_token_seconds_bucket",
                 "kiln_requests_running", "kiln_requests_waiting", "kiln_kv_pages_used", "kiln_kv_pages_total",
                 "kiln_prefix_cache_hit_tokens_total", "kiln_generation_tokens_total", "kiln_prompt_tokens_total"):
        assert f"\n{name}" in text, name
    assert server.metric("kiln_prompt_tokens_total") > 0
    assert server.metric("kiln_prefix_cache_hit_tokens_total") > 0
    assert server.metric("kiln_time_per_output_token_seconds_count") > 0
    pages = [server.metric(f"kiln_kv_pages_{k}") for k in ("used", "cached", "free", "total")]
    assert pages[0] + pages[1] + pages[2] == pages[3] > 0


# -- bad input: OpenAI error bodies, 4xx, the server stays up ---------------------------------
ONE = {"messages": HELLO}
BAD_INPUTS = [
    ("empty-messages", CHAT, {"messages": []}, "messages"),
    ("unknown-role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ("messages-not-a-list", CHAT, {"messages": "hi"}, "messages"),
    ("max-tokens-zero", CHAT, {**ONE, "max_tokens": 0}, "max_tokens"),
    ("max-tokens-zero-stream", CHAT, {**ONE, "max_tokens": 0, "stream": True}, "max_tokens"),
    ("max-tokens-not-int", CHAT, {**ONE, "max_tokens": "many"}, "max_tokens"),
    ("negative-temperature", CHAT, {**ONE, "temperature": -0.5}, "temperature"),
    ("top-p-zero", CHAT, {**ONE, "top_p": 0}, "top_p"),
    ("top-p-above-one", CHAT, {**ONE, "top_p": 1.5}, "top_p"),
    ("n-zero", CHAT, {**ONE, "n": 0}, "n"),
    ("unknown-field", CHAT, {**ONE, "functions": [{"name": "f"}]}, "functions"),
    ("store-true", CHAT, {**ONE, "store": True}, "store"),
    ("unknown-completion-field", COMPLETIONS, {"prompt": "hi", "best_of_n": 2}, "best_of_n"),
    ("temperature-huge", CHAT, {**ONE, "temperature": 1e9}, "temperature"),
    ("n-huge", CHAT, {**ONE, "n": 1000}, "n"),
    ("n-above-max-num-seqs", CHAT, {**ONE, "n": 17}, "n"),   # the fixture serves 16 sequences
    ("beyond-context", CHAT, {**ONE, "max_tokens": 250}, "max_tokens"),
    ("beyond-kv", CHAT, {**ONE, "max_tokens": 100000}, "max_tokens"),
    ("top-logprobs-without-logprobs", CHAT, {**ONE, "top_logprobs": 2}, "top_logprobs"),
    ("logit-bias-key", CHAT, {**ONE, "logit_bias": {"abc": 1}}, "logit_bias"),
    ("response-format-type", CHAT, {**ONE, "response_format": {"type": "xml"}}, "response_format"),
    ("empty-stop", CHAT, {**ONE, "stop": [""]}, "stop"),
    ("prompt-too-long", COMPLETIONS, {"prompt": "hello " * 300}, "max_tokens"),
    ("negative-seed", COMPLETIONS, {"prompt": "hi", "seed": -1}, "seed"),
    ("token-outside-vocab", COMPLETIONS, {"prompt": [1, 2, 99999]}, "prompt"),
    ("negative-token-echo", COMPLETIONS, {"prompt": [3, -80665], "echo": True}, "prompt"),  # found by schemathesis
    ("token-beyond-int64", COMPLETIONS, {"prompt": [3, 2 ** 70]}, "prompt"),
    ("empty-prompt", COMPLETIONS, {"prompt": ""}, "prompt"),
    ("empty-prompt-list", COMPLETIONS, {"prompt": []}, "prompt"),
    ("max-tokens-zero-without-echo", COMPLETIONS, {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("suffix", COMPLETIONS, {"prompt": "hi", "suffix": "end"}, "suffix"),
    ("one-of-several-prompts-too-long", COMPLETIONS, {"prompt": ["a", "hello " * 300]}, "max_tokens"),
    ("bools-as-token-ids", COMPLETIONS, {"prompt": [True, 5]}, "prompt"),
    ("missing-prompt", COMPLETIONS, {"max_tokens": 4}, "prompt"),
]


@pytest.mark.parametrize("route,body,param", [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_a_400_in_openai_format(server, route, body, param):
    resp = httpx.post(f"{server.url}{route}", json={"model": MODEL, **body}, timeout=60)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


def test_malformed_json_and_unknown_route(server):
    resp = httpx.post(f"{server.url}{CHAT}", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]["message"]
    resp = httpx.get(f"{server.url}/v1/nope")
    assert resp.status_code == 404 and "error" in resp.json()
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_openai_client_raises_matching_errors(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=HELLO, temperature=-1, stream=True)
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=4)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="hi", max_tokens=4)


# -- the API key --------------------------------------------------------------------------------
def test_api_key_is_required_when_set(keyed_server):
    s = keyed_server
    with pytest.raises(openai.AuthenticationError):
        s.client("wrong-key").models.list()
    with pytest.raises(openai.AuthenticationError):
        s.client("wrong-key").chat.completions.create(model=s.model, messages=HELLO, max_tokens=4)
    resp = httpx.post(f"{s.url}{CHAT}", json={"model": s.model, **ONE})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{s.url}/health").status_code == 200
    out = s.client(API_KEY).chat.completions.create(model=s.model, messages=HELLO, max_tokens=4, temperature=0)
    assert out.model == s.model and out.usage.completion_tokens >= 1
    wait_for(lambda: s.metric("kiln_kv_pages_used") == 0, what="pages to be freed")
    assert s.metric("kiln_kv_pages_cached") == 0       # no prefix cache: nothing is kept
