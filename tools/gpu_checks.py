"""The CUDA issue's checks and benchmarks, in a few calls on a lent GPU machine.

Set up with tools/gpu_session.py first (`. .gpu/env.sh`). Each command prints a table and writes
DIR/<command>.json (--out, e.g. $OUT) so the figures come back with the call:

    python3 tools/gpu_checks.py numerics --out $OUT   # ~5 min: facts, the `gpu` tests, SmolLM2 numerics
    python3 tools/gpu_checks.py bench --out $OUT      # ~5 min: SmolLM2 kiln vs torch fp16, batch 1..256
    python3 tools/gpu_checks.py bench8b --out $OUT    # ~8 min: a random Llama-3-8B-architecture model, q4f16

numerics: the tiny-model CUDA tests (tests/numerics/test_cuda_variants.py, marker `gpu`), then
SmolLM2 compiled for --target with as-stored (float32 compute), q0f16 and as-stored-f16: max
|logit - transformers fp32| over 3 chat prompts (every position) against transformers fp16's
own, and greedy tokens against transformers fp16 up to the first near-tie (top-2 gap < 0.5).
The issue asks for float16 within 2x of transformers fp16's error.

bench: `kiln bench` (prompt 128, gen 128) at batch 1, 16, 64 and 256 for q4f16 and
as-stored-f16, against transformers fp16 generate() with a static cache (batch 1 also with
torch.compile), and the batch-1 floor: the artifact's weight bytes over the device-to-device
copy bandwidth torch measures.

bench8b: writes a random-init Llama-3-8B-architecture checkpoint (fp16 safetensors), compiles it
q4f16 (compile and weight-conversion time), and measures batch-1 decode against the floor (and
its slowest kernels), batch-64 decode and 16 x 128-token prefill.

`--target cpu --device cpu --quick` runs the same code on a CPU machine (a dry run: small batches,
few tokens, no torch.compile), which is how this file is tested without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2_SCHEMES = ("q4f16", "q0f16", "as-stored", "as-stored-f16")
PROMPTS = ["Name the largest planet in the solar system.", "What is the chemical symbol for gold?",
           "What is the capital of Japan?"]


def smollm2_gguf() -> Path:
    if os.environ.get("KILN_SMOLLM2_GGUF"):
        return Path(os.environ["KILN_SMOLLM2_GGUF"])
    from kiln.models.gguf import find_smollm2_gguf
    return find_smollm2_gguf()


PREBUILT = ROOT / ".gpu" / "prebuilt"

# Kernel variants to compare, on 2 layers with the 8B's shapes (`variants`). "base": what ships
# (targets/gpu.py low_batch_branches: the MMA GEMV, targets/mma_gemv.py, for the 4-bit then the
# 8-bit layers at 1, 2, 3-4, 5-8 and 9-16 rows, the 32 x 32 tensor-core tiles with K split to ~1,024
# blocks above; and the CUDA profiles' library GEMM from 40 sequences a decode step). It was the
# "candidate" of 2026-11-28's H200 run, adopted from its whole-8B rows (tools/README.md). The
# levers it left out, in the order they decide:
# "warps16": the MMA GEMV splits K between 16 warps a block where 8 ship (the 4096- and 6144-row
# projections: 256-384 blocks of 16 rows, ~16 warps an SM of 132 at 8), every layer: twice the warps,
# and the loads, in flight. At one row on the H200 the 4-bit GEMVs streamed 38-63% of the copy
# bandwidth where the 8-bit ones, the same kernel at twice the bytes a chunk, reached 59-100% at the
# same shapes (tools/README.md, H200 session): twice the bytes took only 1.2-1.3x the time.
# "unroll4": the 4-bit layers load 4 chunks a warp before their MMAs (2 ship) at 1-8 rows (nvcc
# may schedule the loads as it likes: 44 registers where unroll 2 has 48, `ptxas -v`).
# "attn64": the decode attention splits a sequence between work-groups from 64 tokens a share
# (targets/decode_attention.py MIN_SPLIT, 256 shipped): at batch 1 and 256 tokens 32 work-groups
# rather than the 8B's 8 (8 us a call, 2026-11-27).
# "nographs": the CUDA presets without the CUDA graphs: wall against busy time beside base's says what
# the graphs and the switches between a graph and the host-launched attention kernels cost (0.74 ms
# a step beyond the GPU's busy time at batch 1 on the H200).
# "stepgraph": no TVM graphs in the build, and the runner captures each decode step whole and replays
# it with one launch (runtime/step_graph.py): the host's 1.64 ms a step at batch 1 (H200) gone but a
# page table copy, a launch and the token's copy back. `all` also runs the 8B build it measures with
# step graphs (then around TVM's graphs): "batch 1 step graphs".
# "q4gemv": targets/q4_gemv.py in place of the MMA GEMV at 1-8 rows (two values dequantized per
# integer operation, the products on the CUDA cores: 5.25 SASS instructions a weight value at one row
# where the MMA GEMV issues ~2.3; the tiles from 9 rows).
# "tcgroup": the split tiles staging the 4-bit weights a group of 32 values per thread (one 128-bit
# load of its words; K in steps of 128).
# "bits": the profile's codes_by_bits (4-bit codes become float16 through their bits, no
# integer-to-float conversion: compiler/quant_modules.py code_value), every kernel.
# "dlight": the branches shipped before 2026-11-28 (dlight's GEMV at 1 row, LowBatchGEMV at 2 and
# 3-4, unsplit tiles to 64 rows): the MMA GEMV's and split K's share of base's gain.
# (Gone: "wide", a GEMV giving each lane a group of 32 values, 9-18% slower than dlight's at one row
# on the H100, 2026-11-26; "tvmattn", TVM's paged decode attention, twice kiln's time at 1-64
# sequences, 2026-11-27; "splitk", "mma", "mma8", "candidate": shipped since.)


# In the order they decide; "batches": the rows each changes (all of VARIANT_BATCHES without);
# "branches": low_batch_branches' arguments (tiles: NarrowTensorCoreMatmul's; gemv: variant_branches'
# rules by name, "none" for dlight's alone); "profile": TargetProfile fields set on the CUDA
# presets for the build; "min_split": decode_attention.MIN_SPLIT.
VARIANTS = {"base": {},
            "pdl": {"branches": {"gemv": "pdl"}, "profile": {"dependent_launch": True}},
            "loadsfirst": {"branches": {"gemv": "loadsfirst"}, "batches": (1, 2, 4, 5, 16)},
            "prefetch": {"branches": {"gemv": "prefetch"}, "batches": (1, 2, 4, 5, 16)},
            "lfpf": {"branches": {"gemv": "lfpf"}, "batches": (1, 2, 4, 5, 16)},
            "pdlpf": {"branches": {"gemv": "pdlpf"}, "profile": {"dependent_launch": True}},
            "attn64": {"min_split": 64, "batches": (1, 16)},
            "nographs": {"profile": {"cuda_graphs": False}, "batches": (1, 16)},
            "stepgraph": {"profile": {"cuda_graphs": False}, "runner": {"step_graphs": True}, "batches": (1, 2, 4)},
            "warps16": {"branches": {"gemv": "warps16"}, "batches": (1, 2, 4, 5, 16)},
            "pdl16": {"branches": {"gemv": "pdl16"}, "profile": {"dependent_launch": True}, "batches": (1, 2, 4, 5, 16)},
            "unroll4": {"branches": {"gemv": "unroll4"}, "batches": (1, 2, 4, 5)},
            "q4gemv": {"branches": {"gemv": "q4", "wide": (8,)}, "batches": (1, 2, 4, 5, 16)},
            "tcgroup": {"branches": {"tiles": {"k_frags": 8, "group_loads": True}}, "batches": (5, 16, 64)},
            "bits": {"profile": {"codes_by_bits": True}, "batches": (1, 16)},
            "dlight": {"branches": {"gemv": "none", "wide": (), "tiles": {"target_blocks": 0}},
                       "batches": (1, 2, 4, 5, 16)}}
# The build `all` measures beside base on the whole 8B, when there is one: a VARIANTS key, or None.
CANDIDATE = "pdlpf"


def _load_state(path: Path, args) -> dict:
    """What an earlier call on this machine kept at `path` (_save_state), if the same kiln sources
    (compiler fingerprint) and --quick wrote it; else {}."""
    import kiln
    state = json.loads(path.read_text()) if path.is_file() else {}
    if state.get("fingerprint") != kiln.compiler_fingerprint() or state.get("quick") != args.quick:
        return {}
    return state


def _save_state(path: Path, args, **kept) -> None:
    import kiln
    path.write_text(json.dumps({"fingerprint": kiln.compiler_fingerprint(), "quick": args.quick, **kept},
                               default=str))


def variant_branches(variant: str):
    """VARIANTS[variant]'s row branches as LowBatchGEMV takes them, or None for the shipped ones."""
    spec = VARIANTS[variant].get("branches")
    if spec is None:
        return None
    from kiln.targets.gpu import SPLIT_BLOCKS, low_batch_branches
    from kiln.targets.narrow_tiles import NarrowTensorCoreMatmul
    from kiln.targets.q4_gemv import Q4GEMV
    from kiln.targets.mma_gemv import MMAGEMV
    # The MMA GEMV (4-bit, then 8-bit layers) with these arguments.
    mma = {"warps16": {"most_warps": 16}, "pdl": {"pdl": True}, "pdl16": {"most_warps": 16, "pdl": True},
           "prefetch": {"ahead": 1}, "loadsfirst": {"loads_first": True}, "lfpf": {"loads_first": True, "ahead": 1},
           "pdlpf": {"pdl": True, "ahead": 1}}
    name = spec.get("gemv")
    gemv = (lambda b: [MMAGEMV(bits, batch=b, **mma[name]) for bits in (4, 8)]) if name in mma else {
        "q4": lambda b: [Q4GEMV(batch=b)], "none": lambda b: [], None: None,
        "unroll4": lambda b: [MMAGEMV(4, unroll=4 if b <= 8 else 2, batch=b), MMAGEMV(8, batch=b)]}[name]
    tiles = NarrowTensorCoreMatmul(**{"warp_rows": 2, "warp_cols": 2, "target_blocks": SPLIT_BLOCKS,
                                      **spec.get("tiles", {})})
    return low_batch_branches(gemv, spec.get("wide", (8, 16)), tiles)


@contextlib.contextmanager
def built_with(variant: str):
    """Within: targets/gpu.py builds the GPU matmuls with VARIANTS[variant]'s branches, and the CUDA
    presets' profiles carry its "profile" fields."""
    import dataclasses

    from kiln import targets
    from kiln.targets import decode_attention, gpu
    shipped, profiles, min_split = gpu.LOW_BATCH_BRANCHES, dict(targets._PROFILES), decode_attention.MIN_SPLIT
    gpu.LOW_BATCH_BRANCHES = variant_branches(variant) or shipped
    decode_attention.MIN_SPLIT = VARIANTS[variant].get("min_split", min_split)
    fields = VARIANTS[variant].get("profile")
    if fields:
        for name, make in profiles.items():
            if name.startswith("cuda"):
                targets._PROFILES[name] = lambda make=make: dataclasses.replace(make(), **fields)
    try:
        yield
    finally:
        gpu.LOW_BATCH_BRANCHES, decode_attention.MIN_SPLIT = shipped, min_split
        targets._PROFILES.clear()
        targets._PROFILES.update(profiles)


VARIANT_BATCHES = (1, 2, 4, 5, 16, 64)    # 5: the tiles' first row count (a partial tile)


def _prebuilt_name(src: Path, quant: str, target: str, max_batch_size: int | None, variant: str = "base") -> str:
    """The file name of a library built here for (model, scheme, target, batch bound, compiler)."""
    import kiln
    from kiln.targets import get_profile
    batch = max_batch_size or get_profile(target).max_batch_size
    model = f"{src.stat().st_size}b" if src.is_file() else src.name      # the GGUF's name differs there
    tail = "" if variant == "base" else f"-{variant}"
    return f"{model}-{quant}-{target}-b{batch}-{kiln.compiler_fingerprint()}{tail}"


class _Prebuilt:
    """Stands in for relax.build's executable: its export copies a library built on another machine."""

    def __init__(self, lib: Path) -> None:
        self.lib = lib

    def export_library(self, path: str, **_kw) -> None:
        shutil.copyfile(self.lib, path)


def compile_timed(src: Path, quant: str, args, variant: str = "base", **kw) -> tuple[Path, float]:
    """kiln.compile into --work; returns (artifact, seconds). Where `prebuild` left this compile's
    library in .gpu/prebuilt (same model, scheme, target, batch bound and kiln sources), TVM's build
    is skipped and the seconds are those of the weight conversion alone. `variant`: a VARIANTS key,
    the GPU matmuls' row-count branches to build with."""
    import kiln
    from kiln.compiler import build
    out = Path(args.work) / (f"{src.stem}-{quant}-{args.target}" + ("" if variant == "base" else f"-{variant}"))
    name = _prebuilt_name(src, quant, args.target, kw.get("max_batch_size"), variant)
    packed, facts, lib = PREBUILT / f"{name}.so.xz", PREBUILT / f"{name}.json", Path(args.work) / f"{name}.so"
    real = build.build_lib
    if packed.is_file() and facts.is_file():
        lib.write_bytes(lzma.decompress(packed.read_bytes()))
        build.build_lib = lambda *_a, **_k: (_Prebuilt(lib), build.BuildFacts(**json.loads(facts.read_text())))
        print(f"{src.stem} {quant}: the library built beforehand ({lib.name}); converting the weights", flush=True)
    t = time.perf_counter()
    try:
        with built_with(variant):
            art = kiln.compile(str(src), target=args.target, quant=quant, output=out, golden=False, force=True, **kw)
    finally:
        build.build_lib = real
    return art, time.perf_counter() - t




def prebuild(args) -> dict:
    """Here, before a GPU session: build into .gpu/prebuilt the libraries the device would otherwise
    compile: SmolLM2 for every scheme the checks use, the 8B model (max batch 256) and the 2-layer
    8B-shaped model for every VARIANTS entry (both from shapes-only checkpoints: the library does not
    depend on the weights), so the device spends its minutes converting weights, not compiling."""
    import tempfile

    from kiln.compiler import CompileOptions
    from kiln.compiler.build import build_lib, export_model
    PREBUILT.mkdir(parents=True, exist_ok=True)
    done, shapes = {}, Path(tempfile.mkdtemp(prefix="kiln-shapes-"))
    jobs = [(smollm2_gguf(), quant, "base", None) for quant in SMOLLM2_SCHEMES]
    name, config = llama8b_config(args)
    full = shapes_only_checkpoint(shapes / name, config)
    jobs += [(full, "q4f16", v, 256) for v in (CANDIDATE, "base") if v]
    name, config = llama8b_config(args, layers=VARIANT_LAYERS)
    two = shapes_only_checkpoint(shapes / name, config)
    jobs += [(two, "q4f16", v, None) for v in VARIANTS]
    try:
        for src, quant, variant, max_batch in jobs:
            t = time.perf_counter()
            with built_with(variant):          # export too: codes_by_bits shapes the dequantize ops
                ex = export_model(CompileOptions(model=str(src), target=args.target, quant=quant,
                                                 max_batch_size=max_batch), lambda *_: None)
                lib, facts = build_lib(ex.mod, ex.profile)
            key = _prebuilt_name(src, quant, args.target, max_batch, variant)
            ex.profile.export(lib, shapes / "lib")
            (PREBUILT / f"{key}.so.xz").write_bytes(lzma.compress((shapes / "lib").read_bytes()))
            (PREBUILT / f"{key}.json").write_text(json.dumps(dataclasses.asdict(facts)))
            done[key] = round(time.perf_counter() - t, 1)
            print(f"{src.name} {quant} {variant}: built in {done[key]:.0f} s -> {key}.so.xz", flush=True)
    finally:
        shutil.rmtree(shapes, ignore_errors=True)
    return done


def transformers_model(src: Path, dtype, device: str):
    import torch
    import transformers
    kw = {"gguf_file": src.name} if src.suffix == ".gguf" else {}
    root = str(src.parent if src.suffix == ".gguf" else src)
    # A GGUF is dequantized to float32 first; a checkpoint loads in `dtype` (an 8B one in float32 is 32 GB).
    model = transformers.AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32 if kw else dtype, **kw)
    return model.to(device=device, dtype=dtype).eval()


def facts(args) -> dict:
    import torch
    import tvm
    from importlib.metadata import version

    from kiln.targets.gpu import tensorize_works
    out = {"tvm": tvm.__version__, "tvm_ffi": version("apache-tvm-ffi"), "torch": torch.__version__,
           "transformers": version("transformers"),
           "python": sys.version.split()[0], "tensor_cores": tensorize_works()}
    if args.device == "cuda":
        dev = tvm.cuda(0)
        out.update(gpu=torch.cuda.get_device_name(0), compute=dev.compute_version if dev.exist else None)
        out["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
    return out


# ----------------------------------------------------------------------------- numerics

GPU_TESTS = "tests/numerics/test_cuda_variants.py"
GPU_TESTS_S = 100           # `all`'s seconds for the gpu tests (each builds its kernels: ~15-20 s a test)
# Processes the gpu tests run in where pytest-xdist is there (gpu_session.py stages it): their time
# is mostly TVM's single-threaded builds of tiny models (2026-11-28, one process: 5 of 30 tests in 100 s).
GPU_TEST_WORKERS = 6
VARIANTS_FIRST_S = 200      # `all`'s seconds for `variants` before the serving rows (~20 s a variant)
# The `gpu` tests, those that decide what ships first (the candidate's: dependent launch against the
# plain build; then the kernels against numpy: MMA GEMV, split-K tiles, the library GEMM prefill;
# then the attention kernels, Gemma 2), the slow whole-preset comparisons (a compile of each CUDA
# preset) and the other families last: a run cut short has the first.
GPU_TEST_ORDER = ("step_graphs", "dependent_launch", "mma_gemv", "tensor_core_matmul", "library_gemm", "decode_attention_kernel",
                  "prefill_attention_kernel", "gemma2", "q4_gemv", "sample_tokens", "speculative", "row_branches",
                  "preset_matches", "family_matches")


def gpu_tests(args, seconds: float | None = None) -> dict:
    """The `gpu`-marked tiny-model tests (GPU_TESTS), in GPU_TEST_ORDER, within `seconds`; the log
    goes to --out."""
    # -P: the checkout's kiln/ must not shadow the package laid out in .gpu/site (gpu_session.py).
    pytest = [sys.executable, "-P", "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider"]
    listed = subprocess.run([*pytest, "--co", "-q", GPU_TESTS], cwd=ROOT, capture_output=True, text=True).stdout
    ids = [line.strip() for line in listed.splitlines() if line.startswith(GPU_TESTS + "::")]
    rank = lambda i: next((n for n, key in enumerate(GPU_TEST_ORDER) if key in i), len(GPU_TEST_ORDER))  # noqa: E731
    ids = sorted(ids, key=rank) or [GPU_TESTS]
    import importlib.util
    workers = min(GPU_TEST_WORKERS, max(1, (os.cpu_count() or 1) - 2))
    parallel = ["-n", str(workers)] if workers > 1 and importlib.util.find_spec("xdist") is not None else []
    log = Path(args.out) / "gpu_tests.log"
    with log.open("w") as f:
        # A session of its own: at the time limit its workers go too, not on beside the next steps' timings.
        proc = subprocess.Popen([*pytest, "-q", *parallel, *ids], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = f"timed out after {seconds:.0f} s"
    return {"rc": rc, "tests": len(ids), "processes": int(parallel[1]) if parallel else 1,
            "tail": log.read_text().strip().splitlines()[-1:]}


def references(src: Path, args) -> tuple:
    """transformers fp32 and fp16 on --device: the reference and the error the issue allows twice of."""
    import torch
    return transformers_model(src, torch.float32, args.device), transformers_model(src, torch.float16, args.device)


def scheme_numerics(src: Path, quant: str, refs: tuple, args, compiled: dict | None = None) -> dict:
    """One scheme's max |logit - transformers fp32| over PROMPTS (every position) beside transformers
    fp16's own, and its greedy agreement with transformers fp16 up to the first near-tie.
    `compiled`: {"artifact", "compile_s"} of a compile already done."""
    import torch

    from kiln import Engine, EngineConfig
    from kiln.runtime import Artifact
    from kiln.runtime.model_runner import ModelRunner
    ref32, ref16 = refs

    def last(model, seq):
        with torch.no_grad():
            return model(torch.tensor([seq], device=args.device)).logits[0].float().cpu().numpy()

    if compiled and "artifact" in compiled:
        art, seconds = Path(compiled["artifact"]), compiled["compile_s"]
    else:
        art, seconds = compile_timed(src, quant, args)
    engine, rows = Engine(art, EngineConfig(max_num_seqs=1)), []      # its chat template only
    for prompt in PROMPTS:
        ids = engine.render_chat([{"role": "user", "content": prompt}])
        runner = ModelRunner(Artifact.load(art), max_num_seqs=1)
        runner.add_sequence(0)
        got = runner.verify(0, ids)
        f32, f16 = last(ref32, ids), last(ref16, ids)
        seq, logits, agreed = list(ids), got[-1], 0
        for _ in range(args.greedy):
            expected = last(ref16, seq)[-1]
            top2 = np.sort(expected)[-2:]
            if top2[1] - top2[0] < 0.5 or int(np.argmax(logits)) != int(np.argmax(expected)):
                break
            agreed += 1
            seq.append(int(np.argmax(expected)))
            logits = runner.decode([0], [seq[-1]])[0]
        rows.append({"error_vs_fp32": float(np.abs(got - f32).max()),
                     "last_position_error": float(np.abs(got[-1] - f32[-1]).max()),
                     "transformers_fp16_error": float(np.abs(f16 - f32).max()), "greedy_agreed": agreed})
    worst = max(r["error_vs_fp32"] for r in rows)
    allowed = 2 * max(r["transformers_fp16_error"] for r in rows)
    return {"compile_s": round(seconds, 1), "max_error": worst, "within_2x_fp16": worst <= allowed, "prompts": rows}


def numerics(args) -> dict:
    result = {"facts": facts(args)}
    if not args.quick:
        result["gpu_tests"] = gpu_tests(args)
        print("gpu tests:", result["gpu_tests"], flush=True)
    src = smollm2_gguf()
    refs = references(src, args)
    for quant in ("as-stored", "q0f16", "as-stored-f16"):
        result[quant] = scheme_numerics(src, quant, refs, args)
        print(quant, json.dumps(result[quant]), flush=True)
    return result


# ----------------------------------------------------------------------------- benchmarks

def copy_bandwidth_gbs(device: str) -> float:
    """Bytes read plus written per second by a large device-to-device copy (torch)."""
    import torch
    n = (1 << 30) if device == "cuda" else (1 << 26)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    sync()
    return 2 * n * 10 / (time.perf_counter() - t) / 1e9


def weight_bytes(art: Path) -> int:
    return sum(f.stat().st_size for f in (art / "params").glob("*") if f.suffix != ".json")


def _runner(art: Path, batch: int, args, **options):
    """A runner for `batch` sequences of the benchmark's lengths; options: ModelRunner's (step_graphs)."""
    from kiln.runtime import Artifact
    from kiln.runtime.bench import kv_tokens_needed
    from kiln.runtime.memory_budget import default_kv_tokens
    from kiln.runtime.model_runner import ModelRunner
    artifact = Artifact.load(art)
    kv = kv_tokens_needed(artifact.config.kv_cache.page_size, args.prompt_len, args.gen_len, batch)
    return ModelRunner(artifact, max_num_seqs=batch, max_total_tokens=max(kv, default_kv_tokens(artifact, batch)),
                       **options)


def step_graph_rows(runner, art: Path, args) -> dict:
    """`runner` at batch 1 with its decode steps replayed as whole CUDA graphs (runtime/step_graph.py),
    then as it was: the bench row, the kernels' and the host's time a step, and the graphs' counts
    (a capture that failed turns them off: "off" says why)."""
    from kiln.runtime.step_graph import StepGraphs
    try:
        runner.graphs = StepGraphs(runner.device)
    except Exception as e:                     # noqa: BLE001 - a row that says why, the rows after it kept
        return {"error": f"{type(e).__name__}: {e}"}
    ids: list[int] = []
    try:
        row = kiln_bench(art, 1, args, runner)
        ids = _prefill(runner, 1, args)
        times = gpu_kernel_times(runner, ids)
        row.update({k: times[k] for k in ("wall_ms", "busy_ms", "host_enqueue_ms", "host_wait_ms")})
        row["covered_ms"] = times["idle"]["covered_ms"]
        row["graphs"] = runner.graphs.stats()
        return row
    except Exception as e:                     # noqa: BLE001 - as above
        return {"error": f"{type(e).__name__}: {e}", "graphs": runner.graphs.stats()}
    finally:
        graphs, runner.graphs = runner.graphs, None
        for i in ids:
            runner.remove_sequence(i)
        with contextlib.suppress(Exception):
            graphs.close()


def kiln_bench(art: Path, batch: int, args, runner=None) -> dict:
    """`kiln bench` at `batch` sequences (on `runner` if given: one loaded for at least that many)."""
    from kiln.runtime.bench import bench
    r = bench(runner or _runner(art, batch, args), prompt_len=args.prompt_len, gen_len=args.gen_len, batch=batch,
              runs=args.runs)
    return {"prefill_tok_s": round(r.prefill_tok_s), "decode_tok_s": round(r.decode_tok_s, 1),
            "tpot_ms": round(r.tpot_ms, 3)}


def kernel_profile(art: Path, batch: int, args, top: int = 12) -> dict:
    """Where a decode step's time goes (`kiln bench --profile`): the slowest kernels, ms per step."""
    from kiln.runtime.bench import profile_kernels
    p = profile_kernels(_runner(art, batch, args), prompt_len=args.prompt_len, gen_len=min(args.gen_len, 16),
                        batch=batch).decode
    return {"wall_ms": round(p.wall_ms, 3), "wall_ms_uninstrumented": round(p.wall_ms_uninstrumented, 3),
            "calls_per_step": p.calls_per_step, "outside_ms": round(p.outside_ms, 3),
            "kernels": [(k.name, round(k.ms_per_step, 4), round(k.calls_per_step, 1)) for k in p.kernels[:top]]}


def _prefilled(art: Path, batch: int, args):
    """A runner for `batch` sequences, each holding a --prompt-len prompt; (runner, sequence ids)."""
    runner = _runner(art, batch, args)
    return runner, _prefill(runner, batch, args)


def _prefill(runner, batch: int, args) -> list[int]:
    """Sequences 0 .. batch-1 added to `runner`, each holding a --prompt-len prompt; their ids."""
    ids = list(range(batch))
    for i in ids:
        runner.add_sequence(i)
    runner.prefill(ids, _prompts(ids, args))
    return ids


def _step_ms(runner, ids: list[int], steps: int = 8) -> float:
    """Wall ms per greedy decode step of sequences `ids` (where no CUPTI is at hand)."""
    tokens = runner.decode_greedy(ids, [5] * len(ids))
    t = time.perf_counter()
    for _ in range(steps):
        tokens = runner.decode_greedy(ids, [int(x) for x in tokens])
    return round((time.perf_counter() - t) / steps * 1e3, 3)


def _prompts(ids: list[int], args) -> list[list[int]]:
    """A --prompt-len prompt for each sequence, each its own tokens."""
    return [list(range(3 + i, 3 + i + args.prompt_len)) for i in ids]


def gpu_kernel_times(runner, ids: list[int], steps: int = 16, top: int = 14) -> dict:
    """GPU time per greedy decode step of sequences `ids` (a runner from _prefilled), kernel by
    kernel, as CUPTI records it (torch.profiler sees every kernel in the process, TVM's inside CUDA
    graphs included), against the step's wall time: busy_ms well under wall_ms means the host, not
    the GPU, sets the pace."""
    tokens = [5] * len(ids)

    def step() -> None:
        nonlocal tokens
        tokens = [int(t) for t in runner.decode_greedy(ids, tokens)]

    for _ in range(4):                                     # warm-up: CUDA graphs captured
        step()
    return {**_cupti_times(step, steps, top), **host_enqueue(runner, ids, tokens, steps)}


def host_enqueue(runner, ids: list[int], tokens: list[int], steps: int = 16) -> dict:
    """A greedy decode step split at the token's copy back (ModelRunner.decode_greedy's own calls):
    the host's ms until the step's last kernel is queued, then its ms waiting for the GPU (median
    of `steps`). A step whose enqueue time nears the GPU's busy time is the host's to shorten;
    waiting most of the step, the GPU's. `host_calls_ms`: the enqueue's host ms in each call the
    runner makes (the ids staged and embedded, the KV cache's begin and end, the decode entry, the
    argmax), medians: which of them sits between the last step's token and this step's first layer
    (the GPU's idle time before layer 0's norm)."""
    import statistics

    from kiln.runtime import model_runner
    spent: dict[str, float] = {}

    def timed(name: str, fn):
        def call(*a):
            t = time.perf_counter()
            try:
                return fn(*a)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return call

    kv, fns = dict(model_runner._KV), dict(runner._fn)
    model_runner._KV.update({k: timed(k.removeprefix("kv_state_"), f) for k, f in kv.items()
                             if k in ("kv_state_begin_forward", "kv_state_end_forward")})
    runner._fn.update({k: timed(k, f) for k, f in fns.items()})
    enqueue, wait, calls = [], [], {}
    try:
        for _ in range(steps):
            spent.clear()
            t0 = time.perf_counter()
            picked = runner._decode(ids, tokens, "greedy")[1]
            t1 = time.perf_counter()
            tokens = [int(t) for t in picked.numpy()]
            enqueue.append(t1 - t0)
            wait.append(time.perf_counter() - t1)
            for k, v in spent.items():
                calls.setdefault(k, []).append(v)
    finally:
        model_runner._KV.update(kv)
        runner._fn.clear()
        runner._fn.update(fns)
    return {"host_enqueue_ms": round(statistics.median(enqueue) * 1e3, 3),
            "host_wait_ms": round(statistics.median(wait) * 1e3, 3),
            "host_calls_ms": {k: round(statistics.median(v) * 1e3, 3) for k, v in calls.items()}}


def prefill_kernel_times(art: Path, batch: int, args, runner=None, steps: int = 4, top: int = 14) -> dict:
    """The same for a prefill of `batch` sequences of --prompt-len tokens (each step adds the
    sequences, prefills them and drops them): which kernels the issue's 16 x 128 prefill spends."""
    runner = runner or _runner(art, batch, args)
    ids = list(range(batch))
    prompts = _prompts(ids, args)

    def step() -> None:
        for i in ids:
            runner.add_sequence(i)
        runner.prefill(ids, prompts)
        for i in ids:
            runner.remove_sequence(i)

    step()
    return _cupti_times(step, steps, top)


def _cupti_times(step, steps: int, top: int) -> dict:
    """step() `steps` times under torch.profiler (CUPTI): wall and GPU-busy ms a step, the matmul and
    decode attention kernels' share, and the `top` kernels (name, ms a step, calls a step)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / steps
    rows = [(e.key, e.device_time_total / steps / 1e3, e.count / steps) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start]
    return {"wall_ms": round(wall * 1e3, 3), "busy_ms": round(sum(r[1] for r in rows), 3),
            "matmul_ms": round(sum(r[1] for r in rows if "matmul" in r[0] or "gemm" in r[0].lower()), 3),
            "attention_ms": round(sum(r[1] for r in rows if "batch_decode_paged_kv" in r[0]), 3),
            "kernels": [(name[:90], round(ms, 4), round(calls, 1)) for name, ms, calls in rows[:top]],
            "idle": idle_gaps(kernels, steps, top=6)}


def idle_gaps(kernels: list[tuple[str, float, float]], steps: int, min_us: float = 2.0, top: int = 6) -> dict:
    """Where the GPU waits for the host: over the (name, start us, end us) of every GPU activity,
    the idle time between one ending and the next starting (gaps under `min_us` are launch
    spacing, counted apart), a step's share, grouped by the kernel the gap precedes. A gap before
    the step's first kernel (the embedding) is the host between steps (token copied back, the next
    step prepared); gaps before the attention kernels are the host launching what the CUDA graphs
    leave out. `covered_ms`: a step's time with at least one activity on the GPU (overlaps counted
    once): the busy time where kernels overlap (programmatic dependent launch: a kernel's time then
    includes its wait for the one before, so busy_ms, their sum, counts that twice)."""
    idle, small, by_next, end, covered = 0.0, 0.0, {}, None, 0.0
    for name, start, stop in sorted(kernels, key=lambda k: k[1]):
        covered += max(0.0, stop - max(start, end if end is not None else start))
        if end is not None and start > end:
            gap = start - end
            if gap < min_us:
                small += gap
            else:
                idle += gap
                total, count = by_next.get(name, (0.0, 0))
                by_next[name] = (total + gap, count + 1)
        end = stop if end is None else max(end, stop)
    worst = sorted(by_next.items(), key=lambda kv: -kv[1][0])[:top]
    return {"idle_ms": round(idle / steps / 1e3, 3), "launch_spacing_ms": round(small / steps / 1e3, 3),
            "covered_ms": round(covered / steps / 1e3, 3), "activities_per_step": round(len(kernels) / steps, 1),
            "before": [(name[:90], round(total / steps / 1e3, 4), round(count / steps, 1))
                       for name, (total, count) in worst]}


def variants(args, deadline: float | None = None) -> dict:
    """The GPU matmuls' row-count branches (VARIANTS) side by side on the 2-layer 8B-shaped model, the
    same weights in each: per decode step at VARIANT_BATCHES sequences, the GPU time of the matmul
    kernels, the busy and wall time (CUPTI; on a CPU the step time), and the largest logit
    difference from `base` (a wrong schedule shows here, not only in the timing). variants.json is
    rewritten after each variant (a run cut short keeps the ones done); by default within --budget.
    The variants measured (and base's logits) are kept in --work: run again on the same machine, it
    measures only the others."""
    import gc
    if deadline is None:
        deadline = time.monotonic() + args.budget
    src, _ = llama8b_checkpoint(args, layers=VARIANT_LAYERS)
    batches = (1, 2) if args.quick else VARIANT_BATCHES
    kept, logits_file = Path(args.work) / "variants-state.json", Path(args.work) / "variants-base-logits.npz"
    result = {v: rows for v, rows in _load_state(kept, args).get("variants", {}).items() if "skipped" not in rows}
    reference = {int(k): v for k, v in np.load(logits_file).items()} if result and logits_file.is_file() else {}
    for variant, spec in VARIANTS.items():
        if variant in result and (reference or variant != "base"):
            print(variant, "measured by an earlier call", flush=True)
            continue
        if deadline is not None and time.monotonic() > deadline - 45:
            result[variant] = {"skipped": "out of time"}
            continue
        art, seconds = compile_timed(src, "q4f16", args, variant)
        rows = {"compile_s": round(seconds, 1)}
        wanted = batches if args.quick else spec.get("batches", batches)
        options = spec.get("runner", {}) if args.device == "cuda" else {}      # step graphs: CUDA's
        runner = _runner(art, max(wanted), args, **options)   # one per variant: loading it cost more than a row
        for b in (b for b in batches if b in wanted):
            t = time.perf_counter()
            ids = _prefill(runner, b, args)
            logits = runner.decode(ids, [5] * b)
            if variant == "base":
                reference[b] = logits
            row = {"max_diff_vs_base": float(np.abs(logits - reference[b]).max()) if b in reference else None}
            if args.device == "cuda":
                times = gpu_kernel_times(runner, ids, top=4)
                row.update({k: times[k] for k in ("wall_ms", "busy_ms", "matmul_ms", "attention_ms", "kernels")})
                row["covered_ms"] = times["idle"]["covered_ms"]
            else:
                row["tpot_ms"] = _step_ms(runner, ids)
            for i in ids:
                runner.remove_sequence(i)
            row["row_s"] = round(time.perf_counter() - t, 1)
            rows[f"batch {b}"] = row
            print(variant, f"batch {b}", json.dumps(row), flush=True)
        del runner
        gc.collect()
        result[variant] = rows
        shutil.rmtree(art, ignore_errors=True)
        if variant == "base":
            np.savez(logits_file, **{str(b): v for b, v in reference.items()})
        (Path(args.out) / "variants.json").write_text(json.dumps(result, indent=1, default=str))
        _save_state(kept, args, variants=result)
    return result


def sampled_decode(art: Path, batch: int, args) -> dict:
    """ms per sampled decode step (temperature 0.7, top-p 0.9, top-k 50) at `batch` sequences: the
    logits copied back to the host Sampler, against sample_tokens drawing on the device
    (models/sampling.py), and how often the two paths' tokens agree on the same logits."""
    from types import SimpleNamespace

    import tvm

    from kiln.runtime import SamplingParams
    from kiln.runtime.sampler import Sampler, device_params
    sys.path.insert(0, str(ROOT / "tests"))
    from sampling_cases import host_tokens                  # the host Sampler's token for a params row
    runner, ids = _prefilled(art, batch, args)
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=50)
    steps = max(2, min(16, args.gen_len // 2))
    sampler, result = Sampler(), {}
    for path in ("host", "device"):
        reqs = [SimpleNamespace(params=params, rng=np.random.default_rng(i), grammar=None, prompt_ids=[],
                                output_ids=[]) for i in ids]
        tokens = [5] * batch
        for n in range(steps + 2):                          # two warm-up steps
            if n == 2:
                runner.device.sync()
                t = time.perf_counter()
            if path == "host":
                tokens = sampler.sample(runner.decode(ids, tokens), sampler.prepare(reqs)).tokens
            else:
                tokens = [int(x) for x in runner.decode_sampled(ids, tokens, device_params(reqs))]
        result[f"{path}_ms"] = round((time.perf_counter() - t) / steps * 1e3, 3)
    logits_dev = runner._decode(ids, tokens)[0]
    rows = device_params([SimpleNamespace(params=params, rng=np.random.default_rng(i)) for i in ids])
    on_device = runner._fn["sample_tokens"](logits_dev, tvm.runtime.tensor(rows, runner.device)).numpy()
    host = host_tokens(logits_dev.numpy(), rows)
    result["same_token_rows"] = f"{int(np.sum(on_device == host))}/{batch}"
    return result


def torch_bench(model, batch: int, args) -> dict:
    """transformers generate() with a static cache: decode tok/s from (G tokens - 1 token) time.

    On CUDA, transformers (5.x, generation/utils.py `_valid_auto_compile_criteria`) compiles the
    decoding forward with torch.compile by itself when the cache is static, so these are the
    "static cache + torch.compile" figures; wrapping forward in torch.compile once more made
    generate() fail ("accessing tensor output of CUDAGraphs that has been overwritten", H100)."""
    import torch
    ids = torch.randint(0, model.config.vocab_size, (batch, args.prompt_len), device=args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    def run(n: int) -> float:
        sync()
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, cache_implementation="static")
        sync()
        return time.perf_counter() - t

    run(args.gen_len)                                       # warm-up (and compile)
    one = min(run(1) for _ in range(args.runs))
    full = min(run(args.gen_len) for _ in range(args.runs))
    return {"prefill_tok_s": round(batch * args.prompt_len / one),
            "decode_tok_s": round(batch * (args.gen_len - 1) / (full - one), 1)}


def bench_cmd(args) -> dict:
    import torch
    src = smollm2_gguf()
    bw = copy_bandwidth_gbs(args.device)
    result = {"facts": facts(args), "copy_bandwidth_gbs": round(bw)}
    batches = [1, 4] if args.quick else [1, 16, 64, 256]
    arts = {}
    for quant in ("q4f16", "as-stored-f16"):
        art, seconds = arts[quant] = compile_timed(src, quant, args, max_batch_size=max(batches))
        floor = bw * 1e9 / weight_bytes(art)
        rows = {b: kiln_bench(art, b, args) for b in batches}
        result[f"kiln {quant}"] = {"compile_s": round(seconds, 1), "batch1_floor_tok_s": round(floor),
                                   "batch1_pct_of_floor": round(100 * rows[1]["decode_tok_s"] / floor, 1),
                                   **{f"batch {b}": r for b, r in rows.items()}}
        print(quant, json.dumps(result[f"kiln {quant}"]), flush=True)
    if args.device == "cuda":               # overhead-bound at this size: what a step as one launch gives
        q4 = arts["q4f16"][0]
        result["kiln q4f16 step graphs"] = {"batch 1": step_graph_rows(_runner(q4, 1, args), q4, args)}
        print("step graphs", json.dumps(result["kiln q4f16 step graphs"]), flush=True)
    result["sampled decode"] = {f"batch {b}": sampled_decode(arts["q4f16"][0], b, args)
                                for b in dict.fromkeys((batches[0], *batches[-2:]))}
    print("sampled decode", json.dumps(result["sampled decode"]), flush=True)
    result["serving limits"] = serving_limits(art)
    print("serving limits", json.dumps(result["serving limits"]), flush=True)
    model = transformers_model(src, torch.float16, args.device)
    result["torch fp16 static"] = {f"batch {b}": torch_bench(model, b, args) for b in batches[:3]}
    print("torch", json.dumps(result["torch fp16 static"]), flush=True)
    return result


def served(art: Path, streams: list[int], args) -> dict:
    """`kiln serve` on the artifact under each count of streamed completions: tokens a second once
    all are decoding (beside `kiln bench`'s decode rows), the server's host CPU a token (event loop;
    the engine and the rest) and the device's wait between forwards (host_gap_us_per_forward);
    then at the fewest and the most streams with `--overlap off` (what the overlapped step wins) and
    with `--engine-process off` (what the engine's own process wins), and at the most with
    `--stream-interval 4` (what the event loop's chunks cost) and `--api-processes 2` (whether one HTTP
    process's Python bounds the rate)."""
    sys.path.insert(0, str(ROOT / "tools"))         # -P (the checks' own processes) leaves it out
    from serve_load import serve_and_load
    gen_len = 32 if args.quick else 128
    on = ("--overlap", "on", "--engine-process", "on")

    def rows(counts: list[int], *flags: str) -> list[dict]:
        return serve_and_load(str(art), counts, gen_len=gen_len, start_timeout=180, extra=flags)["rows"]
    result = serve_and_load(str(art), streams, gen_len=gen_len, start_timeout=180, extra=on)
    ends = list(dict.fromkeys((streams[0], streams[-1])))
    result["overlap off"] = rows(ends, "--overlap", "off", "--engine-process", "on")
    result["engine thread"] = rows(ends, "--overlap", "on", "--engine-process", "off")
    result["stream interval 4"] = rows(streams[-1:], *on, "--stream-interval", "4")
    result["2 HTTP processes"] = rows(streams[-1:], *on, "--api-processes", "2")
    return result


def speculative(art: Path, args) -> dict:
    """Speculative decoding by prompt lookup against plain decoding, task by task
    (tools/bench_speculative.py): whether a batch_verify forward of k + 1 tokens costs about one decode
    step on the GPU (on a CPU it costs 1.4x at 2 tokens and 2.3x at 6), i.e. which K to recommend."""
    sys.path.insert(0, str(ROOT / "tools"))         # -P (the checks' own processes) leaves it out
    from bench_speculative import measure
    return measure(str(art), [3, 5], rounds=1 if args.quick else 2, max_tokens=32 if args.quick else 128)


def draft_model(art: Path, draft: Path, args) -> dict:
    """Speculative decoding with a draft model against plain decoding (tools/bench_speculative.py):
    SmolLM2 q0f16 served, its q4f16 build drafting (the same tokenizer). Both are overhead-bound on a
    GPU at this size, so the row says what a draft step costs beside a checking forward, and how many
    drafted tokens a 4-bit copy of the model gets kept; an 8B's gain follows from its step time."""
    sys.path.insert(0, str(ROOT / "tools"))
    from bench_speculative import measure
    return measure(str(art), [], rounds=1 if args.quick else 2, max_tokens=32 if args.quick else 128,
                   draft_model=str(draft), draft_tokens=[2, 4])


def serving_limits(art: Path) -> dict:
    """What an engine (`kiln serve`) takes from the machine by default, and its one-line refusal of
    more sequences than the artifact was compiled for."""
    import gc

    from kiln.runtime import Engine, EngineConfig
    engine = Engine(art)
    runner, layout = engine.runner, engine.artifact.config.kv_cache
    result = {"max_num_seqs": runner.max_num_seqs, "kv_tokens": runner.max_total_tokens,
              "kv_gib": round(runner.max_total_tokens * layout.bytes_per_token / 2**30, 2),
              "activation_gib": round(engine.artifact.config.activation_bytes / 2**30, 3)}
    over = runner.max_batch_size + 1
    del engine, runner
    gc.collect()
    try:
        Engine(art, EngineConfig(max_num_seqs=over))
        result["over_limit"] = "accepted (a defect)"
    except ValueError as e:
        result["over_limit"] = str(e)
    return result


LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256)


VARIANT_LAYERS = 2                   # the 8B's layer shapes, 2 of them (and a 32000 vocabulary): variants


def llama8b_config(args, layers: int | None = None):
    """The Llama-3-8B architecture (tiny with --quick); `layers`: that many of its layers and a
    32000-token vocabulary (the same matmul shapes, a fraction of the weights). Returns (name, config)."""
    import transformers
    size = LLAMA3_8B if not args.quick else dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=1024)
    name = "llama3-8b-arch"
    if layers:
        size = {**size, "num_hidden_layers": layers, "vocab_size": min(size["vocab_size"], 32000)}
        name = f"llama3-8b-arch-{layers}layers"
    return name, transformers.LlamaConfig(**size, max_position_embeddings=8192, rope_theta=500000.0,
                                          tie_word_embeddings=False)


def llama8b_checkpoint(args, layers: int | None = None) -> tuple[Path, float]:
    """A random-init checkpoint of llama8b_config (fp16 safetensors) in --work, written once,
    initialised on --device."""
    import torch
    import transformers
    name, config = llama8b_config(args, layers)
    src, t = Path(args.work) / name, time.perf_counter()
    if not (src / "config.json").is_file():
        torch.set_default_dtype(torch.float16)
        with torch.device(args.device):
            model = transformers.LlamaForCausalLM(config)
        torch.set_default_dtype(torch.float32)
        model.save_pretrained(src)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        _tokenizer_for(src, config.vocab_size)
    return src, time.perf_counter() - t


def shapes_only_checkpoint(dest: Path, config) -> Path:
    """A checkpoint of `config` whose one safetensors file has the real header but no data (a sparse
    file of the right size, zeros if read): enough to build the library, which depends on the
    shapes alone, on a machine without the disk or the minutes for the weights."""
    import struct

    import torch
    import transformers
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    header, offset = {}, 0
    for name, tensor in model.state_dict().items():
        size = tensor.numel() * 2
        header[name] = {"dtype": "F16", "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + offset)
    config.save_pretrained(dest)
    _tokenizer_for(dest, config.vocab_size)
    return dest


def prep8b(args) -> dict:
    """The 8B checkpoint and its q4f16 artifact: what `all` runs in a second process beside the
    SmolLM2 checks. The checkpoint is initialised on --device (on 12 CPU cores it did not finish in
    four minutes, H100 machine); --out/prep8b.checkpoint says when it is written, so that `all`
    times nothing on the GPU before then."""
    src, written = llama8b_checkpoint(args)
    (Path(args.out) / "prep8b.checkpoint").write_text(f"{written:.1f}")
    print(f"checkpoint written in {written:.0f} s", flush=True)
    stages: dict[str, list[float]] = {}

    def progress(stage: str, _done: int, _total: int) -> None:
        stages.setdefault(stage.split(":")[0], []).append(time.perf_counter())

    art, seconds = compile_timed(src, "q4f16", args, max_batch_size=256, progress=progress)
    span = {k: round(v[-1] - v[0], 1) for k, v in stages.items() if len(v) > 1}
    if "weights" in stages and "compile" in stages:         # the library's export, then every weight
        span["export+weights"] = round(stages["weights"][-1] - stages["compile"][-1], 1)
    result = {"artifact": str(art), "checkpoint_s": round(written, 1), "compile_s": round(seconds, 1),
              "stage_s": span, "convert_workers": len(os.sched_getaffinity(0))}
    # The same weights with CANDIDATE's library (built here only where prebuild left it: on the
    # device a second 8B compile would cost minutes the measurements need).
    if CANDIDATE and ((PREBUILT / f"{_prebuilt_name(src, 'q4f16', args.target, 256, CANDIDATE)}.so.xz").is_file()
                      or args.quick):
        cand, seconds = compile_timed(src, "q4f16", args, CANDIDATE, max_batch_size=256)
        result[CANDIDATE] = {"artifact": str(cand), "compile_s": round(seconds, 1)}
    return result


def measure8b(art: Path, args, torch_too: bool = True, tag: str = "base", save: Path | None = None) -> dict:
    """Batch-1 decode against the floor (and its slowest kernels), 16 x 128 prefill and batch-64 decode,
    beside transformers fp16 with a static cache on the same checkpoint. The prefill's last-token
    logits and the first decode step's at each batch go to --work/8b-logits-<tag>.npz (kept between
    `all` calls on a warm machine; compare_logits: one build against another; result["logits"] says
    it was written). `save`: the
    result is rewritten there after each row (a process cut short or failing keeps what it measured)."""
    import gc

    bw = copy_bandwidth_gbs(args.device)
    floor = bw * 1e9 / weight_bytes(art)
    result = {"build": tag, "weight_gb": round(weight_bytes(art) / 1e9, 2), "copy_bandwidth_gbs": round(bw),
              "batch1_floor_tok_s": round(floor, 1)}
    record = _recorder(result, save, "8b")
    batches = [2] if args.quick else [16, 64]
    runner = _runner(art, max(batches), args)      # one load of the weights for every row (5.65 GB)
    with _gemm_from(10 ** 9):                          # first, before any BLAS call: TVM's matmuls only
        record("batch 1", kiln_bench(art, 1, args, runner))
        record("batch1_pct_of_floor", round(100 * result["batch 1"]["decode_tok_s"] / floor, 1))
        if args.device == "cuda":
            step = step_graph_rows(runner, art, args)
            record("batch 1 step graphs", step)
            if "decode_tok_s" in step:
                record("batch1_step_graphs_pct_of_floor", round(100 * step["decode_tok_s"] / floor, 1))
    record("library gemm weights", {"bytes": runner.artifact.config.library_gemm_bytes,
                                    "unusable": runner.gemm_unusable})
    if runner.gemm_unusable is None:          # before any row whose prefill takes it
        record("library gemm probe", gemm_probe(runner, args))
    logits = {}
    for b in (1, *batches):                 # 16 x 128 and 64 x 128: the library GEMM prefill, where built
        ids = list(range(b))
        for i in ids:
            runner.add_sequence(i)
        logits[f"prefill {b}"] = runner.prefill(ids, _prompts(ids, args))
        logits[f"batch {b}"] = runner.decode(ids, [5] * b)
        for i in ids:
            runner.remove_sequence(i)
    np.savez(Path(args.work) / f"8b-logits-{tag}.npz", **logits)
    record("logits", f"8b-logits-{tag}.npz")
    for b in batches:
        record(f"batch {b}", kiln_bench(art, b, args, runner))
    for b in (1, 16):
        if args.device == "cuda":
            ids = _prefill(runner, b, args)
            record(f"batch {b} decode kernels", gpu_kernel_times(runner, ids))
            for i in ids:
                runner.remove_sequence(i)
        else:
            record(f"batch {b} decode kernels", kernel_profile(art, b, args))
    if args.device == "cuda":
        rows = 2 if args.quick else 16
        record(f"prefill {rows} x {args.prompt_len} kernels", prefill_kernel_times(art, rows, args, runner))
    if runner.gemm_unusable is None:
        record("library gemm crossover", gemm_crossover(runner, args))
        record("library gemm decode crossover", gemm_decode_crossover(runner, args))
    del runner
    gc.collect()
    if torch_too:
        record("torch fp16 static", torch8b(args))
    return result


# The entries the runner can take, TVM's matmuls or the library GEMM's, by the library_gemm.MIN_TOKENS
# (or MIN_DECODE_ROWS) that forces each.
GEMM_OR_NOT = (("tvm", 10 ** 9), ("gemm", 1))


@contextlib.contextmanager
def _gemm_from(least: int, knob: str = "MIN_TOKENS"):
    """Within: the runner takes the library GEMM entry for forwards of `least` tokens or more (knob
    MIN_DECODE_ROWS: its decode entry for steps of `least` sequences or more)."""
    from kiln.runtime import library_gemm
    shipped = getattr(library_gemm, knob)
    setattr(library_gemm, knob, least)
    try:
        yield
    finally:
        setattr(library_gemm, knob, shipped)


def _logit_diff(a: np.ndarray, b: np.ndarray) -> dict:
    """The largest difference and the rows whose argmax differs (last axis: the vocabulary); for those
    rows, `b`'s logit gap between the two argmaxes (a near-tie: at most twice max_diff)."""
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    moved = np.flatnonzero(a.argmax(-1) != b.argmax(-1))
    gaps = [float(b[r].max() - b[r, a[r].argmax()]) for r in moved]
    return {"max_diff": float(np.abs(a - b).max()), "argmax_differs": len(moved),
            **({"argmax_gaps": [round(g, 5) for g in gaps]} if gaps else {})}


def gemm_probe(runner, args) -> dict:
    """One prefill of MIN_TOKENS tokens and one decode step after it through batch_prefill and
    batch_decode, then through the library GEMM entries (never run on a GPU before 2026-11-27):
    their logits compared. Should a GEMM entry raise, the runner drops both (gemm_unusable says
    why) and the rows after this one are measured without them instead of lost."""
    from kiln.runtime import library_gemm
    from kiln.runtime.contract import LIBRARY_GEMM_COPIES
    prompt = list(range(3, 3 + library_gemm.MIN_TOKENS))          # one sequence, one forward
    logits = {}
    try:
        for label, least in GEMM_OR_NOT:
            runner.add_sequence(0)
            try:
                with _gemm_from(least), _gemm_from(least, "MIN_DECODE_ROWS"):
                    logits[label] = runner.prefill([0], [prompt])
                    logits[f"{label} decode"] = runner.decode([0], [5])
            finally:
                runner.remove_sequence(0)
    except Exception as e:  # noqa: BLE001 - the rows after this one go on through TVM's entries
        for name in LIBRARY_GEMM_COPIES:
            runner._fn.pop(name, None)
        runner.gemm_unusable = f"the probe failed: {type(e).__name__}: {e}"[:300]
        return {"error": runner.gemm_unusable}
    return {"tokens": len(prompt), **_logit_diff(logits["gemm"], logits["tvm"]),
            "decode": _logit_diff(logits["gemm decode"], logits["tvm decode"])}


def gemm_crossover(runner, args, batches=(1, 2, 4, 16), short=(16, 32, 64)) -> dict:
    """Prefill ms of `batch` --prompt-len prompts, and of one prompt of each `short` length, through
    batch_prefill and through the library GEMM entry (runtime/library_gemm.py MIN_TOKENS moved either
    way), the median of 3 each: where the BLAS starts to pay, i.e. what MIN_TOKENS should be."""
    import copy
    import statistics
    shapes = [(1, n) for n in short if n < args.prompt_len] + [(b, args.prompt_len) for b in batches]
    rows = {}
    for b, n in (s for s in shapes if s[0] <= runner.max_num_seqs):
        shape = copy.copy(args)
        shape.prompt_len = n
        for label, least in GEMM_OR_NOT:
            times = []
            with _gemm_from(least):
                for _ in range(4):                               # the first warms up
                    t = time.perf_counter()
                    ids = _prefill(runner, b, shape)             # returns once the logits are back
                    times.append(time.perf_counter() - t)
                    for i in ids:
                        runner.remove_sequence(i)
            rows.setdefault(f"{b} x {n}", {})[f"{label}_ms"] = round(statistics.median(times[1:]) * 1e3, 2)
    return rows


def gemm_decode_crossover(runner, args, batches=(8, 16, 32, 64)) -> dict:
    """Greedy decode step ms of `batch` sequences through batch_decode (CUDA graphs, the quantized
    weights) and through the library GEMM's batch_decode_gemm (no graphs, the float weights, torch's
    BLAS), each after a --prompt-len prefill: what MIN_DECODE_ROWS should be."""
    rows = {}
    for b in (b for b in batches if b <= runner.max_num_seqs):
        ids = _prefill(runner, b, args)
        for label, least in GEMM_OR_NOT:
            with _gemm_from(least, "MIN_DECODE_ROWS"):
                rows.setdefault(f"batch {b}", {})[f"{label}_ms"] = _step_ms(runner, ids)
        for i in ids:
            runner.remove_sequence(i)
    return rows


def compare_logits(work: Path, tag: str, reference: str = "base") -> dict:
    """How far one 8B build's prefill and first-step logits (measure8b's npz in --work) are from
    another's, per batch: the largest difference and the rows whose argmax differs (float32
    summation order moves logits by ~1e-3; a wrong kernel by far more)."""
    a, b = np.load(work / f"8b-logits-{tag}.npz"), np.load(work / f"8b-logits-{reference}.npz")
    return {k: {**_logit_diff(a[k], b[k]), "rows": len(a[k])} for k in a.files if k in b.files}


def _result_file(args) -> Path:
    """Where a command writes its result: --out/<--json-name or the command>.json."""
    return Path(args.out) / f"{args.json_name or args.command}.json"


def _recorder(result: dict, save: Path | None, label: str):
    """record(key, value): result[key] = value, printed, and `result` rewritten to `save` (if any) at
    once, so that a process cut short or failing keeps the rows it measured."""
    def record(key: str, value) -> None:
        result[key] = value
        print(label, key, json.dumps(value, default=str), flush=True)
        if save is not None:
            save.write_text(json.dumps(result, indent=1, default=str))
    return record


def torch8b_cmd(args) -> dict:
    """torch8b in a process of its own (`all`: its rows kept if the call's time runs out in it)."""
    return torch8b(args, save=_result_file(args))


def measure8b_cmd(args) -> dict:
    """measure8b of --artifact (its build named --tag), without transformers: how `all` measures a
    build whose kernels have never run, in a process of its own."""
    return measure8b(Path(args.artifact), args, torch_too=False, tag=args.tag, save=_result_file(args))


def apart(args, command: str, seconds: float, name: str | None = None, extra: tuple[str, ...] = ()) -> dict:
    """`command` of this script in a process of its own, within `seconds`: a kernel never run before
    that faults (a sticky CUDA error) costs that process, not the rest of `all`. Its json comes
    back (a run cut short: what it wrote so far), with its return code and log tail if it failed."""
    out = Path(args.out)
    name = name or command
    cmd = [sys.executable, "-P", str(Path(__file__).resolve()), command, "--out", str(out), "--work", args.work,
           "--target", args.target, "--device", args.device, "--budget", str(seconds), "--runs", str(args.runs),
           "--json-name", name, "--prompt-len", str(args.prompt_len), "--gen-len", str(args.gen_len),
           *extra] + ["--quick"] * args.quick
    with (out / f"{name}.log").open("w") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=seconds + 60).returncode
        except subprocess.TimeoutExpired:
            rc = "timed out"
    done = out / f"{name}.json"
    result = json.loads(done.read_text()) if done.is_file() else {}
    if rc != 0:
        result["process"] = {"returncode": rc, "log": _tail(out / f"{name}.log")}
    return result


def torch_rows(src: Path, batches, args, save: Path | None = None, label: str = "torch") -> dict:
    """transformers fp16 with a static cache on `src` (torch_bench) at each of `batches`, the model
    loaded once and freed after (its GPU memory back for what runs next); `save`: rows kept as they
    come (_recorder)."""
    import gc

    import torch
    t = time.perf_counter()
    model = transformers_model(src, torch.float16, args.device)
    result = {"load_s": round(time.perf_counter() - t, 1)}
    record = _recorder(result, save, label)
    for b in batches:
        record(f"batch {b}", torch_bench(model, b, args))
    del model
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return result


def torch8b(args, save: Path | None = None) -> dict:
    """transformers fp16 with a static cache on the 8B checkpoint: 16 x 128 prefill and decode at 16
    and 64 sequences (what the issue compares kiln's batch-64 decode and prefill with)."""
    return torch_rows(Path(args.work) / "llama3-8b-arch", [2] if args.quick else [16, 64], args, save, "8b torch")


def bench8b(args) -> dict:
    prep = prep8b(args)
    print("8b compile", json.dumps(prep), flush=True)
    art = Path(prep["artifact"])
    result = {"facts": facts(args), **prep, **measure8b(art, args)}
    print(json.dumps(result), flush=True)
    return result


# ----------------------------------------------------------------------------- all, within a budget

ALL_STATE = "all-state.json"        # in --work: the steps an earlier `all` call on this machine finished


def _earlier_steps(args) -> dict:
    """The steps a previous `all` call left in --work (same kiln sources, same --quick), finished
    ones only: a second call on a warm machine goes on from there instead of measuring them again."""
    steps = _load_state(Path(args.work) / ALL_STATE, args).get("steps", {})
    return {k: v for k, v in steps.items() if not _unfinished(v)}


def _unfinished(step) -> bool:
    """A step (or one of its parts: a variant) skipped for lack of time, or failed, or a process of
    its own cut at its time limit (one that exited with an error, a faulting kernel, would again)."""
    if not isinstance(step, dict):
        return False
    timed_out = step.get("process", {}).get("returncode") == "timed out"
    return ("skipped" in step or "error" in step or timed_out
            or any(isinstance(v, dict) and "skipped" in v for v in step.values()))


class _Steps:
    """`all`'s steps, each called as steps(name, need_s, fn): run within the deadline or marked
    skipped (fewer than need_s seconds left), an exception kept as the step's error, the result
    saved after each one (--out/all.json, and --work/all-state.json for a later call); a step an
    earlier call finished (_earlier_steps) is taken from it, not run again."""

    def __init__(self, args, budget: float) -> None:
        self.args, self.out, self.work = args, Path(args.out), Path(args.work)
        self.earlier, self.result = _earlier_steps(args), {}
        self.deadline = time.monotonic() + budget

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        (self.out / "all.json").write_text(json.dumps(self.result, indent=1, default=str))
        _save_state(self.work / ALL_STATE, self.args, steps={**self.earlier, **self.result})

    def __call__(self, name: str, need_s: float, fn):
        left, result = self.left(), self.result
        if name in self.earlier:
            result[name] = self.earlier[name]
            print(f"[an earlier call] {name}", flush=True)
        elif left < need_s:
            result[name] = {"skipped": f"{left:.0f} s left, it needs about {need_s:.0f}"}
        else:
            t = time.perf_counter()
            try:
                result[name] = fn()
            except Exception as e:  # noqa: BLE001 - one failing check must not cost the others
                import traceback
                result[name] = {"error": f"{type(e).__name__}: {e}"[:500],
                                "where": traceback.format_exc().strip().splitlines()[-6:]}
            print(f"[{time.perf_counter() - t:.0f} s] {name}:", json.dumps(result[name], default=str)[:3000],
                  flush=True)
        self.save()
        return result[name]


def run_all(args) -> dict:
    """Every figure the issue's done-when names, the most telling first, inside --budget seconds; the
    8B checkpoint and compile run meanwhile in a second process on the cores the first leaves free.
    all.json is rewritten after every step, so a run cut short still brings back what it measured;
    --work/all-state.json keeps the finished steps, so `all` called again on the same (warm) machine
    runs only what the first call did not reach (its all.json holds both calls' steps)."""
    out, step = Path(args.out), _Steps(args, args.budget)
    result, earlier = step.result, step.earlier

    cores = sorted(os.sched_getaffinity(0))
    child = None
    if "llama3-8b-arch compiled" not in earlier:
        mine, theirs = cores[:4], cores[4:] or cores
        os.sched_setaffinity(0, mine)
        child_args = [sys.executable, "-P", str(Path(__file__).resolve()), "prep8b", "--out", str(out),
                      "--work", args.work, "--target", args.target, "--device", args.device] + ["--quick"] * args.quick
        with (out / "prep8b.log").open("w") as log:
            child = subprocess.Popen(child_args, stdout=log, stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: os.sched_setaffinity(0, theirs))
    src = smollm2_gguf()
    batches = [1, 4] if args.quick else [1, 16, 64, 256]
    step("facts", 0, lambda: facts(args))
    # Weight conversions first (CPU), while the second process writes the 8B checkpoint from the GPU.
    arts = {}
    for quant in SMOLLM2_SCHEMES:
        step(f"convert {quant}", 30, lambda quant=quant: dict(zip(("artifact", "compile_s"),
                                                                   compile_timed(src, quant, args))))
        arts[quant] = result[f"convert {quant}"]

    def checkpoint_written() -> dict:
        while child is not None and child.poll() is None and not (out / "prep8b.checkpoint").is_file():
            time.sleep(1)
        return {"returncode": child.poll() if child else None, "log": _tail(out / "prep8b.log", 2)}

    step("8B checkpoint written", 0, checkpoint_written)
    bw = step("copy_bandwidth_gbs", 0, lambda: round(copy_bandwidth_gbs(args.device)))

    def smollm2_kiln() -> dict:
        art, seconds = Path(arts["q4f16"]["artifact"]), arts["q4f16"]["compile_s"]
        floor = bw * 1e9 / weight_bytes(art)
        rows, runner = {}, _runner(art, max(batches), args)
        for b in batches:
            rows[f"batch {b}"] = kiln_bench(art, b, args, runner)
            print(f"q4f16 batch {b}", rows[f"batch {b}"], flush=True)
        if args.device == "cuda":
            rows["batch 1 decode kernels"] = gpu_kernel_times(runner, _prefill(runner, 1, args))
        return {"artifact": str(art), "compile_s": round(seconds, 1), "batch1_floor_tok_s": round(floor),
                "batch1_pct_of_floor": round(100 * rows["batch 1"]["decode_tok_s"] / floor, 1), **rows}

    q4 = step("smollm2 q4f16 kiln", 60, smollm2_kiln)
    os.sched_setaffinity(0, cores)                      # the 8B steps may use every core once it is built

    def prep8b_done() -> dict:
        left = step.left()
        try:
            child.wait(timeout=max(1.0, left - 120))
        except subprocess.TimeoutExpired:
            child.kill()
            return {"error": "the 8B compile did not finish in time", "log": _tail(out / "prep8b.log")}
        prep_file = out / "prep8b.json"
        if child.returncode != 0 or not prep_file.is_file():
            return {"error": f"prep8b exited {child.returncode}", "log": _tail(out / "prep8b.log")}
        return json.loads(prep_file.read_text())

    prep = step("llama3-8b-arch compiled", 120, prep8b_done)
    # The done-when's figures first: the 8B as it would ship (CANDIDATE where there is one, else
    # base) and transformers on the same checkpoint, SmolLM2 against torch at batch 1, q0f16
    # numerics, the serving limits; then, with a candidate, what ships now (adopting the candidate
    # compares with it), so that a call cut short (a second call goes on, tools/README.md) has the
    # done-when's rows first. The first 8B build measured runs in a process of its own (kernels
    # that have not run on a GPU before fault only that process).
    measured = []
    first = CANDIDATE if CANDIDATE and CANDIDATE in prep else "base" if "artifact" in prep else None
    if first:
        art8b = prep[CANDIDATE]["artifact"] if first == CANDIDATE else prep["artifact"]
        label = "llama3-8b-arch q4f16" + (f" {CANDIDATE}" if first == CANDIDATE else "")
        row = step(label, 90, lambda: apart(
            args, "measure8b", min(240.0, max(60.0, step.left() - 60)), f"measure8b-{first}",
            ("--artifact", art8b, "--tag", first)))
        measured += [first] * ("logits" in row)
    if "artifact" in prep:
        step("llama3-8b-arch transformers fp16 static", 120, lambda: apart(
            args, "torch8b", max(60.0, step.left() - 30)))
    step("smollm2 torch fp16 static", 45, lambda: torch_rows(src, batches[:1], args))
    refs = []

    def scheme(quant: str) -> dict:
        if not refs:                                    # transformers fp32 and fp16, once a call
            refs.extend(references(src, args))
        return scheme_numerics(src, quant, tuple(refs), args, arts.get(quant))

    step("numerics q0f16", 60, lambda: scheme("q0f16"))
    if "artifact" in q4:
        # After the 8B steps: an Engine sizes its KV cache from most of the GPU's free memory.
        step("serving limits", 20, lambda: serving_limits(Path(q4["artifact"])))
    if first == CANDIDATE:
        base = step("llama3-8b-arch q4f16", 90, lambda: measure8b(Path(prep["artifact"]), args, torch_too=False))
        measured += ["base"] * ("logits" in base)
    if measured == [CANDIDATE, "base"]:
        step(f"llama3-8b-arch {CANDIDATE} logits vs base", 0, lambda: compare_logits(step.work, CANDIDATE))
    if not args.quick:              # the shipped kernels against numpy first (GPU_TEST_ORDER)
        step("gpu tests", 120, lambda: gpu_tests(args, min(GPU_TESTS_S, max(60.0, step.left() - 60))))
    # Which lever does what, on 2 layers (tools/README.md): what decides the batch-1 kernels, before
    # the serving rows; what is left of VARIANTS runs at the end with the time then left.
    step("low-batch variants", 90, lambda: apart(args, "variants", min(VARIANTS_FIRST_S, step.left() - 20)))
    if "artifact" in q4:
        ends = list(dict.fromkeys((batches[0], *batches[-2:])))     # the smallest and the two largest
        step("sampled decode", 40, lambda: {f"batch {b}": sampled_decode(Path(q4["artifact"]), b, args)
                                            for b in ends})
        # `kiln serve` itself at as many streams, beside the rows above (tools/serve_load.py)
        step("smollm2 q4f16 served", 140, lambda: served(Path(q4["artifact"]), ends, args))
        step("smollm2 q4f16 speculative", 45, lambda: speculative(Path(q4["artifact"]), args))
        if "artifact" in arts["q0f16"]:
            step("smollm2 q0f16 draft model q4f16", 45, lambda: draft_model(
                Path(arts["q0f16"]["artifact"]), Path(q4["artifact"]), args))
    step("smollm2 torch fp16 static, more rows", 60, lambda: torch_rows(src, batches[1:3], args))
    step("low-batch variants, the rest", 60, lambda: apart(args, "variants", step.left() - 20))
    for quant in ("as-stored", "as-stored-f16"):
        step(f"numerics {quant}", 45, lambda quant=quant: scheme(quant))
    refs.clear()
    if child is not None and child.poll() is None:
        child.kill()
    return result


def _tail(path: Path, lines: int = 8) -> list[str]:
    return path.read_text(errors="replace").strip().splitlines()[-lines:] if path.is_file() else []


def _tokenizer_for(dest: Path, vocab: int) -> None:
    """A word-level tokenizer over the vocabulary: kiln needs one to compile; benchmarks feed ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["all", "numerics", "bench", "bench8b", "variants", "prep8b", "prebuild",
                                        "measure8b", "torch8b"])
    ap.add_argument("--out", default=".", help="where <command>.json goes (on the device: $OUT)")
    ap.add_argument("--work", default=str(ROOT / ".gpu" / "work"), help="artifacts and checkpoints [.gpu/work]")
    ap.add_argument("--target", default="cuda-sm90")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where torch runs the reference")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--greedy", type=int, default=8, help="greedy tokens compared per prompt (numerics)")
    ap.add_argument("--budget", type=float, default=540, help="seconds `all` may take [540]")
    ap.add_argument("--quick", action="store_true", help="a dry run: small batches and models, no gpu tests")
    ap.add_argument("--artifact", help="measure8b: the artifact to measure")
    ap.add_argument("--tag", default="base", help="measure8b: the build's name in its results [base]")
    ap.add_argument("--json-name", help="the result's file name in --out, without .json [the command's]")
    args = ap.parse_args()
    if args.command == "measure8b" and not args.artifact:
        ap.error("measure8b measures an artifact: pass --artifact DIR (an 8B q4f16 artifact, e.g. prep8b's)")
    if args.quick:
        args.prompt_len, args.gen_len, args.runs = min(args.prompt_len, 16), min(args.gen_len, 8), 1
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    result = {"all": run_all, "numerics": numerics, "bench": bench_cmd, "bench8b": bench8b, "variants": variants,
              "prep8b": prep8b, "prebuild": prebuild, "measure8b": measure8b_cmd,
              "torch8b": torch8b_cmd}[args.command](args)
    _result_file(args).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
