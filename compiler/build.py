"""compile_model: model path -> dist/<model>-<quant>-<target>/ (see DESIGN.md, the compile path)."""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import tvm
from tvm import relax

from kiln import models
from kiln.models import ModelSource
from kiln.targets import TargetProfile, get_profile

from .artifact import ParamWriter, staged_artifact, write_config
from .pipeline import build_pipeline
from .quantize import QuantScheme, get_scheme
from .spec import ENTRY_FUNCTIONS, build_spec

# progress(stage, done, total): stages are "load", "export", "compile:<phase>", "weights", "write"
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class CompileOptions:
    model: str                              # HF dir, .gguf file or alias
    target: str = "cpu"
    quant: str = "auto"
    output: Path | None = None              # default dist/<name>-<quant>-<target>
    dump_ir: Path | None = None
    context_window: int | None = None       # cap the model's context (KV memory)
    prefill_chunk: int | None = None
    max_batch_size: int = 32


def default_name(source: ModelSource, quant: str, target: str) -> str:
    stem = source.path.stem if source.path.is_file() else source.path.name
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-").lower() or "model"
    return f"{stem}-{quant}-{target}"


def compile_model(opts: CompileOptions, progress: Progress | None = None) -> Path:
    """Compile and write the artifact; returns its directory."""
    report = progress or (lambda *_: None)
    report("load", 0, 1)
    source = models.load(opts.model)
    arch, config, model = models.build(source)
    scheme = get_scheme(opts.quant, source.format)
    profile = get_profile(opts.target)
    model = scheme.apply(model)
    report("load", 1, 1)

    context = min(opts.context_window or config.context_window_size, config.context_window_size)
    chunk = min(opts.prefill_chunk or profile.prefill_chunk, context)
    dest = opts.output or Path("dist") / default_name(source, scheme.name, profile.name)

    start = time.perf_counter()
    report("export", 0, 1)
    with profile.tvm_target():
        mod, named_params = model.export_tvm(
            spec=build_spec(model, config.hidden_size, scheme.model_dtype))
    report("export", 1, 1)
    lib_built = _build_lib(mod, profile, opts.dump_ir, report)

    with staged_artifact(dest) as stage:
        lib_built.export_library(str(stage / profile.lib_name))
        names = _write_params(stage / "params", source, arch, config, scheme, named_params, report)
        tokenizer_files = source.write_tokenizer(stage) if source.write_tokenizer else []
        report("write", 0, 1)
        write_config(stage, {
            "kiln_version": _kiln_version(),
            "tvm_version": tvm.__version__,
            "model": {"name": dest.name, "arch": arch.name, "config": _config_dict(config),
                      "source": {"path": str(source.path), "format": source.format,
                                 "content_hash": source.content_hash}},
            "quantization": {"name": scheme.name, "dtype": scheme.model_dtype},
            "target": {"name": profile.name, "device": profile.device, "tvm_target": profile.target,
                       "lib": profile.lib_name},
            "entry_functions": list(ENTRY_FUNCTIONS),
            "params": names,
            "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size,
            "context_window_size": context,
            "prefill_chunk_size": chunk,
            "max_batch_size": opts.max_batch_size,
            "kv_cache": {"page_size": profile.page_size, "num_layers": config.num_hidden_layers,
                         "num_kv_heads": config.num_key_value_heads, "head_dim": config.head_dim,
                         "dtype": scheme.model_dtype},
            "bos_token_id": config.bos_token_id,
            "eos_token_ids": list(config.eos_token_ids),
            "tokenizer_files": tokenizer_files,
            "compile_seconds": round(time.perf_counter() - start, 2),
            "notes": [*source.notes, *config.notes],
        })
        report("write", 1, 1)
    return dest.resolve()


def _build_lib(mod, profile: TargetProfile, dump_ir: Path | None, report: Progress):
    phase_names = []

    def on_phase(name: str, _seconds: float) -> None:
        phase_names.append(name)
        report(f"compile:{name}", len(phase_names), 5)

    pipeline = build_pipeline(profile, dump_ir, on_phase)
    return relax.build(mod, target=profile.tvm_target(), relax_pipeline=pipeline)


def _write_params(params_dir: Path, source: ModelSource, arch, config, scheme: QuantScheme,
                  named_params, report: Progress) -> list[str]:
    """Stream each parameter: gather its HF tensors, concatenate, convert, write, drop."""
    wmap = arch.weight_map(config)
    available = set(source.weights.names())
    writer = ParamWriter(params_dir)
    names = []
    for i, (name, param) in enumerate(named_params):
        hf_names = wmap.get(name)
        if hf_names is None:
            raise ValueError(f"{arch.name}: parameter {name} has no entry in the weight map")
        missing = [n for n in hf_names if n not in available]
        if missing:
            raise models.ModelLoadError(f"{source.path} lacks tensors {missing}; the checkpoint is "
                                        f"incomplete or not a {arch.name} model")
        parts = [source.weights.get(n) for n in hf_names]
        value = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        expected = tuple(int(d) for d in param.shape)
        if value.shape != expected:
            raise models.ModelLoadError(f"{source.path}: {name} has shape {value.shape}, the config "
                                        f"implies {expected}; config.json does not match the weights")
        for out_name, array in scheme.convert(name, value).items():
            writer.add(out_name, array)
            names.append(out_name)
        report("weights", i + 1, len(named_params))
    writer.close()
    return names


def _config_dict(config) -> dict:
    d = dataclasses.asdict(config)
    d.pop("notes", None)
    return d


def _kiln_version() -> str:
    try:
        from importlib.metadata import version
        return version("kiln")
    except Exception:
        return "0+unknown"
