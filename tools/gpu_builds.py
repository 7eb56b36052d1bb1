"""What tools/gpu_checks.py builds: SmolLM2's GGUF, the Llama-3-8B-architecture checkpoints (random
weights, or shapes only), the kernel VARIANTS it compares, and compiles that take a library built
beforehand (.gpu/prebuilt, `gpu_checks.py prebuild`) where one matches."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import lzma
import os
import shutil
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ROOT / "tools" / "gpu_checks.py"        # the script every check process runs


SMOLLM2_SCHEMES = ("q4f16", "q0f16", "as-stored", "as-stored-f16")


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
# "candidate" of 2026-11-28's H200 run, adopted from its whole-8B rows (tools/README.md); since the
# H200 run of 2026-12-04 its one-row GEMV issues an iteration's loads before its MMAs (`lever8b`
# "loadsfirst": 355.1 against 340.6 tok/s, logits bit-equal). The levers it left out, in the order
# they decide:
# "loadsfirst": the same fence at 2-16 rows (unmeasured there).
# "pipe": the MMA GEMV's iterations unrolled with the weights in two register sets, the next
# iteration's loads before an iteration's MMAs (mma_gemv `pipeline`), no fence, 1-16 rows. In the
# cuda-sm90 SASS (nvcc 13, 2026-12-04): iterations 0 and 1's weights issued before the first MMA and
# iteration it + 2's among iteration it's MMAs, 90-100 registers a thread where base has 72 (16-20
# warps an SM where base fits 24-28), so 2-3 iterations' weights in flight a warp where base waits
# on each iteration's. Loading the activations an iteration ahead too took away the branch (rows
# past the count) that keeps ptxas from sinking the weight loads: it then interleaved one load with
# every few MMAs, as without the pipeline, at 44 registers; with one chunk an iteration likewise.
# (tools/sass_counts.py --variant pipe --order shows the order and the registers.)
# "glu": the CUDA profiles' glu_epilogue: batch_decode's gate-up GEMV writes silu(gate) * up itself
# (targets/mma_gemv.py `epilogue`: a tile's 8 gate rows beside the same outputs' 8 up rows, 1-16
# rows; above, the matmul and the activation as two kernels, as before): a kernel less a layer (the
# 8B: 32 a step, each a launch gap and the gate-up output's round trip). The epilogue adds 32 SASS
# instructions a kernel (416 against 384, 72 registers both, the same loads; 2026-12-04, no GPU); the
# logits should be base's bit for bit (the same sums and arithmetic).
# "norm": the CUDA profiles' norm_prologue: batch_decode's residual add + RMSNorm computed by the
# matmul that reads the norm (compiler/passes/fuse_norm_matmul.py; targets/mma_gemv.py `norm`: each
# block of the MMA GEMV stages its 1-4 rows' norm in shared memory, its threads playing the AddRMSNorm
# kernel's so that the values are that kernel's bit for bit; above 4 rows the two kernels as before):
# 63 of the 8B's 65 norm kernels a step gone (0.19 ms of the GPU's 2.35 busy, 2026-12-04, and a
# launch gap each), each GEMV block reading its rows' 8 KB from L2 and summing them first. The
# logits should be base's bit for bit.
# "fused": "norm" and "glu" together (95 kernels a step fewer): the first measure of both.
# "pipefused": "pipe" and "fused" together (the MMA GEMV takes its pipeline, prologue and epilogue at
# once): what ships where "pipe" and "fused" both beat base, measured in the same run as each.
# "pdlfused": "pdl" and "fused" together: with ~7 kernels a layer, 4 of them GEMVs back to back (O,
# gate-up, down, the next QKV), each launched while the one before it ends; the GEMVs with a norm
# prologue wait first (targets/dependent_launch.py), the others load their first weights before.
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
# step graphs (its TVM graph stretches run in place while a step is captured): "batch 1 step graphs".
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
# sequences, 2026-11-27; "splitk", "mma", "mma8", "candidate": shipped since; on the whole 8B at
# batch 1, H200, 2026-12-04, against base's 340.6 tok/s: "prefetch" 274.2, "pdlpf" 300.3, so "lfpf",
# the prefetch with the fence, too; "loadsfirst" at one row shipped since.)


# In the order they decide; "batches": the rows each changes (all of VARIANT_BATCHES without);
# "branches": low_batch_branches' arguments (tiles: NarrowTensorCoreMatmul's; gemv: variant_branches'
# rules by name, "none" for dlight's alone); "profile": TargetProfile fields set on the CUDA
# presets for the build; "min_split": decode_attention.MIN_SPLIT.
VARIANTS = {"base": {},
            "pdl": {"branches": {"gemv": "pdl"}, "profile": {"dependent_launch": True}},
            "loadsfirst": {"branches": {"gemv": "loadsfirst"}, "batches": (2, 4, 5, 16)},
            "pipe": {"branches": {"gemv": "pipe"}, "batches": (1, 2, 4, 5, 16)},
            "glu": {"profile": {"glu_epilogue": True}, "batches": (1, 2, 4, 5, 16, 64)},
            "norm": {"profile": {"norm_prologue": True}, "batches": (1, 2, 4, 5, 16, 64)},
            "fused": {"profile": {"norm_prologue": True, "glu_epilogue": True},
                      "batches": (1, 2, 4, 5, 16, 64)},
            "pipefused": {"branches": {"gemv": "pipe"}, "profile": {"norm_prologue": True, "glu_epilogue": True},
                          "batches": (1, 2, 4, 5, 16, 64)},
            "pdlfused": {"branches": {"gemv": "pdl"},
                         "profile": {"dependent_launch": True, "norm_prologue": True, "glu_epilogue": True},
                         "batches": (1, 2, 4, 5, 16, 64)},
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
CANDIDATE = None


# The whole 8B at batch 1, one build a process (`lever8b`), each also with step graphs: the issue's
# one unmet figure decided on the model itself, not on 2 of its layers (`variants`: the other rows).
# Every build is the 8B artifact with its library swapped for the lever's (library_swapped: the
# weights do not depend on the kernels), prebuilt like CANDIDATE's (`prebuild`). "base" first: the
# others' logits are compared with its. ("stepgraph" is "nographs" with step graphs; "bits" changes
# the export; "dlight" and "tcgroup" change no batch-1 kernel that ships.) Ordered by what each may
# take off the 2.35 ms a step the GPU was busy in loadsfirst's run (H200, 2026-12-04): the matmuls'
# loads in flight first (1.77 ms, 1.26 at the floor), then the attention (0.24 ms in 32 calls, most
# of it latency at 256 tokens), with the kernels fewer ("fused": 95 a step, then each half) beside
# them; `all` reached 5 levers a session (before measure8b's other rows moved after the levers).
LEVERS_8B = ("base", "pipe", "fused", "pipefused", "pdlfused", "norm", "glu", "attn64", "warps16", "unroll4",
             "nographs", "pdl16", "q4gemv", "pdl")

# Levers measured only where each of these parts beat base in the same run (gpu_all.py parts_lost):
# a combination whose part lost would spend a lever's minute to say so again.
LEVER_PARTS = {"pipefused": ("pipe", "fused"), "pdlfused": ("fused",)}


VARIANT_BATCHES = (1, 2, 4, 5, 16, 64)    # 5: the tiles' first row count (a partial tile)


VARIANT_LAYERS = 2                   # the 8B's layer shapes, 2 of them (and a 32000 vocabulary): variants


LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256)


def load_state(path: Path, args) -> dict:
    """What an earlier call on this machine kept at `path` (save_state), if the same kiln sources
    (compiler fingerprint) and --quick wrote it; else {}."""
    import kiln
    state = json.loads(path.read_text()) if path.is_file() else {}
    if state.get("fingerprint") != kiln.compiler_fingerprint() or state.get("quick") != args.quick:
        return {}
    return state


def save_state(path: Path, args, **kept) -> None:
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
    # The MMA GEMV (4-bit, then 8-bit layers) with these arguments, over base's (the fence at 1 row).
    mma = {"warps16": {"most_warps": 16}, "pdl": {"pdl": True}, "pdl16": {"most_warps": 16, "pdl": True},
           "loadsfirst": {"loads_first": True}, "pipe": {"pipeline": True, "loads_first": False}}
    name = spec.get("gemv")
    gemv = (lambda b: [MMAGEMV(bits, batch=b, **{"loads_first": b == 1, **mma[name]}) for bits in (4, 8)]) \
        if name in mma else {
            "q4": lambda b: [Q4GEMV(batch=b)], "none": lambda b: [], None: None,
            "unroll4": lambda b: [MMAGEMV(4, unroll=4 if b <= 8 else 2, batch=b, loads_first=b == 1),
                                  MMAGEMV(8, batch=b, loads_first=b == 1)]}[name]
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


def prebuilt_name(src: Path, quant: str, target: str, max_batch_size: int | None, variant: str = "base") -> str:
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
    name = prebuilt_name(src, quant, args.target, kw.get("max_batch_size"), variant)
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
    compile: SmolLM2 for every scheme the checks use, the 8B model (max batch 256) for base, CANDIDATE
    and every LEVERS_8B build, and the 2-layer 8B-shaped model for every VARIANTS entry (both from
    shapes-only checkpoints: the library does not depend on the weights), so the device spends its
    minutes converting weights, not compiling. A library already there for these sources is kept
    (a second call builds only what the first did not: a lever added since); one built from other
    sources (another compiler fingerprint) is deleted, as it would only add to the device's carry."""
    import tempfile

    import kiln
    PREBUILT.mkdir(parents=True, exist_ok=True)
    fingerprint = kiln.compiler_fingerprint()
    for old in PREBUILT.iterdir():
        if f"-{fingerprint}" not in old.name:             # prebuilt_name's fingerprint part
            old.unlink()
    done, shapes = {}, Path(tempfile.mkdtemp(prefix="kiln-shapes-"))
    jobs = [(smollm2_gguf(), quant, "base", None) for quant in SMOLLM2_SCHEMES]
    name, config = llama8b_config(args)
    full = shapes_only_checkpoint(shapes / name, config)
    jobs += [(full, "q4f16", v, 256) for v in dict.fromkeys(("base", CANDIDATE, *LEVERS_8B)) if v]
    name, config = llama8b_config(args, layers=VARIANT_LAYERS)
    two = shapes_only_checkpoint(shapes / name, config)
    jobs += [(two, "q4f16", v, None) for v in VARIANTS]
    try:
        for src, quant, variant, max_batch in jobs:
            key = prebuilt_name(src, quant, args.target, max_batch, variant)
            if all((PREBUILT / f"{key}{ext}").is_file() for ext in (".so.xz", ".json")):
                print(f"{src.name} {quant} {variant}: built before -> {key}.so.xz", flush=True)
                continue
            key, seconds = build_library(src, quant, variant, max_batch, args, PREBUILT)
            done[key] = seconds
            print(f"{src.name} {quant} {variant}: built in {seconds:.0f} s -> {key}.so.xz", flush=True)
    finally:
        shutil.rmtree(shapes, ignore_errors=True)
    return done


def build_library(src: Path, quant: str, variant: str, max_batch: int | None, args, dest: Path) -> tuple[str, float]:
    """TVM's build of `src` for --target with VARIANTS[variant]'s kernels, into dest/<key>.so.xz and
    its build facts into dest/<key>.json (key: prebuilt_name); returns (key, seconds)."""
    from kiln.compiler import CompileOptions
    from kiln.compiler.build import build_lib, export_model
    t = time.perf_counter()
    with built_with(variant):          # export too: codes_by_bits shapes the dequantize ops
        ex = export_model(CompileOptions(model=str(src), target=args.target, quant=quant,
                                         max_batch_size=max_batch), lambda *_: None)
        lib, facts = build_lib(ex.mod, ex.profile)
    key = prebuilt_name(src, quant, args.target, max_batch, variant)
    dest.mkdir(parents=True, exist_ok=True)
    plain = dest / f"{key}.so"
    ex.profile.export(lib, plain)
    (dest / f"{key}.so.xz").write_bytes(lzma.compress(plain.read_bytes()))
    plain.unlink()
    (dest / f"{key}.json").write_text(json.dumps(dataclasses.asdict(facts)))
    return key, round(time.perf_counter() - t, 1)


def library_swapped(base: Path, src: Path, variant: str, args) -> Path:
    """The artifact `base` (compiled from `src`, q4f16) with VARIANTS[variant]'s library in place of
    its own: a folder in --work whose other files link to base's (the weights do not depend on the
    kernels), its config naming the new library's hash and build facts. The library is the one
    `prebuild` left in .gpu/prebuilt; without one it is built here under --quick (the tiny model), and
    refused otherwise (on the device the 8B's build would cost the minutes the measurements need)."""
    from kiln.runtime.contract import read_config
    config = read_config(base)
    key = prebuilt_name(src, "q4f16", args.target, config.max_batch_size, variant)
    where = PREBUILT
    if not (PREBUILT / f"{key}.so.xz").is_file():
        if not args.quick:
            raise FileNotFoundError(f"no prebuilt library {key}.so.xz for {variant}: run `gpu_checks.py prebuild "
                                    f"--target {args.target} --device cpu` before the GPU session")
        where = Path(args.work) / "libs"
        build_library(src, "q4f16", variant, config.max_batch_size, args, where)
    return swap_library(base, lzma.decompress((where / f"{key}.so.xz").read_bytes()),
                        json.loads((where / f"{key}.json").read_text()), Path(args.work) / f"{base.name}-{variant}-lib")


def swap_library(base: Path, lib: bytes, facts: dict, dest: Path) -> Path:
    """A copy of the artifact `base` at `dest` with `lib` as its compiled module and `facts`
    (BuildFacts' fields) in its config; every other file a link to base's. Returns dest."""
    from kiln.runtime.contract import CONFIG_NAME, read_config, sha256_file
    config = read_config(base)
    shutil.rmtree(dest, ignore_errors=True)
    for rel in config.files:
        if rel != config.target.lib:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).symlink_to((base / rel).resolve())
    (dest / config.target.lib).write_bytes(lib)
    swapped = dataclasses.replace(config, **facts, files={**config.files,
                                                          config.target.lib: sha256_file(dest / config.target.lib)})
    (dest / CONFIG_NAME).write_text(json.dumps(swapped.to_dict(), indent=2))
    return dest


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
        tokenizer_for(src, config.vocab_size)
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
    tokenizer_for(dest, config.vocab_size)
    return dest


def tokenizer_for(dest: Path, vocab: int) -> None:
    """A word-level tokenizer over the vocabulary: kiln needs one to compile; benchmarks feed ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
