"""compile_model: model path -> dist/<model>-<quant>-<target>/ (see DESIGN.md, the compile path)."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import tvm
from tvm import relax, tirx

from kiln import models
from kiln.models import ModelSource
from kiln.models.causal_lm import sliding_window
from kiln.models.source import usable_cores
from kiln.targets import (DEFAULT_TARGET, INT8_DECODE_ATTR, SOFTCAP_ATTR, TargetProfile, get_profile,
                          memoize_kv_cache_kernels)
from kiln.targets import names as target_names

from kiln.runtime.contract import (DECODE_ACTIVATIONS, ENTRY_FUNCTIONS, GEMM_PACKED_FUNC, GOLDEN_NAME,
                                   KV_CACHE_DTYPES, KV_OWNERS, LIBRARY_GEMM_COPIES, LIBRARY_GEMM_DECODE,
                                   LIBRARY_GEMM_WEIGHTS, OPTIONAL_ENTRY_FUNCTIONS, OWNED_KV_ENTRY_FUNCTIONS,
                                   OWNED_KV_TABLES, OWNED_STATE_TABLES, PARAMS_DIR, ArtifactConfig, KVCacheLayout,
                                   ModelInfo, ParamWriter, SourceInfo, TargetInfo, write_config, write_golden)

from . import codegen
from .artifact import check_output, staged_artifact
from .golden import TOP_K, Reference, compute_golden, golden_prompts, transformers_reference
from .lib_cache import LibraryCache
from .pipeline import build_pipeline
from .quantize import QuantPlan, QuantScheme, get_scheme
from .spec import bound_shapes, build_spec
from .tvmscript import quick_frames

# progress(stage, done, total): stages are "load", "export", "compile:<phase>", "weights", "golden", "write"
Progress = Callable[[str, int, int], None]
# The reference for golden logits where transformers cannot read the source: given why not, it returns one.
Fallback = Callable[[str], Reference]


@dataclass(frozen=True)
class CompileOptions:
    model: str                              # HF dir, .gguf or .onnx file, or alias
    target: str = DEFAULT_TARGET
    quant: str = "auto"
    output: Path | None = None              # default dist/<name>-<quant>-<target>
    dump_ir: Path | None = None
    context_window: int | None = None       # cap the model's context (KV memory)
    prefill_chunk: int | None = None
    max_batch_size: int | None = None       # default: the target profile's max_batch_size
    force: bool = False                     # replace an existing artifact at `output`
    golden: bool = True                     # store golden logits (compiler/golden.py) for `kiln check`
    kv_cache_dtype: str = "auto"            # KV_CACHE_DTYPES: auto keeps the compute dtype
    kv_cache: str = "auto"                  # whose KV cache (KV_OWNERS): auto is kiln's where the model needs
                                            # it (attention sinks), else TVM's
    decode_activations: str = "exact"       # DECODE_ACTIVATIONS: int8 quantizes the 1-8 row GEMVs' x
    lora: Path | None = None                # a PEFT LoRA adapter's folder, merged into the weights (models/lora.py)
    tokenizer: Path | None = None           # the tokenizer from here, not the model's (models/tokenizer_from.py)

    def validate(self) -> None:
        """Everything checkable before the model is read: the target, the quantization name, the
        numbers, and the output path (a compile never deletes what it did not write)."""
        get_profile(self.target)
        get_scheme(self.quant)
        for name in ("context_window", "prefill_chunk", "max_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype {self.kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
        if self.kv_cache not in ("auto", *KV_OWNERS):
            raise ValueError(f"--kv-cache {self.kv_cache!r} is not one of auto, {', '.join(KV_OWNERS)}")
        if self.decode_activations not in DECODE_ACTIVATIONS:
            raise ValueError(f"--decode-activations {self.decode_activations!r} is not one of "
                             f"{', '.join(DECODE_ACTIVATIONS)}")
        if self.output is not None:
            check_output(self.output, self.force)


def default_name(source: ModelSource, quant: str, target: str) -> str:
    stem = source.path.stem if source.path.is_file() else source.path.name
    if source.adapter:
        stem = f"{stem}-{Path(source.adapter).name}"
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-").lower() or "model"
    return f"{stem}-{quant}-{target}"


@dataclass(frozen=True)
class Exported:
    """A model loaded, quantized and exported to Relax: where compile_model and `kiln tune` start."""
    source: ModelSource
    arch: object                            # models' registered architecture
    config: object                          # its config dataclass
    profile: TargetProfile
    scheme: QuantScheme
    plan: QuantPlan
    mod: tvm.IRModule                       # the entry functions, before the pipeline
    named_params: list
    window_mode: str                        # how the KV cache slides ("" without sliding layers)
    kv_dtype: str                           # the KV cache's (the compute dtype, or --kv-cache-dtype)
    context: int                            # tokens a sequence may hold (the model's, or --context-window)
    chunk: int                              # most tokens one forward takes (the memory plan's bound)
    max_batch: int                          # most sequences (or logit rows) one forward takes (the other)
    kv_owner: str = "tvm"                   # whose KV cache the functions take (KV_OWNERS)


def export_model(opts: CompileOptions, progress: Progress | None = None) -> Exported:
    """Load, quantize (swap in quantized modules) and export the model for opts.target."""
    report = progress or (lambda *_: None)
    opts.validate()
    profile = get_profile(opts.target)
    profile.check_toolchain(profile)
    report("load", 0, 1)
    source = models.load(opts.model)
    if opts.lora is not None:
        from kiln.models.lora import with_adapter
        source = with_adapter(source, opts.lora)
    if opts.tokenizer is not None:
        from kiln.models.tokenizer_from import with_tokenizer
        source = with_tokenizer(source, opts.tokenizer)
    arch, config, model = models.build(source)
    scheme = get_scheme(opts.quant, source, profile.default_quant)
    plan = scheme.apply(model, source, arch.weight_map(config), eight_bit=profile.eight_bit_storage,
                        codes_by_bits=profile.codes_by_bits, half_storage=profile.half_storage,
                        half_scales=profile.half_scales)
    if opts.kv_cache_dtype == "float16" and not profile.half_storage:
        raise ValueError(f"--kv-cache-dtype float16: the {profile.name} target stores no 16-bit values; "
                         "use --kv-cache-dtype auto")
    if opts.kv_cache_dtype != "auto":
        model.set_kv_dtype(opts.kv_cache_dtype)
    problem = model.tvm_cache_problem() if hasattr(model, "tvm_cache_problem") else None
    owner = opts.kv_cache if opts.kv_cache != "auto" else "kiln" if problem else "tvm"
    if owner == "tvm" and problem:
        raise ValueError(f"{problem}; use --kv-cache kiln (or auto)")
    if owner == "kiln":
        if not hasattr(model, "own_kv_cache"):
            raise ValueError(f"{arch.name} models run over TVM's paged KV cache only; use --kv-cache tvm (or auto)")
        model.own_kv_cache(profile.page_size)
    if opts.decode_activations == "int8" and not profile.int8_decode:
        able = ", ".join(n for n in target_names() if get_profile(n).int8_decode)
        raise ValueError(f"--decode-activations int8: the {profile.name} target has no int8 GEMV (targets with "
                         f"one: {able}); use --decode-activations exact")
    if opts.decode_activations == "int8":
        profile = profile.with_int8_decode()
    report("load", 1, 1)
    if opts.context_window and opts.context_window > config.context_window_size:
        raise ValueError(f"--context-window {opts.context_window} exceeds the model's context window "
                         f"({config.context_window_size} tokens); pass at most {config.context_window_size}")
    context = opts.context_window or config.context_window_size
    chunk = min(opts.prefill_chunk or profile.prefill_chunk, context)
    report("export", 0, 1)
    memoize_kv_cache_kernels()                                # TVM's KV-cache kernels: parsed once
    with profile.tvm_target(), quick_frames():                # the KV cache's kernels parse here
        mod, named_params = model.export_tvm(
            spec=build_spec(model, config.hidden_size, config.vocab_size, scheme.model_dtype, profile.library_gemm))
    softcap = model.flags.attn_logit_softcap
    if softcap:
        if not profile.attn_softcap:
            able = ", ".join(n for n in target_names() if get_profile(n).attn_softcap)
            raise ValueError(f"this model soft-caps attention scores (attn_logit_softcapping={softcap}), which "
                             f"kiln's {profile.name} attention kernels do not implement yet; use --target {able}")
        mod = mod.with_attr(SOFTCAP_ATTR, float(softcap))
    if opts.decode_activations == "int8":
        mod = mod.with_attr(INT8_DECODE_ATTR, True)
    max_batch = opts.max_batch_size or profile.max_batch_size
    mod = bound_shapes(mod, chunk, max_batch)
    report("export", 1, 1)
    return Exported(source, arch, config, profile, scheme, plan, mod, named_params, model.window_mode or "",
                    model.kv_dtype or scheme.model_dtype, context, chunk, max_batch, owner)


def compile_model(opts: CompileOptions, progress: Progress | None = None, fallback: Fallback | None = None) -> Path:
    """Compile and write the artifact; returns its directory. `fallback` gives the golden reference
    where transformers cannot read the source (without one, such an artifact stores none and says why)."""
    report = progress or (lambda *_: None)
    start = time.perf_counter()
    ex = export_model(opts, report)
    source, arch, config, profile, scheme, plan = ex.source, ex.arch, ex.config, ex.profile, ex.scheme, ex.plan
    named_params = ex.named_params

    context, chunk = ex.context, ex.chunk
    dest = opts.output or Path("dist") / default_name(source, scheme.name, profile.name)
    if opts.output is None:
        check_output(dest, opts.force)
    with staged_artifact(dest) as stage:
        # The library builds (TVM) while the weights convert (numpy, every core) and then the golden
        # logits compute (torch): a compile takes the longer of the two, not their sum.
        building = _Background(lambda stopped: _build_into(stage / profile.lib_name, ex.mod, profile, opts.dump_ir,
                                                           _unless_stopped(stopped, report)))
        try:
            names = _write_params(stage / PARAMS_DIR, source, arch, config, plan, named_params, report,
                                  building.check)
            tokenizer_files = source.write_tokenizer(stage) if source.write_tokenizer else []
            building.check()
            golden = _write_golden(stage, source, config, opts.golden, fallback, report)
            facts = building.result()
        except BaseException:
            building.stop()             # the library of a compile that failed: built no further than its phase
            raise
        report("write", 0, 1)
        write_config(stage, ArtifactConfig(
            kiln_version=_kiln_version(),
            tvm_version=tvm.__version__,
            model=ModelInfo(dest.name, arch.name, _config_dict(config),
                            SourceInfo(source.format, source.content_hash, source.path.name)),
            quantization={**plan.describe(), "decode_activations": opts.decode_activations,
                          **({"model_activations": "int8"} if _rounds_activations(config) else {})},
            target=TargetInfo(profile.name, profile.device, profile.target, profile.lib_name),
            entry_functions=(*(ENTRY_FUNCTIONS if ex.kv_owner == "tvm" else OWNED_KV_ENTRY_FUNCTIONS),
                             *OPTIONAL_ENTRY_FUNCTIONS,
                             *[*LIBRARY_GEMM_COPIES, LIBRARY_GEMM_WEIGHTS] * profile.library_gemm),
            params=names,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            context_window_size=context,
            prefill_chunk_size=chunk,
            max_batch_size=ex.max_batch,
            kv_cache=_kv_layout(config, profile.page_size, ex.kv_dtype, ex.window_mode, ex.kv_owner),
            bos_token_id=config.bos_token_id,
            eos_token_ids=config.eos_token_ids,
            tokenizer_files=tokenizer_files,
            compile_seconds=round(time.perf_counter() - start, 2),
            tuned_kernels=facts.tuned_kernels,
            activation_bytes=facts.activation_bytes,
            library_gemm_bytes=facts.library_gemm_bytes,
            library_gemm_call_values=facts.library_gemm_call_values,
            notes=(*source.notes, *config.notes, *plan.notes),
            golden=golden,
        ))
        report("write", 1, 1)
    return dest.resolve()


def _write_golden(stage: Path, source: ModelSource, config, wanted: bool, fallback: Fallback | None,
                  report: Progress) -> dict:
    """golden.npz in the stage; returns the config's record of it (or of why there is none)."""
    if not wanted:
        return {"skipped": "compiled with --no-golden"}
    prompts = golden_prompts(stage / "tokenizer.json", config.vocab_size, config.bos_token_id)
    report("golden", 0, len(prompts))                   # while the reference loads
    forward, reference = transformers_reference(source)
    if forward is None:
        if fallback is None:
            return {"skipped": f"no reference: {reference}"}
        forward, reference = fallback(reference)
    write_golden(stage, compute_golden(prompts, forward, report))
    return {"file": GOLDEN_NAME, "reference": reference, "prompts": len(prompts),
            "tokens": [len(p) for p in prompts], "top_k": min(TOP_K, config.vocab_size)}


def build_lib(mod, profile: TargetProfile, dump_ir: Path | None = None,
              report: Progress | None = None, reuse: LibraryCache | None = None) -> tuple[object, BuildFacts]:
    """Run the pipeline and build: the executable, and what the pipeline saw on the way (BuildFacts).
    `reuse`: where that cache holds the library of the module the pipeline left (same target, TVM
    and kiln), the executable is that file (lib_cache.CachedLibrary) and TVM's code generation is
    skipped; else the caller keeps what it exports (reuse.keep), and a parted build compiles only
    the kernels whose objects the cache does not hold (lib_cache.KernelObjects): an export is then
    the one use of the executable."""
    report = report or (lambda *_: None)
    phase_names = []

    def on_phase(name: str, _seconds: float) -> None:
        phase_names.append(name)
        report(f"compile:{name}", len(phase_names), 5)

    pipeline = build_pipeline(profile, dump_ir, on_phase)
    space = profile.tuning_space()
    facts, ctx = _Observe(space.marker_attr if space else None), tvm.transform.PassContext.current()
    target = profile.tvm_target()
    with tvm.transform.PassContext(opt_level=ctx.opt_level, required_pass=list(ctx.required_pass),
                                   disabled_pass=list(ctx.disabled_pass), config=dict(ctx.config),
                                   instruments=[*ctx.instruments, facts]):
        with target, _ONE_PIPELINE:            # as relax.build runs a pipeline it is given
            lowered = pipeline(mod)
        cached = reuse.lookup(lowered, profile, target) if reuse is not None else None
        if cached is not None:
            report("compile:library reused", len(phase_names), len(phase_names))
            return cached, facts.facts
        built = codegen.build(lowered, target, profile.system_lib, profile.codegen_parts,
                              reuse.kernel_objects(target) if reuse is not None else None)
        if getattr(built, "reused", 0):
            report(f"compile:{built.reused} kernels reused", len(phase_names), len(phase_names))
        return built, facts.facts


# One pipeline at a time in a process: TVM keeps some of its state for lowering operators process-wide,
# not per thread (te.tag's TagScope: two legalizations at once fail with "nested op_tag is not allowed").
# Two builds overlap where a compile builds its own float32 reference (kiln.compile's fallback) while
# its library still builds; the second pipeline waits for the first.
_ONE_PIPELINE = threading.RLock()


@dataclass
class BuildFacts:
    tuned_kernels: int = 0          # kernels scheduled with tuning-database knobs
    activation_bytes: int = 0       # every constant-size buffer the Relax functions allocate, summed
    library_gemm_bytes: int = 0     # the float weights LIBRARY_GEMM_WEIGHTS returns, summed
    library_gemm_call_values: int = 0   # weight values a BLAS call of LIBRARY_GEMM_DECODE multiplies, mean


_ALLOC_STORAGE = tvm.ir.Op.get("relax.vm.alloc_storage")
_CALL_DPS_PACKED = tvm.ir.Op.get("relax.call_dps_packed")


@tvm.instrument.pass_instrument
class _Observe:
    """Reads the module between phases: the kernels scheduled with tuning-database knobs (the
    ``Tuned`` rules mark them) right after the schedule phase, since later passes may fold kernels
    together; and after memory planning, the bytes of device memory the Relax functions allocate.

    That sum is what the VM's pooled allocator can hold at once if every entry function runs (it
    reuses a freed buffer only for the same size), so the runtime can size the KV cache from the
    device's free memory. Allocations whose size is only known at run time are left out: bound_shapes
    makes every entry function's constant except batch_verify's output."""

    def __init__(self, marker_attr: str | None) -> None:
        self.marker_attr, self.facts = marker_attr, BuildFacts()

    def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        if info.name == "graph":
            names = [gv.name_hint for gv in mod.get_global_vars()]
            if LIBRARY_GEMM_WEIGHTS in names:
                self.facts.library_gemm_bytes = sum(
                    math.prod(int(d) for d in t.shape.values) * tvm.DataType(t.dtype).itemsize
                    for t in mod[LIBRARY_GEMM_WEIGHTS].ret_ty.fields)
            if LIBRARY_GEMM_DECODE in names:
                self.facts.library_gemm_call_values = _mean_gemm_values(mod[LIBRARY_GEMM_DECODE])
        elif info.name == "schedule" and self.marker_attr:
            self.facts.tuned_kernels = sum(
                1 for _, f in mod.functions_items()
                if isinstance(f, tirx.PrimFunc) and f.attrs is not None and self.marker_attr in f.attrs)
        elif info.name == "finalize":
            self.facts.activation_bytes = sum(_constant_allocations(f) for _, f in mod.functions_items()
                                              if isinstance(f, relax.Function))


def _mean_gemm_values(func: relax.Function) -> int:
    """The weight values (N x K) a GEMM_PACKED_FUNC call of `func` multiplies, the mean over its calls
    (0 without any): what runtime/library_gemm.py scales a decode step's crossover by."""
    sizes = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and expr.op.same_as(_CALL_DPS_PACKED) \
                and expr.args[0].global_symbol == GEMM_PACKED_FUNC:
            sizes.append(math.prod(int(d) for d in expr.args[1].fields[1].ty.shape.values))

    relax.analysis.post_order_visit(func.body, visit)
    return sum(sizes) // len(sizes) if sizes else 0


def _constant_allocations(func: relax.Function) -> int:
    sizes = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and expr.op.same_as(_ALLOC_STORAGE):
            shape = expr.args[0]
            if isinstance(shape, relax.ShapeExpr) and all(isinstance(v, tirx.IntImm) for v in shape.values):
                sizes.append(math.prod(int(v) for v in shape.values))

    relax.analysis.post_order_visit(func.body, visit)
    return sum(sizes)


def _build_into(lib: Path, mod, profile: TargetProfile, dump_ir: Path | None, report: Progress) -> BuildFacts:
    """The library at `lib`, from the library cache where it holds this build (not with --dump-ir:
    the IR a dump shows is written by the build itself)."""
    reuse = LibraryCache.open() if dump_ir is None else None
    try:
        built, facts = build_lib(mod, profile, dump_ir, report, reuse=reuse)
        profile.export(built, lib)
        if reuse is not None:
            reuse.keep(lib)
    finally:
        if reuse is not None:
            reuse.close()
    return facts


class _Abandoned(Exception):
    """A background build's compile failed on its main thread: the build stops (nobody waits for it)."""


def _unless_stopped(stopped: threading.Event, report: Progress) -> Progress:
    """`report`, raising _Abandoned once `stopped` is set: a build reports each pipeline phase and its code
    generation, so an abandoned one stops at the next of them instead of running on beside later work (a test
    suite's next compiles, a notebook's next cell)."""
    def checked(*args) -> None:
        if stopped.is_set():
            raise _Abandoned("the compile this build belonged to failed")
        report(*args)
    return checked


class _Background:
    """fn(stopped) on a thread of its own, started at once, under the caller's PassContext (TVM keeps the
    current one per thread). A daemon: an interrupted compile does not wait for it to exit; `stop()` sets
    `stopped`, which fn reads to give up at its next step (_unless_stopped: the pipeline's next phase)."""

    def __init__(self, fn) -> None:
        ctx, self._done, self._value, self._error = tvm.transform.PassContext.current(), threading.Event(), None, None
        self._stopped = threading.Event()

        def run() -> None:
            try:
                with ctx:
                    self._value = fn(self._stopped)
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                self._error = e
            finally:
                self._done.set()

        # kiln/cli_info.py exit_interrupted finds it by this name
        threading.Thread(target=run, name="kiln-build", daemon=True).start()

    def stop(self) -> None:
        """Ask fn to give up (the compile it belongs to failed): it stops at its next step, its work lost."""
        self._stopped.set()

    def check(self) -> None:
        """Raise what fn raised, if it has already failed (work beside it can stop early)."""
        if self._done.is_set() and self._error is not None:
            raise self._error

    def result(self):
        self._done.wait()
        self.check()
        return self._value


def _write_params(params_dir: Path, source: ModelSource, arch, config, plan: QuantPlan,
                  named_params, report: Progress, check=lambda: None) -> list[str]:
    """Convert each weight from its HF tensors (quantized: into planes) on every core, and write them in
    order: at most one weight per core, plus the one being written, is held at once."""
    wmap = arch.weight_map(config)
    available = set(source.weights.names())
    params = {name: (tuple(int(d) for d in p.shape), p.dtype) for name, p in named_params}
    weights = plan.weight_names(list(params))
    for name in weights:                                # every problem named before any work starts
        entry = wmap.get(name)
        if entry is None:
            raise ValueError(f"{arch.name}: parameter {name} has no entry in the weight map")
        missing = [n for n in models.weight_spec(entry).hf_names if n not in available]
        if missing:
            raise models.ModelLoadError(f"{source.path} lacks tensors {missing}; the checkpoint is "
                                        f"incomplete or not a {arch.name} model")

    def convert(name: str) -> dict:
        float_shape, float_dtype = params.get(name, (None, None))    # None: a quantized weight
        return plan.convert(name, wmap[name], source, float_shape, float_dtype)

    writer = ParamWriter(params_dir)
    for i, converted in enumerate(_in_order(convert, weights, usable_cores())):
        for out_name, array in converted.items():
            if (array.shape, str(array.dtype)) != params[out_name]:
                raise ValueError(f"internal error: {out_name} converted to {array.dtype}{list(array.shape)}, "
                                 f"the module expects {params[out_name][1]}{list(params[out_name][0])}")
            writer.add(out_name, array)
        report("weights", i + 1, len(weights))
        check()
    writer.close()
    return list(params)


def _in_order(fn, items: list, workers: int):
    """fn over items on `workers` threads (numpy and the readers release the GIL), yielded in order,
    with at most `workers` results computed ahead of the consumer."""
    if workers <= 1:
        yield from map(fn, items)
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="kiln-convert")
    pending = collections.deque()
    rest = iter(items)
    try:
        for item in itertools.islice(rest, workers):
            pending.append(pool.submit(fn, item))
        while pending:
            yield pending.popleft().result()
            for item in itertools.islice(rest, 1):
                pending.append(pool.submit(fn, item))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _kv_layout(config, page_size: int, dtype: str, window_mode: str, owner: str = "tvm") -> KVCacheLayout:
    """The KV cache as the model creates it: per-layer attention kinds, the sliding window and its mode,
    whose cache it is. Its layers are the config's layer_attention() entries: a layer each, but where a layer
    keeps two kinds of memory (Falcon-H1: keys and values, and a Mamba-2 state), one a kind."""
    layers = config.layer_attention()
    layer_kv, sources = getattr(config, "kv_layers", lambda: None)() or ((), ())
    states = getattr(config, "state_layers", lambda: ())()
    tables = (OWNED_KV_TABLES + (OWNED_STATE_TABLES if any(states) else ())) if owner == "kiln" else ()
    return KVCacheLayout(page_size, len(layers), config.num_key_value_heads, config.head_dim, dtype,
                         layer_kinds=tuple(a.kind for a in layers), sliding_window=sliding_window(layers),
                         window_mode=window_mode, owner=owner, tables=tables, layer_kv=layer_kv, layer_sources=sources,
                         layer_states=states)


def _rounds_activations(config) -> bool:
    """Whether the model itself rounds activations to 8 bits (BitNet): `kiln check` allows for rounding flips."""
    return config.flags().act_quant


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
