"""The `kiln` command: thin click wrappers that build typed options and call the library."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from kiln.cli_info import COMMANDS, exit_interrupted
from kiln.cli_info import friendly_errors as _friendly_errors
from kiln.cli_options import (DEFAULT_MODEL, CompileProgress, chat_template_option, compiled, one_sequence_engine,
                              sampling_options, sampling_params, speculation_options, step_graphs_option)
from kiln.cli_serve import serve
from kiln.cli_tune import tune
from kiln.runtime.contract import DECODE_ACTIVATIONS, KV_CACHE_DTYPES, KV_OWNERS


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
              help="auto (as-stored for GGUF, GPTQ, AWQ, compressed-tensors; for float HF weights the target's "
                   "default: q4f32 on CPUs, q4f16 on GPUs), q0f32, q0f16, q4f32, q4f16, q8f32, as-stored, "
                   "as-stored-f16 (the stored quantized weights exact, float16 activations)")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="artifact dir [dist/<model>-<quant>-<target>]")
@click.option("--dump-ir", type=click.Path(path_type=Path), help="write the IR after each pipeline phase here")
@click.option("--context-window", type=int, help="cap the context window (KV memory)")
@click.option("--prefill-chunk", type=int, help="most tokens one prefill call takes")
@click.option("--max-batch-size", type=int,
              help="most sequences one forward runs (what `kiln serve --max-num-seqs` may use; memory is "
                   "planned for it) [the target's: 32 on CPUs, 256 on CUDA and ROCm]")
@click.option("--kv-cache-dtype", type=click.Choice(KV_CACHE_DTYPES), default="auto", show_default=True,
              help="the KV cache's dtype: auto keeps the compute dtype; float16 halves a float32 model's cache "
                   "(memory, and the bytes decode attention reads), q, k and v rounded to it as llama.cpp's "
                   "f16 cache does")
@click.option("--kv-cache", type=click.Choice(("auto", *KV_OWNERS)), default="auto", show_default=True,
              help="whose KV cache: tvm (TVM's paged KV cache: prefix caching, forks, CUDA step graphs) or kiln "
                   "(pages the runtime owns, attention by position in the graph: attention sinks, exact sliding "
                   "windows; no forks yet); auto takes kiln's where the model needs it (attention sinks)")
@click.option("--decode-activations", type=click.Choice(DECODE_ACTIVATIONS), default="exact", show_default=True,
              help="int8: the GEMVs of 1-8 rows over 4-bit weights (decode of up to 8 sequences) quantize their "
                   "activations to int8 per 32 values and multiply by integer dot products, as llama.cpp does "
                   "(faster, ~0.5% error in those products; x86-64 CPUs with AVX2); exact keeps them float")
@click.option("--lora", type=click.Path(path_type=Path),
              help="a LoRA adapter trained on MODEL, a PEFT folder (adapter_config.json + "
                   "adapter_model.safetensors) or llama.cpp's LoRA GGUF: merged into its weights (as PEFT's "
                   "merge_and_unload), then compiled")
@click.option("--tokenizer", type=click.Path(path_type=Path),
              help="the tokenizer to use instead of MODEL's (for checkpoints that ship none, as OpenELM's): a "
                   "folder of tokenizer files (tokenizer.json, tokenizer.model, vocab.json + merges.txt; "
                   "tokenizer_config.json's chat template with them) or a GGUF file")
@click.option("--force", is_flag=True, help="replace an existing kiln artifact at the output path")
@click.option("--check", "check_after", is_flag=True,
              help="then run the artifact on its golden prompts (as `kiln check`) if it runs on this machine")
@click.option("--no-golden", is_flag=True, help="store no golden logits (then `kiln check` has nothing to compare)")
@_friendly_errors
def compile_cmd(model, target, quant, output, dump_ir, context_window, prefill_chunk, max_batch_size,
                kv_cache_dtype, kv_cache, decode_activations, lora, tokenizer, force, check_after,
                no_golden) -> None:
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
        _compile_many(model, target, quant, output, dump_ir, context_window, prefill_chunk, max_batch_size,
                      kv_cache_dtype, kv_cache, decode_activations, lora, tokenizer, force, not no_golden)
        return
    start = time.perf_counter()
    with CompileProgress() as progress:
        path = kiln.compile(model, target=target, quant=quant, output=output, dump_ir=dump_ir,
                            progress=progress, context_window=context_window, prefill_chunk=prefill_chunk,
                            max_batch_size=max_batch_size, kv_cache_dtype=kv_cache_dtype, kv_cache=kv_cache,
                            decode_activations=decode_activations, lora=lora, tokenizer=tokenizer, force=force,
                            golden=not no_golden)
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
    with CompileProgress() as progress:
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


def _compile_many(model, spec, quant, output, dump_ir, context_window, prefill_chunk, max_batch_size,
                  kv_cache_dtype, kv_cache, decode_activations, lora, tokenizer, force, golden) -> None:
    from kiln.compiler import CompileOptions
    from kiln.compiler.multi import MANIFEST_NAME, compile_many, parse_targets
    # --dump-ir: DIR/<preset>/
    opts = CompileOptions(model=model, quant=quant, dump_ir=dump_ir, context_window=context_window,
                          prefill_chunk=prefill_chunk, max_batch_size=max_batch_size, kv_cache_dtype=kv_cache_dtype,
                          kv_cache=kv_cache, decode_activations=decode_activations, lora=lora,
                          tokenizer=tokenizer, force=force, golden=golden)
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


@main.command()
@click.argument("model")
@click.argument("prompt")
@sampling_options
@click.option("--chat/--raw", "as_chat", default=False, help="wrap PROMPT in the model's chat template")
@click.option("--ids", "as_ids", is_flag=True, help="PROMPT is comma-separated token ids, not text")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of streaming text")
@chat_template_option
@speculation_options
@_friendly_errors
def generate(model, prompt, max_tokens, temperature, top_p, top_k, seed, stop, as_chat, as_ids, as_json,
             chat_template, speculation) -> None:
    """Generate a continuation of PROMPT with MODEL (an artifact, or a model compiled on first use)."""
    engine = one_sequence_engine(model, chat_template, speculation)
    params = sampling_params(max_tokens, temperature, top_p, top_k, seed, stop)
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
@sampling_options
@click.option("--system", default=None, help="system prompt")
@chat_template_option
@speculation_options
@_friendly_errors
def chat(model, max_tokens, temperature, top_p, top_k, seed, stop, system, chat_template, speculation) -> None:
    """Chat with MODEL interactively (default: smollm2). /reset clears the history, /exit quits,
    Ctrl-C stops a reply; arrow keys edit and recall lines."""
    from kiln.chat import run_chat
    engine = one_sequence_engine(model, chat_template, speculation)
    run_chat(engine, sampling_params(max_tokens, temperature, top_p, top_k, seed, stop), system)


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
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="decode steps draw their tokens on the device at this temperature (0: greedy)")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0), help="0: off")
@click.option("--min-p", default=0.0, show_default=True, type=click.FloatRange(0, 1, max_open=True))
@step_graphs_option
@_friendly_errors
def bench(model, prompt_len, gen_len, batch, runs, profile, as_json, temperature, top_p, top_k, min_p,
          step_graphs) -> None:
    """Benchmark MODEL (artifact or model): prefill/decode tok/s, TTFT, TPOT, peak RSS (medians).

    Decode steps are greedy unless --temperature is above 0: then each step draws its tokens where
    the logits are (sample_tokens) with --top-p / --top-k / --min-p, as a sampled server step does.

    --profile then runs the same shape again (a warm-up, then RUNS plain and RUNS instrumented runs)
    and breaks the prefill and the mean decode step down by kernel: ms, % of the step, calls, ms per
    call. The VM's builtins are grouped as "VM overhead"; attention kernels keep their own lines.
    On a GPU each VM call syncs the device, so the instrumented step is slower there.
    """
    import kiln
    from kiln.runtime.bench import Sampling, bench as run_bench, kv_tokens_needed, profile_kernels
    from kiln.runtime.memory_budget import default_kv_tokens
    try:
        sampling = Sampling(temperature, top_k, top_p, min_p)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    path = compiled(model)
    art = kiln.Artifact.load(path, verify=False)                 # its config only; the Engine verifies
    # The KV cache is sized for the benchmarked shape (at least the engine's default capacity).
    need = kv_tokens_needed(art.config.kv_cache.page_size, prompt_len, gen_len, batch)
    engine = kiln.Engine(path, kiln.EngineConfig(max_total_tokens=max(need, default_kv_tokens(art)),
                                                 step_graphs=step_graphs))
    r = run_bench(engine.runner, prompt_len=prompt_len, gen_len=gen_len, batch=batch, runs=runs, sampling=sampling)
    p = profile_kernels(engine.runner, prompt_len=prompt_len, gen_len=gen_len, batch=batch,
                        runs=runs, sampling=sampling) if profile else None
    graphs = engine.runner.graphs.stats() if engine.runner.graphs is not None else None
    if as_json:
        click.echo(json.dumps({**r.as_dict(), **({"profile": p.as_dict()} if p is not None else {}),
                               **({"step_graphs": graphs} if graphs is not None else {})}))
        return
    drawn = "greedy" if sampling.greedy else "sampled: " + ", ".join(f"{k} {v}" for k, v in sampling.as_dict().items())
    click.echo(f"{engine.artifact.name}: batch {batch}, prompt {prompt_len}, gen {gen_len}, median of {runs}, {drawn}\n"
               f"  prefill {r.prefill_tok_s:8.1f} tok/s   (TTFT {r.ttft_ms:.1f} ms)\n"
               f"  decode  {r.decode_tok_s:8.1f} tok/s   (TPOT {r.tpot_ms:.2f} ms)\n"
               f"  peak RSS {r.peak_rss_mb:.0f} MB")
    blas = engine.runner.library_gemm_note()
    if blas:
        click.echo(f"  {blas}")
    if graphs is not None:
        click.echo(f"  step graphs: off ({graphs['off']})" if graphs["off"] else
                   f"  step graphs: {graphs['captures']} captured, {graphs['replays']} steps replayed")
    if p is not None:
        click.echo(p.table())


for _command in (serve, tune, *COMMANDS):      # COMMANDS: targets, cache, models, info (kiln/cli_info.py)
    main.add_command(_command)

if __name__ == "__main__":
    main()
