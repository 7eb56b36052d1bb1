"""The `kiln` command: thin click wrappers that build typed options and call the library."""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import click

from kiln.cli_info import COMMANDS, exit_interrupted
from kiln.cli_info import friendly_errors as _friendly_errors
from kiln.cli_info import parse_size

DEFAULT_MODEL = "smollm2"


class _Progress:
    """Renders compile progress events (stage, done, total) on stderr with rich."""

    LABELS = {"load": "reading model", "export": "exporting Relax IR", "weights": "converting weights",
              "golden": "golden logits", "golden-reference": "golden reference build",
              "check": "checking golden prompts", "write": "writing artifact"}

    def __init__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.console import Console
        self.bar = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=Console(stderr=True), transient=False)
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def __call__(self, stage: str, done: int, total: int) -> None:
        key = "compile" if stage.startswith("compile:") else stage
        label = f"compiling ({stage.split(':', 1)[1]})" if key == "compile" else self.LABELS.get(stage, stage)
        if key not in self.tasks:
            self.tasks[key] = self.bar.add_task(label, total=total)
        self.bar.update(self.tasks[key], completed=done, total=total, description=label)


class _Group(click.Group):
    """Usage errors (a bad option value, a missing argument) in one line too, with where to look."""

    def main(self, args=None, prog_name=None, **extra):
        try:
            code = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.UsageError as e:
            cmd = e.ctx.command_path if e.ctx else "kiln"
            click.echo(f"error: {e.format_message()} (see `{cmd} --help`)", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            click.echo(f"error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            exit_interrupted()
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=_Group)
@click.version_option(package_name="kiln")
def main() -> None:
    """kiln: compile LLMs through Apache TVM and run them (generate, chat)."""


@main.command("compile")
@click.argument("model")
@click.option("--target", default="cpu", show_default=True,
              help="a preset from `kiln targets` (cpu, cuda, rocm, metal, ios, android, android-opencl, webgpu, "
                   "...), a comma list, or `all` (one artifact per preset, with a kiln-manifest.json)")
@click.option("--quant", default="auto", show_default=True,
              help="auto (as-stored for GGUF; for HF weights the target's default: q4f32 on CPUs, q4f16 on GPUs), "
                   "q0f32, q0f16, q4f32, q4f16, q8f32, as-stored, as-stored-f16 (a GGUF's weights exact, "
                   "float16 activations)")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="artifact dir [dist/<model>-<quant>-<target>]")
@click.option("--dump-ir", type=click.Path(path_type=Path), help="write the IR after each pipeline phase here")
@click.option("--context-window", type=int, help="cap the context window (KV memory)")
@click.option("--prefill-chunk", type=int, help="most tokens one prefill call takes")
@click.option("--max-batch-size", type=int,
              help="most sequences one forward runs (what `kiln serve --max-num-seqs` may use; memory is "
                   "planned for it) [the target's: 32 on CPUs, 256 on CUDA and ROCm]")
@click.option("--force", is_flag=True, help="replace an existing kiln artifact at the output path")
@click.option("--check", "check_after", is_flag=True,
              help="then run the artifact on its golden prompts (as `kiln check`) if it runs on this machine")
@click.option("--no-golden", is_flag=True, help="store no golden logits (then `kiln check` has nothing to compare)")
@_friendly_errors
def compile_cmd(model, target, quant, output, dump_ir, context_window, prefill_chunk, max_batch_size, force,
                check_after, no_golden) -> None:
    """Compile MODEL (HF directory, .gguf or .onnx file, or `smollm2`) into an artifact directory.

    Unless --no-golden, the reference's top-k logits on three short prompts go into the artifact
    (transformers float32 on the same weights, else kiln's own float32 build for this machine).
    With several targets (`--target all`, or a comma list) each preset's artifact goes to
    OUT/<preset> (OUT: -o, default dist/<model>) beside OUT/kiln-manifest.json; a preset that fails
    does not stop the others, and the exit status is 1 if any failed."""
    import kiln
    from kiln.compiler.multi import is_many
    if check_after and no_golden:
        raise click.UsageError("--check needs the golden logits that --no-golden leaves out; pass one of them")
    if is_many(target):
        if check_after:
            raise click.UsageError("--check runs one artifact; with several targets run `kiln check` on each")
        _compile_many(model, target, quant, output, dump_ir, context_window, prefill_chunk, max_batch_size, force,
                      not no_golden)
        return
    start = time.perf_counter()
    with _Progress() as progress:
        path = kiln.compile(model, target=target, quant=quant, output=output, dump_ir=dump_ir,
                            progress=progress, context_window=context_window, prefill_chunk=prefill_chunk,
                            max_batch_size=max_batch_size, force=force, golden=not no_golden)
    written = json.loads((path / "kiln-config.json").read_text())
    tuned = written.get("tuned_kernels", 0)
    for note in written.get("notes", []):
        click.echo(f"note: {note}", err=True)
    click.echo(f"wrote {path} in {time.perf_counter() - start:.1f} s"
               + (f" ({tuned} kernels with knobs from `kiln tune`)" if tuned else ""))
    if check_after:
        _check(path, only_here=True)


def _check(path: Path, only_here: bool = False) -> None:
    """Print the per-prompt table; a failure exits 1 with one line naming the reason. only_here: an
    artifact that cannot run on this machine is skipped with a note instead."""
    import kiln
    from kiln.runtime.check import ArtifactError, runs_here
    if only_here:
        try:
            runs_here(path)
        except ArtifactError as e:
            click.echo(f"check skipped: {e}", err=True)
            return
    with _Progress() as progress:
        report = kiln.check(path, progress)
    click.echo(report.table())
    if not report.ok:
        click.echo(f"error: {report.reason()}", err=True)
        sys.exit(1)


@main.command("check")
@click.argument("artifact", type=click.Path(path_type=Path))
@_friendly_errors
def check_cmd(artifact) -> None:
    """Run ARTIFACT on its golden prompts on its device and compare with the stored reference logits:
    per prompt the max logit error (over the reference's top-k ids), top-1 agreement and KL divergence
    (over the top-k). Exits 1, with one line saying why, beyond the quantization scheme's tolerance."""
    _check(artifact)


def _compile_many(model, spec, quant, output, dump_ir, context_window, prefill_chunk, max_batch_size, force,
                  golden) -> None:
    from kiln.compiler import CompileOptions
    from kiln.compiler.multi import MANIFEST_NAME, compile_many, parse_targets
    # --dump-ir: DIR/<preset>/
    opts = CompileOptions(model=model, quant=quant, dump_ir=dump_ir, context_window=context_window,
                          prefill_chunk=prefill_chunk, max_batch_size=max_batch_size, force=force, golden=golden)
    opts.validate()                 # the numbers and the quantization, before any target compiles
    targets, skipped = parse_targets(spec)
    for name, why in skipped.items():
        click.echo(f"skipping {name}: {why}", err=True)
    click.echo(f"compiling {model} for {len(targets)} targets: {', '.join(targets)}", err=True)

    def done(o, i, n):
        what = f"ok, {o.path.name}/ in {o.seconds:.0f} s" if o.error is None else f"FAILED: {o.error}"
        click.echo(f"[{i}/{n}] {o.target}: {what}", err=True)

    result = compile_many(opts, spec, output, done)
    ok = len(result.outcomes) - len(result.failed)
    click.echo(f"wrote {ok} artifacts and {result.out_dir / MANIFEST_NAME}")
    if result.failed:
        click.echo(f"error: {len(result.failed)} of {len(result.outcomes)} targets failed: "
                   + "; ".join(f"{o.target} ({o.error})" for o in result.failed), err=True)
        sys.exit(1)


def _sampling_options(fn):
    for opt in reversed([
        click.option("--max-tokens", default=256, show_default=True, help="tokens to generate at most"),
        click.option("--temperature", default=0.7, show_default=True, help="0 = greedy"),
        click.option("--top-p", default=0.95, show_default=True),
        click.option("--top-k", default=0, show_default=True, help="0 = off"),
        click.option("--seed", type=int, help="same seed, same output"),
        click.option("--stop", multiple=True, help="stop string (repeatable)"),
    ]):
        fn = opt(fn)
    return fn


def _params(max_tokens, temperature, top_p, top_k, seed, stop):
    from kiln import SamplingParams
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                          seed=seed, stop=tuple(stop))


_SPECULATION = ("speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "draft_model")


def _speculation_options(fn):
    """--speculative-tokens, the n-gram sizes of its prompt lookup and --draft-model (EngineConfig's
    fields), handed to the command as one dict, `speculation`."""
    @functools.wraps(fn)
    def command(*args, **kwargs):
        return fn(*args, speculation={k: kwargs.pop(k) for k in _SPECULATION}, **kwargs)
    command = click.option("--draft-model", metavar="MODEL",
                           help="speculative decoding with this smaller model's greedy tokens as the drafts, "
                                "instead of prompt lookup: an artifact for the same device, or a model compiled "
                                "on first use; it must share MODEL's tokenizer (e.g. Llama-3.2-1B for "
                                "Llama-3.1-8B); --speculative-tokens 0 means 4 with it")(command)
    command = click.option("--prompt-lookup-max", default=4, show_default=True, type=click.IntRange(min=1),
                           help="speculative decoding: the longest n-gram looked up")(command)
    command = click.option("--prompt-lookup-min", default=2, show_default=True, type=click.IntRange(min=1),
                           help="speculative decoding: the shortest n-gram looked up")(command)
    return click.option("--speculative-tokens", default=0, show_default=True, type=click.IntRange(min=0),
                        help="speculative decoding by prompt lookup: in a step of decodes, check up to this "
                             "many tokens that followed an earlier occurrence of each request's last tokens in "
                             "the same forward and keep those the model picks itself (greedy: the same text; "
                             "fewer forwards where text repeats: edits, quotes, code); 0 is off")(command)


def _speculation(speculation: dict) -> dict:
    """EngineConfig's speculative fields from the options, a --draft-model compiled on first use."""
    import kiln
    draft = speculation["draft_model"]
    return {**speculation, "draft_model": draft if draft is None or kiln.is_artifact(draft) else _compiled(draft)}


def _chat_template_option(fn):
    return click.option("--chat-template", "chat_template", metavar="NAME|FILE",
                        help="use this chat template instead of the model's (a jinja file, or built-in: "
                             "chatml, gemma, llama3); for models that ship none")(fn)


def _template_source(value: str | None) -> str | None:
    """The option's template source, checked before any model is read."""
    if value is None:
        return None
    from kiln.runtime.chat_templates import resolve_chat_template
    try:
        return resolve_chat_template(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _engine(model: str, chat_template: str | None = None, speculation: dict | None = None):
    """The engine of `generate` and `chat`: one sequence at a time, so its KV cache holds one full
    context (on a GPU it would otherwise take 90% of the device for the artifact's max batch)."""
    import kiln
    source = _template_source(chat_template)
    path = model if kiln.is_artifact(model) else _compiled(model)
    return kiln.Engine(path, kiln.EngineConfig(max_num_seqs=1, chat_template=source,
                                               **(_speculation(speculation) if speculation else {})))


@main.command()
@click.argument("model")
@click.argument("prompt")
@_sampling_options
@click.option("--chat/--raw", "as_chat", default=False, help="wrap PROMPT in the model's chat template")
@click.option("--ids", "as_ids", is_flag=True, help="PROMPT is comma-separated token ids, not text")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of streaming text")
@_chat_template_option
@_speculation_options
@_friendly_errors
def generate(model, prompt, max_tokens, temperature, top_p, top_k, seed, stop, as_chat, as_ids, as_json,
             chat_template, speculation) -> None:
    """Generate a continuation of PROMPT with MODEL (an artifact, or a model compiled on first use)."""
    engine = _engine(model, chat_template, speculation)
    params = _params(max_tokens, temperature, top_p, top_k, seed, stop)
    if as_ids:
        ids = _parse_ids(prompt)
    elif as_chat:
        ids = engine.render_chat([{"role": "user", "content": prompt}])
    else:
        ids = engine.encode(prompt)
    if as_json:
        out = engine.generate(ids, params)
        click.echo(json.dumps({"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                               "usage": out.usage}))
        return
    for delta in engine.generate_stream(ids, params):
        click.echo(delta.text, nl=False)
    click.echo()


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise click.BadParameter(f"--ids expects comma-separated integers like 1,2,3, got {text!r}") from None


@main.command()
@click.argument("model", default=DEFAULT_MODEL)
@_sampling_options
@click.option("--system", default=None, help="system prompt")
@_chat_template_option
@_speculation_options
@_friendly_errors
def chat(model, max_tokens, temperature, top_p, top_k, seed, stop, system, chat_template, speculation) -> None:
    """Chat with MODEL interactively (default: smollm2). /reset clears the history, /exit quits,
    Ctrl-C stops a reply; arrow keys edit and recall lines."""
    from kiln.chat import run_chat
    engine = _engine(model, chat_template, speculation)
    run_chat(engine, _params(max_tokens, temperature, top_p, top_k, seed, stop), system)


@main.command()
@click.argument("model")
@click.option("--prompt-len", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--gen-len", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--batch", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--runs", default=3, show_default=True, type=click.IntRange(min=1), help="timed runs after one warm-up")
@click.option("--profile", is_flag=True,
              help="after the bench, time every kernel of one prefill and of the mean decode step "
                   "(a VM instrument, a few us per call; reports both wall times); JSON key \"profile\"")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object as the last line")
@_friendly_errors
def bench(model, prompt_len, gen_len, batch, runs, profile, as_json) -> None:
    """Benchmark MODEL (artifact or model): prefill/decode tok/s, TTFT, TPOT, peak RSS (medians).

    --profile then runs the same shape again (a warm-up, then RUNS plain and RUNS instrumented runs)
    and breaks the prefill and the mean decode step down by kernel: ms, % of the step, calls, ms per
    call. The VM's builtins are grouped as "VM overhead"; attention kernels keep their own lines.
    On a GPU each VM call syncs the device, so the instrumented step is slower there.
    """
    import kiln
    from kiln.runtime.bench import bench as run_bench, kv_tokens_needed, profile_kernels
    from kiln.runtime.memory_budget import default_kv_tokens
    path = model if kiln.is_artifact(model) else _compiled(model)
    art = kiln.Artifact.load(path, verify=False)                 # its config only; the Engine verifies
    # The KV cache is sized for the benchmarked shape (at least the engine's default capacity).
    need = kv_tokens_needed(art.config.kv_cache.page_size, prompt_len, gen_len, batch)
    engine = kiln.Engine(path, kiln.EngineConfig(max_total_tokens=max(need, default_kv_tokens(art))))
    r = run_bench(engine.runner, prompt_len=prompt_len, gen_len=gen_len, batch=batch, runs=runs)
    p = profile_kernels(engine.runner, prompt_len=prompt_len, gen_len=gen_len, batch=batch,
                        runs=runs) if profile else None
    if as_json:
        click.echo(json.dumps({**r.as_dict(), **({"profile": p.as_dict()} if p is not None else {})}))
        return
    click.echo(f"{engine.artifact.name}: batch {batch}, prompt {prompt_len}, gen {gen_len}, median of {runs}\n"
               f"  prefill {r.prefill_tok_s:8.1f} tok/s   (TTFT {r.ttft_ms:.1f} ms)\n"
               f"  decode  {r.decode_tok_s:8.1f} tok/s   (TPOT {r.tpot_ms:.2f} ms)\n"
               f"  peak RSS {r.peak_rss_mb:.0f} MB")
    blas = engine.runner.library_gemm_note()
    if blas:
        click.echo(f"  {blas}")
    if p is not None:
        click.echo(p.table())


@main.command()
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
@_chat_template_option
@_speculation_options
@_friendly_errors
def serve(model, host, port, api_key, model_name, max_num_seqs, max_tokens_per_step, max_total_tokens,
          kv_cache_memory, gpu_memory_utilization, no_prefix_cache, sampling_on, overlap, stream_interval,
          engine_process, api_processes, chat_template, speculation) -> None:
    """Serve MODEL (artifact, or a model compiled on first use) with an OpenAI-compatible HTTP API."""
    import kiln
    kv_bytes = parse_size(kv_cache_memory, "--kv-cache-memory") if kv_cache_memory else None
    template = _template_source(chat_template)
    server = _server_module()                 # before any compile: without the serve extra, say so now
    path = model if kiln.is_artifact(model) else _compiled(model)
    # Named after what the user gave (`smollm2`, a model folder or file, an artifact's folder), so the
    # name survives recompiles, tunes and upgrades; the cache's hash-named folder stays an alias.
    given = Path(str(model).rstrip("/"))
    name = model_name or (given.stem if given.suffix in (".gguf", ".onnx") else given.name)
    engine = kiln.EngineConfig(max_num_seqs=max_num_seqs, max_tokens_per_step=max_tokens_per_step,
                               max_total_tokens=max_total_tokens, kv_cache_bytes=kv_bytes,
                               gpu_memory_utilization=gpu_memory_utilization,
                               enable_prefix_cache=not no_prefix_cache, chat_template=template,
                               device_sampling={"auto": None, "device": True, "host": False}[sampling_on],
                               overlap={"auto": None, "on": True, "off": False}[overlap],
                               **_speculation(speculation))
    try:
        server.serve(path, server.ServerArgs(host=host, port=port, api_key=api_key, model_name=name,
                                             engine=engine, stream_interval=stream_interval,
                                             engine_process={"auto": None, "on": True, "off": False}[engine_process],
                                             api_processes=api_processes))
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


def _compiled(model: str) -> Path:
    import kiln
    with _Progress() as progress:
        return kiln.ensure_artifact(model, progress=progress)


class _TuneProgress:
    """Renders TuneStatus events: kernel i/n, candidate j/m and the best gain so far."""

    def __init__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        self.bar = Progress(TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=Console(stderr=True))
        self.kernels = self.bar.add_task("exporting and collecting kernels", total=None)
        self.candidates = self.bar.add_task("candidates", total=None, visible=False)

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def __call__(self, s) -> None:
        self.bar.update(self.kernels, completed=max(s.kernel - 1, 0), total=s.kernels,
                        description=f"kernel {s.name or '-'}"[:44])
        self.bar.update(self.candidates, completed=s.candidate, total=s.candidates or None, visible=s.kernel > 0,
                        description=f"candidates (best so far x{s.best_gain:.2f})")


@main.command()
@click.argument("model")
@click.option("--target", default="cpu", show_default=True, help="only this machine's CPU can be timed here")
@click.option("--budget", default=10.0, show_default=True, help="minutes for the whole run, export included")
@click.option("--quant", default="auto", show_default=True, help="the quantization you compile with")
@click.option("--retune", is_flag=True, help="search kernels the database already has again")
@_friendly_errors
def tune(model, target, budget, quant, retune) -> None:
    """Search schedule knobs (tile_m, tile_n, unroll_k) for MODEL's hot kernels on this machine.

    \b
    The best knobs go to a per-target database that `kiln compile` then uses by itself:
      $KILN_CACHE_DIR/tuning/<target>-<hash>.json   (default ~/.cache/kiln/tuning/)
    <hash> identifies the TVM target (kind, mcpu, mattr, num-cores). Run again to tune the
    kernels a budget did not reach; delete the file to go back to the default knobs.
    """
    from kiln.compiler.tune import TuneOptions, tune_model
    opts = TuneOptions(model=model, target=target, quant=quant, budget_minutes=budget, retune=retune)
    with _TuneProgress() as progress:
        r = tune_model(opts, progress)
    click.echo(f"{'kernel':44s} {'m=1 us':>9s} {'(default)':>9s} {'m=128 us':>9s} {'(default)':>9s} tried  knobs")
    for k in r.results:
        knobs = f"tile_m={k.knobs.tile_m} tile_n={k.knobs.tile_n} unroll_k={k.knobs.unroll_k}" if k.improved \
            else "default"
        click.echo(f"{k.name[:44]:44s} {_us(k.us, 1)} {_us(k.default_us, 1)} {_us(k.us, 128)} "
                   f"{_us(k.default_us, 128)} {k.timed:5d}  {knobs}")
    click.echo(f"{len(r.results)} kernels tuned ({sum(k.improved for k in r.results)} beat the defaults), "
               f"{r.already_tuned} already in the database, {r.left} left for a later run; "
               f"{r.seconds:.0f} s\nwrote {r.db_path}; `kiln compile` uses it (recompile to apply)")


def _us(times: dict[int, float], rows: int) -> str:
    return f"{times[rows]:9.1f}" if rows in times else f"{'-':>9s}"


for _command in COMMANDS:                # targets, cache, models, info (kiln/cli_info.py)
    main.add_command(_command)

if __name__ == "__main__":
    main()
