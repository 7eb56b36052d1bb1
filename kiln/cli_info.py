"""`kiln targets`, `kiln cache`, `kiln models`, `kiln info`: the commands that describe what kiln
has and builds (kiln/cli.py adds COMMANDS to the `kiln` group), and the one-line error wrapper
every command uses."""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import click

def friendly_errors(fn):
    """Bad input exits non-zero with one line naming the problem and the fix, never a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, OSError) as e:   # kiln's input errors are ValueError subclasses
            click.echo(f"error: {e}", err=True)
            _exit(1)
        except KeyboardInterrupt:
            exit_interrupted()
    return wrapper


def exit_interrupted() -> None:
    """Say so and exit 130 after Ctrl-C (_exit)."""
    click.echo("interrupted", err=True)
    _exit(130)


def _exit(code: int) -> None:
    """Exit `code`. A compile stopped (Ctrl-C, or an error in the weights' conversion) while TVM builds on its
    thread (compiler/build.py _Background, a daemon) leaves that thread inside TVM's C++, and the interpreter's
    shutdown would abort the process there ("terminate called without an active exception", SIGABRT). The
    compile's own cleanup has run by now (nothing half-written is left), so the process then ends at once, its
    output flushed, without that shutdown."""
    if any(t.name == "kiln-build" and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="one JSON object per preset, one per line")
def targets(as_json) -> None:
    """List the --target presets: what each produces (device, library), whether its artifact runs on
    this machine, and whether it builds here (a missing build tool is named with its fix)."""
    from kiln.targets import UNSUPPORTED, ToolchainError, get_profile, names
    rows = []
    for name in names():
        p = get_profile(name)
        try:
            p.check_toolchain(p)
            builds = "yes"
        except ToolchainError as e:
            builds = f"no ({e})"
        # A cross-compiled CPU target (android) never runs here; a GPU preset does where its GPU is.
        runs = p.runnable_here or (p.device != "cpu" and _has_device(p.device))
        rows.append({"preset": name, "name": p.name, "device": p.device, "lib": p.lib_name,
                     "default_quant": p.default_quant, "runs_here": runs, "builds_here": builds,
                     "description": p.description})
    for name, why in UNSUPPORTED.items():
        rows.append({"preset": name, "name": name, "device": name, "lib": None, "default_quant": None,
                     "runs_here": False, "builds_here": f"no ({why})", "description": "not built by kiln"})
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    click.echo(f"{'preset':<15} {'device':<7} {'library':<10} {'quant':<6} {'runs here':<10} {'builds here':<12} "
               "what")
    for r in rows:
        click.echo(f"{r['preset']:<15} {r['device']:<7} {r['lib'] or '-':<10} {r['default_quant'] or '-':<6} "
                   f"{'yes' if r['runs_here'] else 'no':<10} {r['builds_here']:<12} {r['description']}")


@click.group()
def cache() -> None:
    """The compile-on-first-use cache ($KILN_CACHE_DIR/artifacts, default ~/.cache/kiln/artifacts) and
    the built libraries every compile reuses ($KILN_CACHE_DIR/libs, or $KILN_LIB_CACHE; 0: none)."""


@cache.command("list")
@click.option("--json", "as_json", is_flag=True,
              help="one JSON object per artifact, built library, compiled, parsed and scheduled kernel (\"kind\" "
                   "says which), one per line")
def cache_list(as_json) -> None:
    """Every cached artifact: model, quantization, target, size and last use (oldest first); then how
    many built libraries, compiled, parsed and scheduled kernels the compiles keep (--json: each of them)."""
    from kiln.cache import artifacts_dir, entries
    from kiln.compiler.lib_cache import KEPT, cache_root, kept, libraries
    found, libs, files = entries(), libraries(), {kind: kept(kind) for kind in KEPT}
    for e in found:
        row = {"kind": "artifact", "path": str(e.path), "model": e.model, "quant": e.quant, "target": e.target,
               "bytes": e.bytes, "last_used": _when(e.last_used)}
        if as_json:
            click.echo(json.dumps(row))
        else:
            click.echo(f"{row['last_used']}  {e.bytes / 1e6:8.1f} MB  {e.quant:<9} {e.target:<8} {e.model}  "
                       f"({e.path.name})")
    if as_json:
        for kind, listed in (("library", libs), *files.items()):
            for f in listed:
                click.echo(json.dumps({"kind": kind, "path": str(f.path), "bytes": f.bytes,
                                       "last_used": _when(f.last_used)}))
    else:
        click.echo(f"{len(found)} entries, {sum(e.bytes for e in found) / 1e6:.1f} MB in {artifacts_dir()}")
        if libs or any(files.values()):
            click.echo(f"{_kept(libs, files)}, in {cache_root()}")


def _kept(libs, files: dict) -> str:
    """How many built libraries and kept kernels of each kind, and their sizes."""
    from kiln.compiler.lib_cache import KEPT
    return ", ".join(f"{len(listed)} {what}, {sum(f.bytes for f in listed) / 1e6:.1f} MB" for what, listed in (
        ("built libraries", libs), *((KEPT[kind][2], listed) for kind, listed in files.items())))


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


@cache.command("clean")
@click.option("--older-than", default=None, help="only entries unused for this long: 90s, 30m, 12h, 7d, 2w")
@friendly_errors
def cache_clean(older_than) -> None:
    """Remove cached artifacts, built libraries, compiled, parsed and scheduled kernels (all, or those
    unused for --older-than); they are built again on next use."""
    from kiln.cache import clean, parse_age
    from kiln.compiler import lib_cache
    age = parse_age(older_than) if older_than else None
    removed, (libs, files) = clean(age), lib_cache.clean(age)
    click.echo(f"removed {len(removed)} entries, {sum(e.bytes for e in removed) / 1e6:.1f} MB"
               + (f", {_kept(libs, files)}" if libs or any(files.values()) else ""))


@click.command("models")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per family, one per line")
def models_cmd(as_json) -> None:
    """List the model families kiln compiles, with the config.json architectures, model types and GGUF
    architecture names each accepts (a Hugging Face folder, a .gguf file or an ONNX export of one)."""
    from kiln.models.registry import ARCHITECTURES, gguf_architectures
    width = max(len(name) for name in ARCHITECTURES)
    for a in ARCHITECTURES.values():
        row = {"family": a.name, "hf_architectures": list(a.hf_architectures), "model_types": list(a.model_types),
               "gguf_architectures": list(gguf_architectures(a))}
        if as_json:
            click.echo(json.dumps(row))
        else:
            click.echo(f"{a.name:<{width}} HF {', '.join(a.hf_architectures):<58} "
                       f"GGUF {', '.join(row['gguf_architectures']) or '-'}")
    if not as_json:
        from kiln.models.vision_text import WRAPPERS
        click.echo(f"and the language model (one of the families above) of {', '.join(WRAPPERS)} checkpoints, "
                   "read without their vision (or audio) towers")


def _has_device(kind: str) -> bool:
    """Whether this machine has a `kind` device TVM can open (a GPU preset runs where its GPU is)."""
    from kiln.runtime._tvm import open_device
    try:
        open_device(kind)
        return True
    except ValueError:          # ArtifactError: no driver, no device, no runtime for it
        return False


@click.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print kiln-config.json")
@friendly_errors
def info(artifact, as_json) -> None:
    """Describe a compiled ARTIFACT and verify its file hashes."""
    from kiln import Artifact
    from kiln.runtime.check import golden_summary
    art = Artifact.load(artifact)
    c = art.config
    if as_json:
        click.echo(json.dumps(c.to_dict(), indent=2))
        return
    m = c.model.config
    int8 = ", int8 activations in decode's GEMVs" if c.quantization.get("decode_activations") == "int8" else ""
    click.echo(f"{art.path}\n  model      {c.model.arch}  layers={m['num_hidden_layers']} "
               f"hidden={m['hidden_size']} heads={m['num_attention_heads']}/{m['num_key_value_heads']} "
               f"vocab={c.vocab_size}\n  quant      {c.quantization['name']}{int8}\n"
               f"  target     {c.target.name} ({c.target.device}, {c.target.lib})\n"
               f"  context    {c.context_window_size} tokens, prefill chunk {c.prefill_chunk_size}\n"
               f"  kv cache   {c.kv_cache.dtype}, {c.kv_cache.bytes_per_token / 1024:g} KiB a token\n"
               f"  params     {len(c.params)} tensors\n  tvm        {c.tvm_version}\n"
               f"  source     {c.model.source.path} ({c.model.source.format})\n"
               f"  hashes     ok ({len(c.files)} files)\n"
               f"  golden     {golden_summary(c.golden)}")
    for note in c.notes:
        click.echo(f"  note       {note}")


COMMANDS = (targets, cache, models_cmd, info)


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}


def parse_size(text: str, option: str) -> int:
    """'2GiB', '512MB', '1.5g', '1048576' -> bytes; anything else a usage error naming the option."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m and _UNITS.get(m.group(2).lower())
    if not unit or float(m.group(1)) <= 0:
        raise click.BadParameter(f"{text!r} is not a size; write e.g. 2GiB, 512MB or a number of bytes",
                                 param_hint=option)
    return int(float(m.group(1)) * unit)
