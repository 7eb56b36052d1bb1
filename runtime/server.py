"""The OpenAI-compatible HTTP server: FastAPI routes over one AsyncEngine.

    kiln serve dist/smollm2-q0f32-cpu --port 8000 --api-key sk-local
    # or from Python:
    from kiln.runtime import EngineConfig
    from kiln.runtime.server import ServerArgs, serve
    serve("dist/smollm2-q0f32-cpu", ServerArgs(port=8000, engine=EngineConfig(max_num_seqs=32)))

    client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="sk-local")
    client.chat.completions.create(model="smollm2-q0f32-cpu", messages=[{"role": "user", "content": "Hi"}])

Routes: POST /v1/chat/completions, POST /v1/completions (streaming as SSE: reply_stream.py; llama-server's fields
too: llama_fields.py), POST /v1/embeddings, /v1/score and /v1/rerank (runtime/embeddings_api.py), POST
/v1/responses (runtime/responses_api.py), POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API:
runtime/messages_api.py), POST /tokenize, /detokenize, GET /tokenizer_info (runtime/tokenize_api.py), llama-server's
POST /completion, /infill, /apply-template and GET /props (runtime/llama_cpp_api.py), GET /v1/models and
/v1/models/{id}, GET /health (/v1/health, /ping), GET /version, GET /metrics (Prometheus text).
With an API key set, the /v1 routes need `Authorization: Bearer <key>` (or `x-api-key: <key>`, as Anthropic's
clients send it); /health, /version and /metrics stay open.

A request's path: parse (openai_api) -> prompt ids + SamplingParams -> AsyncEngine.generate
-> Metrics.track -> Reply.add per delta -> SSE chunks, or the collected reply. Every
error is answered in OpenAI's format (http_errors.py); bad input is a 4xx, never a 500. Reply
bodies are documented in /openapi.json by reply_models.py. A client that
disconnects cancels the task consuming its stream, which closes the engine's
generator and aborts the request (its KV pages are freed).
"""

from __future__ import annotations

import asyncio
import os
import functools
import logging
import secrets
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, AsyncIterator

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from . import embeddings_api, llama_cpp_api, messages_api, reasoning, responses_api, tokenize_api, tools
from .beam_search import beam_deltas
from . import openai_api as api
from . import reply_models as rm
from .. import __version__
from .artifact import Artifact
from .llama_fields import limits_of
from .async_engine import AsyncEngine
from .engine import Engine, EngineConfig
from .engine_process import EngineClient, EngineDied, loaded_info
from .host_memory import freeze_startup_objects
from .http_errors import ERRORS, document_errors, install_error_handlers
from .metrics import Metrics
from .protocol import SamplingParams, StreamDelta
from .reply_stream import EventStream, collect, sse
from .speculative import speculation_most

log = logging.getLogger("kiln.server")


@dataclass(frozen=True)
class ServerArgs:
    host: str = "127.0.0.1"               # loopback only unless told otherwise
    port: int = 8000
    api_key: str | None = None            # when set, /v1 routes need "Authorization: Bearer <api_key>"
    model_name: str | None = None         # the name clients pass as `model`; default: the artifact's folder name
    aliases: tuple[str, ...] = ()         # other names accepted and listed (e.g. the cache's hash id)
    engine: EngineConfig = field(default_factory=EngineConfig)
    log_level: str = "info"
    stream_interval: int = 1              # tokens a streamed chunk gathers (the first is sent at once)
    engine_process: bool | None = None    # the engine in a process of its own; None: on for GPU artifacts
    api_processes: int = 1                # HTTP processes (more than 1: the engine in a process of its own)
    reasoning_parser: str = "auto"        # chat replies' reasoning apart from content (runtime/reasoning.py)

    def __post_init__(self) -> None:
        if not isinstance(self.api_processes, int) or self.api_processes < 1:
            raise ValueError(f"api_processes must be an integer >= 1, got {self.api_processes!r}")
        if self.api_processes > 1 and self.engine_process is False:
            raise ValueError("several HTTP processes share one engine in a process of its own: drop "
                             "--engine-process off, or serve from one HTTP process (--api-processes 1)")


GRACE_SECONDS = 5          # SIGTERM/Ctrl-C: how long in-flight requests may take to finish


def serve(artifact: str | Path, args: ServerArgs = ServerArgs()) -> None:
    """Load ``artifact`` and serve it until SIGTERM or Ctrl-C (blocking), then drain and return.

    On the signal the listening socket closes (no new requests), in-flight requests get
    GRACE_SECONDS to finish, the rest are cancelled (their sequences aborted), and serve returns,
    so `kiln serve` exits 0 (uvicorn itself would re-raise the signal and die by it)."""
    start = time.monotonic()
    print(f"loading {artifact} ...", flush=True)
    if args.api_processes > 1:
        from .api_processes import serve_many
        return serve_many(artifact, args, start)
    aengine, info = _start_engine(artifact, args)
    serve_http(aengine, info, artifact, args, start)


def serve_http(aengine: AsyncEngine | EngineClient, info: dict, artifact: str | Path, args: ServerArgs, start: float,
               sockets: list | None = None, announce: bool = True) -> None:
    """Serve ``aengine`` over HTTP until a signal (or its engine process dies), then stop it. ``sockets``:
    listen there instead of binding args.host:args.port (each of `--api-processes`' HTTP processes is
    given the one socket); ``announce``: print what was loaded and where it is served."""
    died = threading.Event()
    try:
        app = create_app(aengine, replace(args, model_name=args.model_name or Path(artifact).resolve().name))
        name = app.state.kiln.model_name
        if announce:
            layout = aengine.engine.artifact.config.kv_cache
            kv_bytes = info["max_total_tokens"] * layout.bytes_per_token
            where = f" in engine process {info['pid']}" if "pid" in info else ""
            print(f"loaded{where} in {time.monotonic() - start:.1f} s; KV cache {info['max_total_tokens']} tokens "
                  f"({kv_bytes / 2**30:.2f} GiB, {layout.dtype}), up to {info['max_num_seqs']} sequences at once; "
                  f"sampled tokens drawn on the {'device' if info['samples_on_device'] else 'host'}", flush=True)
            if info["library_gemm_note"]:
                print(info["library_gemm_note"], flush=True)
            c = args.engine
            if c.draft_model is not None:
                print(f"speculative decoding: drafts of up to {speculation_most(c.speculative_tokens, c.draft_model)} tokens "
                      f"by the draft model {c.draft_model} in steps of decodes", flush=True)
            elif c.speculative_tokens:
                print(f"speculative decoding: drafts of up to {c.speculative_tokens} tokens by prompt lookup "
                      f"({c.prompt_lookup_max}..{c.prompt_lookup_min}-grams) in steps of decodes",
                      flush=True)
            if app.state.kiln.reasoning:
                print(f"reasoning parser: {app.state.kiln.reasoning} (replies' thinking as `reasoning`; "
                      "--reasoning-parser none sends it as content)", flush=True)
            processes = f" ({args.api_processes} HTTP processes)" if args.api_processes > 1 else ""
            print(f"ready: http://{args.host}:{args.port}/v1 (model {name!r}){processes}", flush=True)
        server = _DrainingServer(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                                timeout_graceful_shutdown=GRACE_SECONDS))
        server.on_grace_end = aengine.cancel_all
        if isinstance(aengine, EngineClient):
            def engine_died() -> None:           # from the pipe's reader thread: stop serving, exit non-zero
                died.set()
                server.should_exit = True
            aengine.on_death = engine_died
        freeze_startup_objects()
        server.run(sockets=sockets)
    finally:
        aengine.stop()
    if died.is_set():
        raise EngineDied("the engine process died (the log above says how); restart kiln serve")


def _start_engine(artifact: str | Path, args: ServerArgs) -> tuple[AsyncEngine | EngineClient, dict]:
    """The engine, in this process (a thread) or in one of its own (args.engine_process; auto: on for GPU
    artifacts, whose host work then never waits for the HTTP side's GIL), and what it loaded."""
    separate = args.engine_process
    if separate is None:
        separate = Artifact.load(artifact, verify=False).device != "cpu"
    if separate:
        client = EngineClient(artifact, args.engine, args.stream_interval)
        return client, client.info
    engine = Engine(artifact, args.engine)
    return AsyncEngine(engine, args.stream_interval), loaded_info(engine)


class _DrainingServer(uvicorn.Server):
    on_grace_end = staticmethod(lambda: None)    # ends the requests still running (503 / an error event)

    async def shutdown(self, sockets=None) -> None:
        """uvicorn's shutdown, but a second before its grace period ends (when it would cancel the
        handlers and answer 500) the requests still running are ended, so they answer 503."""
        timer = asyncio.get_running_loop().call_later(max(0.0, GRACE_SECONDS - 1), self.on_grace_end)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    @contextmanager
    def capture_signals(self):
        """uvicorn's graceful shutdown on SIGINT/SIGTERM, without re-raising the signal afterwards."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def create_app(engine: AsyncEngine | EngineClient, args: ServerArgs = ServerArgs()) -> FastAPI:
    """A FastAPI app serving ``engine`` (the caller owns the engine; the app never stops it)."""
    folder = engine.engine.artifact.path.resolve().name
    name = args.model_name or folder
    state = _ServerState(engine, name, tuple(dict.fromkeys(a for a in (*args.aliases, folder) if a != name)),
                         args.api_key)
    state.max_num_seqs = args.engine.max_num_seqs or engine.engine.artifact.config.max_batch_size
    tok = engine.engine.tokenizer
    state.reasoning = reasoning.resolve(args.reasoning_parser, tok.chat_template if tok is not None else None)
    app = FastAPI(title="kiln", redoc_url=None, responses=ERRORS)   # /docs and /openapi.json describe every route
    app.state.kiln = state
    state.grammar_pool.submit(_preload_grammars, engine.engine)
    install_error_handlers(app)
    document_errors(app)
    auth = [Depends(state.check_api_key)]

    @app.get("/health", response_model=rm.Health)
    @app.get("/v1/health", response_model=rm.Health, include_in_schema=False)      # llama-server's too
    @app.get("/ping", response_model=rm.Health, include_in_schema=False)           # vLLM's (SageMaker's probe)
    @app.post("/ping", response_model=rm.Health, include_in_schema=False)
    async def health() -> Response:
        if not engine.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return {"status": "ok"}

    @app.get("/version", response_model=rm.Version)
    async def version() -> dict:
        """The server's version (vLLM's /version): kiln's."""
        return {"version": __version__}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        await state.engine.refresh_stats()
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    @app.get("/v1/models", dependencies=auth, response_model=rm.ModelList)
    async def models() -> dict:
        return {"object": "list", "data": [state.model_card(name) for name in state.names]}

    embeddings_api.install(app, state, auth)
    tokenize_api.install(app, state, auth)
    llama_cpp_api.install(app, state, auth)
    responses_api.install(app, state, auth)
    messages_api.install(app, state, auth)

    @app.post("/v1/chat/completions", dependencies=auth, response_model=rm.ChatCompletion,
              responses=rm.with_stream("A chat.completion, or its chunks as a stream"))
    async def chat_completions(body: api.ChatCompletionRequest, request: Request) -> Response:
        arrival = time.monotonic()
        state.check_model(body.model)
        beams = api.beam_search_of(body)            # what a beam search cannot honour: refused before any work
        tool_req = tools.ToolRequest.parse(body.tools, body.tool_choice, body.parallel_tool_calls)
        text, ids = await asyncio.to_thread(tools.render_text, state.engine.engine, api.chat_messages(body.messages),
                                            tool_req, api.template_variables(body), **api.render_options(body),
                                            special_tokens=body.add_special_tokens)
        ids = api.truncated(body, ids)
        params = api.chat_params(body, len(ids), state.context_window)
        if tool_req is not None and tool_req.forced:
            params = replace(params, response_format=tool_req.forced_format(params.response_format))
        if state.reasoning and (params.response_format or {}).get("type", "text") != "text":
            params = replace(params, reasoning_parser=state.reasoning)     # the grammar shapes the answer only
        params = await state.compile_grammar(params)
        kind = functools.partial(tools.ToolReply, tools=tool_req) if tool_req and tool_req.active else api.Reply
        thinking = functools.partial(reasoning.start, state.reasoning, text) if state.reasoning else None
        reply = kind("chat", state.model_name, len(ids), state.token_labels(body), logprobs=params.needs_logprobs,
                     include_usage=_include_usage(body), continuous_usage=_continuous_usage(body),
                     reasoning=thinking, echo=api.chat_echo(body), n=params.n,
                     prompt_logprobs=body.prompt_logprobs is not None, timings=body.timings_per_token, arrival=arrival)
        return await state.respond(request, reply, [ids], params, body.priority, body.stream, arrival, beams=beams,
                                   limits=limits_of(body, params.n))

    @app.post("/v1/completions", dependencies=auth, response_model=rm.Completion,
              responses=rm.with_stream("A text_completion, or its chunks as a stream"))
    async def completions(body: api.CompletionRequest, request: Request) -> Response:
        arrival = time.monotonic()
        state.check_model(body.model)
        beams = api.beam_search_of(body)            # what a beam search cannot honour: refused before any work
        prompts = api.completion_prompts(body)
        params = await state.compile_grammar(api.completion_params(body, state.context_window))
        if body.suffix is not None:             # fill-in-the-middle: the model's FIM prompt, its FIM ends stop it
            tokenizer = state.engine.engine._need_tokenizer()
            ids = [api.fill_in_the_middle(tokenizer, p, body.suffix, body.add_special_tokens) for p in prompts]
            params = replace(params, stop_token_ids=(*params.stop_token_ids, *tokenizer.fim_end_ids))
        else:
            ids = [state.engine.engine.encode(p, body.add_special_tokens) if isinstance(p, str) else list(p)
                   for p in prompts]
        ids = [api.truncated(body, i) for i in ids]
        for i in ids:
            state.engine.engine.check_tokens(i)     # before the echo decodes them
        whole = body.truncate_prompt_tokens is None
        echo = [api.Echo(p if isinstance(p, str) and whole else state.decode(i), i) for p, i in zip(prompts, ids)]
        reply = api.Reply("completion", state.model_name, sum(map(len, ids)), state.token_labels(body),
                          logprobs=params.needs_logprobs, include_usage=_include_usage(body),
                          continuous_usage=_continuous_usage(body), echo=echo if body.echo else None, n=params.n,
                          prompt_logprobs=body.prompt_logprobs is not None, timings=body.timings_per_token,
                          arrival=arrival)
        return await state.respond(request, reply, ids, params, body.priority, body.stream, arrival, beams=beams,
                                   limits=limits_of(body, len(ids) * params.n))

    return app


def _lower_priority() -> None:
    """Grammar compiles (and the threads xgrammar starts for them, which inherit this) yield the CPU
    to the engine thread: a running stream keeps its pace while a new schema compiles."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):        # not Linux: the compile just shares the CPU
        pass


def _preload_grammars(engine: Any) -> None:
    """Import xgrammar and build the vocabulary's tokenizer info at start, off every request's path."""
    try:
        engine.grammar_compiler()
    except Exception as e:  # noqa: BLE001 - no tokenizer or no xgrammar: structured output says so per request
        log.info("structured output not preloaded: %s", e)


def _continuous_usage(body: api.CompletionRequest | api.ChatCompletionRequest) -> bool:
    return bool(body.stream and body.stream_options and body.stream_options.continuous_usage_stats)


def _include_usage(body: api.CompletionRequest | api.ChatCompletionRequest) -> bool:
    return bool(body.stream and body.stream_options and body.stream_options.include_usage)


class _ServerState:
    """What the routes share: the engine, its served name, the API key, metrics, token texts."""

    def __init__(self, engine: AsyncEngine | EngineClient, model_name: str, aliases: tuple[str, ...], api_key: str | None):
        self.engine = engine
        self.model_name = model_name
        self.names = (model_name, *aliases)          # every name a request may use; replies say model_name
        self.api_key = api_key
        self.started = int(time.time())
        self.metrics = Metrics(engine.stats)
        self.context_window = engine.engine.artifact.context_window
        self._token_texts: dict[int, tuple[str, bytes]] = {}
        self.reasoning: str | None = None             # the chat replies' reasoning parser (reasoning.THINK, ...)
        self.max_num_seqs = 0                         # sequences served at once (create_app sets it)
        self.grammar_pool = ThreadPoolExecutor(1, "kiln-grammar", initializer=_lower_priority)

    # -- checks (raise APIError, answered by the handlers below) -----------------------------
    async def check_api_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":             # Anthropic's clients send the key as x-api-key
            token = request.headers.get("x-api-key", "")
        if not secrets.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise api.APIError(401, "missing or incorrect API key; send 'Authorization: Bearer <key>' (or "
                                    "'x-api-key: <key>')", code="invalid_api_key")

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.names:
            raise api.APIError(404, f"the model {model!r} does not exist; this server serves "
                                    f"{' or '.join(repr(n) for n in self.names)}",
                               "model", code="model_not_found")

    def model_card(self, name: str) -> dict:
        return {"id": name, "object": "model", "created": self.started, "owned_by": "kiln",
                "root": self.model_name, "max_model_len": self.context_window}

    def token_labels(self, body: api.CompletionRequest | api.ChatCompletionRequest) -> api.TokenText:
        """How the request's logprobs name tokens: their texts, or "token_id:N" (return_tokens_as_token_ids)."""
        return api.token_id_text if body.return_tokens_as_token_ids else self.token_text

    def token_text(self, token_id: int) -> tuple[str, bytes]:
        """A token's text and bytes for logprobs (cached; ids are few)."""
        entry = self._token_texts.get(token_id)
        if entry is None:
            entry = self._token_texts[token_id] = api.token_text(self.engine.engine.tokenizer, token_id)
        return entry

    async def compile_grammar(self, params: SamplingParams) -> SamplingParams:
        """``params`` with its response_format's grammar compiled in a low-priority worker thread (a new
        schema can take seconds), so the engine thread only builds the request's matcher from it."""
        rf = params.response_format
        if not rf or rf.get("type") == "text":
            return params
        remote = isinstance(self.engine, EngineClient)   # serialized here too, off the event loop (ms a schema)
        prepared = await asyncio.get_running_loop().run_in_executor(
            self.grammar_pool, lambda: self.engine.engine.grammar_compiler().prepare(rf, serialized=remote))
        return replace(params, response_format=prepared)

    # -- one generation path ---------------------------------------------------------------
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        tok = self.engine.engine.tokenizer
        return tok.decode(ids, skip_special_tokens) if tok is not None else ""

    async def respond(self, request: Request, reply: api.Reply, prompts: list[list[int]], params: SamplingParams,
                      priority: int, stream: bool, arrival: float, events=sse, beams: float | None = None,
                      limits=None) -> Response:
        """Generate and answer: ``reply``'s final() as JSON, or ``events``(reply, first delta, the rest) streamed
        (OpenAI's chunks by default; llama_cpp_api streams llama-server's). ``beams``: a beam search's
        length_penalty, its best params.n beams the choices (runtime/beam_search.py). ``limits``: deltas -> deltas,
        ending choices early (llama_cpp_api.editor_limits)."""
        source = self._generate_all(prompts, params, priority) if beams is None else \
            beam_deltas(lambda ids, p: self.engine.generate(ids, p, priority=priority), prompts, params,
                        self.engine.engine.eos_token_ids, self.context_window, beams,
                        functools.partial(self.decode, skip_special_tokens=params.skip_special_tokens))
        if limits is not None:
            source = limits(source)
        deltas = self.metrics.track(source, sum(map(len, prompts)), arrival)
        if not stream:
            if not await collect(request, reply, deltas):
                return Response(status_code=499)    # nobody is listening; nginx's "client closed request"
            return JSONResponse(reply.final())
        try:
            first = await anext(deltas)   # bad input raises here, before any byte of the stream is sent
        except BaseException:
            await deltas.aclose()
            raise
        return EventStream(events(reply, first, deltas), media_type="text/event-stream",
                            headers=rm.SSE_HEADERS)


    def _generate_all(self, prompts: list[list[int]], params: SamplingParams,
                      priority: int) -> AsyncIterator[StreamDelta]:
        """The deltas of every prompt as they come, prompt i's choice k renumbered i * n + k (one
        prompt: the engine's own stream, with no generator between, since every token passes here)."""
        if len(prompts) == 1:
            return self.engine.generate(prompts[0], params, priority=priority)
        return self._generate_many(prompts, params, priority)

    async def _generate_many(self, prompts: list[list[int]], params: SamplingParams,
                             priority: int) -> AsyncIterator[StreamDelta]:
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, prompt: list[int]) -> None:
            try:
                async for delta in self.engine.generate(prompt, params, priority=priority):
                    delta.index += i * params.n
                    queue.put_nowait(delta)
            except Exception as e:  # noqa: BLE001 - re-raised in the consumer
                queue.put_nowait(e)
            finally:
                queue.put_nowait(None)
        tasks = [asyncio.create_task(pump(i, p)) for i, p in enumerate(prompts)]
        try:
            for _ in tasks:
                while (item := await queue.get()) is not None:
                    if isinstance(item, Exception):
                        raise item
                    yield item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
