"""`kiln serve`: the OpenAI-compatible HTTP server's command (runtime/server.py serves)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kiln.cli_info import friendly_errors as _friendly_errors
from kiln.cli_info import parse_size
from kiln.cli_options import (DEFAULT_MODEL, chat_template_option, compiled, speculation_fields, speculation_options,
                              step_graphs_option, template_source)


@click.command()
@click.argument("model", default=DEFAULT_MODEL)
@click.option("--host", default="127.0.0.1", show_default=True, help="bind address (0.0.0.0 exposes it)")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1 routes")
@click.option("--model-name", default=None, help="the name clients pass as `model` [artifact name]")
@click.option("--max-num-seqs", type=click.IntRange(min=1), help="most sequences in one batch [artifact's max batch]")
@click.option("--max-tokens-per-step", type=click.IntRange(min=1), help="chunked-prefill token budget per step")
@click.option("--max-total-tokens", type=click.IntRange(min=1), help="KV cache capacity in tokens")
@click.option("--kv-cache-memory",
              help="KV cache capacity as memory, e.g. 2GiB or 512MB (instead of --max-total-tokens)")
@click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True),
              help="KV cache capacity as the share of the device's memory the server may take (weights, "
                   "activations and KV cache), e.g. 0.9 [0.9 on CUDA and ROCm; elsewhere one full context "
                   "plus a page per sequence]; on a CPU, a share of the machine's memory")
@click.option("--no-prefix-cache", is_flag=True, help="disable prefix (radix) KV reuse")
@click.option("--min-checkpoint", type=click.IntRange(min=1), default=64, show_default=True,
              help="recurrent models (Mamba, Qwen3.5, Granite-H, ...): tokens a prompt must share with cached "
                   "ones past its match before its state there is cached too (where conversations' system prompts "
                   "end); lower for short shared prefixes, each checkpoint holding a state slot")
@click.option("--sampling-on", type=click.Choice(["auto", "device", "host"]), default="auto", show_default=True,
              help="where sampled decode tokens are drawn (temperature, top-k/p, min-p; requests with penalties, "
                   "bias, grammars or logprobs always on the host): device copies back one token per sequence; "
                   "auto is device on GPUs, host on CPUs")
@click.option("--overlap", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="launch each decode step before the previous step's tokens are detokenized and sent, so the "
                   "host's per-token work runs while the device computes; auto is on for GPUs, off on CPUs "
                   "(where the forward is the host's own work)")
@click.option("--stream-interval", type=click.IntRange(min=1), default=1, show_default=True,
              help="tokens a streamed chunk gathers before it is sent (a stream's first token goes at once): "
                   "fewer chunks, so less of the server's CPU a token at many streams, for coarser streaming")
@click.option("--engine-process", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="step the engine in a process of its own, so that the HTTP side's per-token Python (JSON, "
                   "socket writes) never holds up the engine's GIL; auto is on for GPUs, off on CPUs")
@click.option("--api-processes", type=click.IntRange(min=1), default=1, show_default=True,
              help="HTTP processes sharing the port in front of one engine process (vLLM's --api-server-count): "
                   "for many streams of a small model, where one process's Python cannot send what a GPU makes")
@click.option("--reasoning-parser", type=click.Choice(["auto", "none", "think", "harmony", "gemma4"]),
              default="auto", show_default=True,
              help="send a chat reply's reasoning as `reasoning` (and `reasoning_content`) apart from its "
                   "`content`: think reads <think>...</think> (DeepSeek-R1, Qwen3, QwQ), harmony gpt-oss's "
                   "analysis / final channels (its function calls become tool_calls), gemma4 Gemma 4's thought "
                   "channel and <|tool_call> calls (tool_calls too); auto picks the one the chat template "
                   "writes, none for a template that writes neither")
@step_graphs_option
@chat_template_option
@speculation_options
@_friendly_errors
def serve(model, host, port, api_key, model_name, max_num_seqs, max_tokens_per_step, max_total_tokens,
          kv_cache_memory, gpu_memory_utilization, no_prefix_cache, min_checkpoint, sampling_on, overlap,
          stream_interval, engine_process, api_processes, reasoning_parser, step_graphs, chat_template,
          speculation) -> None:
    """Serve MODEL (artifact, or a model compiled on first use) with an OpenAI-compatible HTTP API."""
    import kiln
    kv_bytes = parse_size(kv_cache_memory, "--kv-cache-memory") if kv_cache_memory else None
    template = template_source(chat_template)
    server = _server_module()                 # before any compile: without the serve extra, say so now
    path = compiled(model)
    # Named after what the user gave (`smollm2`, a model folder or file, an artifact's folder), so the
    # name survives recompiles, tunes and upgrades; the cache's hash-named folder stays an alias.
    given = Path(str(model).rstrip("/"))
    name = model_name or (given.stem if given.suffix in (".gguf", ".onnx") else given.name)
    engine = kiln.EngineConfig(max_num_seqs=max_num_seqs, max_tokens_per_step=max_tokens_per_step,
                               max_total_tokens=max_total_tokens, kv_cache_bytes=kv_bytes,
                               gpu_memory_utilization=gpu_memory_utilization,
                               enable_prefix_cache=not no_prefix_cache, min_checkpoint=min_checkpoint,
                               chat_template=template,
                               device_sampling={"auto": None, "device": True, "host": False}[sampling_on],
                               overlap={"auto": None, "on": True, "off": False}[overlap],
                               step_graphs=step_graphs, **speculation_fields(speculation))
    try:
        server.serve(path, server.ServerArgs(host=host, port=port, api_key=api_key, model_name=name,
                                             engine=engine, stream_interval=stream_interval,
                                             engine_process={"auto": None, "on": True, "off": False}[engine_process],
                                             api_processes=api_processes, reasoning_parser=reasoning_parser))
    except server.EngineDied as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)


# What `pip install "kiln[serve]"` brings that the server cannot start without (xgrammar is only
# needed by response_format requests, which are answered with a 400 without it).
_SERVE_EXTRA = ("fastapi", "uvicorn", "prometheus_client")
_SERVE_MODULES = {*_SERVE_EXTRA, "starlette", "pydantic"}


def _server_module():
    """kiln.runtime.server; exits with one line naming the fix when the `serve` extra is missing."""
    import importlib
    try:
        for name in _SERVE_EXTRA:
            importlib.import_module(name)
        return importlib.import_module("kiln.runtime.server")
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in _SERVE_MODULES:
            raise
        click.echo(f"error: `kiln serve` needs the serve extra ({e.name} is not installed): "
                   f'pip install "kiln[serve]"', err=True)
        sys.exit(1)
