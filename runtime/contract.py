"""The artifact contract: the one definition of dist/<name>/ that the compiler writes and the runtime reads.

    kiln-config.json   ArtifactConfig (below) + the sha256 of every other file
    lib.<so|tar|...>   the compiled module (its name is ArtifactConfig.target.lib)
    params/            tensor-cache.json + shard-NNN.bin (raw little-endian tensors, ParamWriter/ParamReader)
    tokenizer files    tokenizer.json, tokenizer_config.json, ... (listed in tokenizer_files)
    golden.npz         reference top-k logits of a few prompts (write_golden/read_golden; `kiln check`)

Plain Python and numpy, no TVM: the compiler (kiln.compiler.artifact) imports this module and
nothing else of the runtime; the runtime (kiln.runtime.artifact) validates every artifact through
it. A change to the layout bumps FORMAT_VERSION, and an artifact of another version is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

CONFIG_NAME = "kiln-config.json"
FORMAT_VERSION = 1
PARAMS_DIR = "params"
PARAMS_INDEX = "tensor-cache.json"                 # inside PARAMS_DIR
PARAMS_INDEX_FORMAT = "kiln-tensors-1"
SHARD_BYTES = 64 << 20
# What every artifact exports, called by name: the runtime drives any model through these.
ENTRY_FUNCTIONS = ("embed", "prefill", "decode", "batch_prefill", "batch_decode", "batch_verify",
                   "create_paged_kv_cache")
# An artifact whose KV cache kiln owns (KVCacheLayout.owner "kiln") has no cache to create.
OWNED_KV_ENTRY_FUNCTIONS = tuple(f for f in ENTRY_FUNCTIONS if f != "create_paged_kv_cache")
KV_OWNERS = ("tvm", "kiln")
# The page tables the forward functions of an artifact with kiln's KV cache take after its pages, in order
# (models/owned_kv.py reads them, runtime/kv_caches.py builds them; KVCacheLayout.tables records them).
OWNED_KV_TABLES = ("page_indptr", "page_values", "seq_of", "positions", "slots", "q_indptr", "last_len",
                   "rope_offset")
# ... and with recurrent layers (KVCacheLayout.layer_states), each sequence's state slot, after those.
OWNED_STATE_TABLES = ("state_slots",)
# Entry functions newer artifacts have and older ones may lack: a feature that needs one says so.
# batch_hidden: final hidden states (embeddings); greedy_tokens: the argmax of batch_decode's logits,
# taken where they are, so a greedy decode step copies one int32 per sequence back instead of the logits;
# sample_tokens: the same for sampled rows (temperature, top-k, top-p, min-p: models/sampling.py).
OPTIONAL_ENTRY_FUNCTIONS = ("batch_hidden", "greedy_tokens", "sample_tokens")
# batch_prefill with its token matmuls through the device's BLAS (compiler/passes/library_gemm.py), in
# artifacts of a profile with library_gemm: the runner registers GEMM_PACKED_FUNC before it loads the
# library (runtime/library_gemm.py) and takes this entry for forwards of many tokens, and
# LIBRARY_GEMM_DECODE (batch_decode so) for decode steps of many sequences. Their quantized weights
# come dequantized, as a last argument, from LIBRARY_GEMM_WEIGHTS (params -> a tuple of float
# tensors, called once at load), which ArtifactConfig.library_gemm_bytes says the size of.
LIBRARY_GEMM_ENTRY = "batch_prefill_gemm"
LIBRARY_GEMM_DECODE = "batch_decode_gemm"
LIBRARY_GEMM_WEIGHTS = "batch_prefill_gemm_weights"
# Each library GEMM entry, and the entry function it is a copy of.
LIBRARY_GEMM_COPIES = {LIBRARY_GEMM_ENTRY: "batch_prefill", LIBRARY_GEMM_DECODE: "batch_decode"}
GEMM_PACKED_FUNC = "kiln.gemm_nt"
ATTENTION_KINDS = ("full", "sliding")              # KVCacheLayout.layer_kinds
# `kiln compile --kv-cache-dtype`: auto keeps the compute dtype (the exact cache); float16 halves a
# float32 model's. KVCacheLayout.dtype records what the artifact's cache holds.
KV_CACHE_DTYPES = ("auto", "float32", "float16")
# `kiln compile --decode-activations`: exact keeps float activations; int8 quantizes them in the 1-8 row
# GEMVs over 4-bit weights (targets with int8_decode: x86-64 CPUs), recorded in quantization["decode_activations"].
DECODE_ACTIVATIONS = ("exact", "int8")
# quantization["model_activations"] "int8": the model itself rounds its activations to 8 bits a token (BitNet's
# BitLinear), whatever the scheme; `kiln check` allows for rounding flips (runtime/check.py ROUNDED_ACTIVATIONS).
GOLDEN_NAME = "golden.npz"                         # ArtifactConfig.golden says what made it, or why there is none


class ArtifactError(ValueError):
    """An artifact that cannot be used as it is; the message says how to fix it."""


def sha256_file(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under root except kiln-config.json, by relative path."""
    return {p.relative_to(root).as_posix(): sha256_file(p)
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != CONFIG_NAME}


# ----------------------------------------------------------------------------- the config record


@dataclass(frozen=True)
class SourceInfo:
    format: str                                  # "hf" | "gguf" | "onnx"
    content_hash: str
    path: str = ""                               # the source's file or folder name (informational; never a full path)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    arch: str
    config: dict                                 # the family's config dataclass, as a dict
    source: SourceInfo


@dataclass(frozen=True)
class TargetInfo:
    name: str                                    # the preset: cpu, cuda, rocm-gfx942, ...
    device: str                                  # tvm.runtime.device kind the runtime opens
    tvm_target: dict
    lib: str                                     # file name of the compiled module


@dataclass(frozen=True)
class KVCacheLayout:
    page_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    layer_kinds: tuple[str, ...] = ()            # per layer: "full" | "sliding"; empty = all full
    sliding_window: int | None = None            # tokens, for "sliding" layers
    window_mode: str = ""                        # "per_sequence" | "per_layer" (models/causal_lm.py); "": by kinds
    owner: str = "tvm"                           # whose cache: "tvm" (TVM's PagedKVCache, create_paged_kv_cache) or
                                                 # "kiln" (models/owned_kv.py: pages and tables the runtime passes)
    tables: tuple[str, ...] = ()                 # owner "kiln": the page tables its functions take, in order
    layer_kv: tuple[tuple[int, int], ...] = ()   # owner "kiln": per layer (kv heads, head dim) where layers differ
                                                 # (Gemma 4's global layers); empty: num_kv_heads, head_dim each
    layer_sources: tuple[int, ...] = ()          # owner "kiln": per layer, the layer whose pages it attends over
                                                 # (Gemma 4's shared KV); empty: each its own
    layer_states: tuple[tuple[tuple[int, ...], ...], ...] = ()   # owner "kiln": per layer, the shapes of its
                                                 # recurrent state tensors (float32, a slot a sequence; Qwen3.5's
                                                 # DeltaNet: conv inputs, delta-rule state); such a layer holds no
                                                 # pages. Empty: none

    def kv_of(self, layer: int) -> tuple[int, int]:
        """Layer `layer`'s (kv heads, head dim)."""
        return self.layer_kv[layer] if self.layer_kv else (self.num_kv_heads, self.head_dim)

    @property
    def owners(self) -> list[int]:
        """The layers that hold pages (the others read an earlier layer's, or keep a recurrent state), in order."""
        return [i for i in range(self.num_layers) if (not self.layer_sources or self.layer_sources[i] == i)
                and not (self.layer_states and self.layer_states[i])]

    @property
    def states(self) -> list[tuple[int, ...]]:
        """Every recurrent state tensor's shape but its slots, layer by layer (the cache input's tensors after
        the pages)."""
        return [shape for shapes in self.layer_states for shape in shapes]

    def rewind_problem(self) -> str | None:
        """Why this cache cannot give tokens back (speculation's rejected drafts) or share a prefix, or None."""
        if self.states:
            return ("recurrent layers (a state a sequence, not keys and values a token) cannot give back tokens "
                    "or share a prefix")
        if "sliding" in self.layer_kinds and self.owner == "tvm":
            return "a sliding-window KV cache cannot give back rejected draft tokens"
        return None

    @property
    def bytes_per_token(self) -> int:
        """KV cache bytes one token takes: keys and values of every layer that holds pages."""
        itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}.get(self.dtype, 4)
        return 2 * itemsize * sum(h * d for h, d in map(self.kv_of, self.owners))

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_kinds", tuple(self.layer_kinds))
        bad = [k for k in self.layer_kinds if k not in ATTENTION_KINDS]
        _require(not bad, f"kv_cache.layer_kinds has {bad[:1]}; known kinds: {', '.join(ATTENTION_KINDS)}")
        _require(not self.layer_kinds or len(self.layer_kinds) == self.num_layers,
                 f"kv_cache.layer_kinds lists {len(self.layer_kinds)} layers, the model has {self.num_layers}")
        _require("sliding" not in self.layer_kinds or (self.sliding_window or 0) > 0,
                 "kv_cache has sliding-window layers but no sliding_window size")
        _require(self.window_mode in ("", "per_sequence", "per_layer"),
                 f"kv_cache.window_mode {self.window_mode!r} is not per_sequence or per_layer")
        _require(self.owner in KV_OWNERS, f"kv_cache.owner {self.owner!r} is not one of {', '.join(KV_OWNERS)}")
        object.__setattr__(self, "tables", tuple(self.tables))
        _require(self.owner == "tvm" or self.tables, "kv_cache.owner is kiln but kv_cache.tables lists none")
        object.__setattr__(self, "layer_kv", tuple(tuple(int(v) for v in hd) for hd in self.layer_kv))
        object.__setattr__(self, "layer_sources", tuple(int(i) for i in self.layer_sources))
        object.__setattr__(self, "layer_states", tuple(tuple(tuple(int(v) for v in shape) for shape in shapes)
                                                        for shapes in self.layer_states))
        for name in ("layer_kv", "layer_sources", "layer_states"):
            listed = getattr(self, name)
            _require(not listed or len(listed) == self.num_layers,
                     f"kv_cache.{name} lists {len(listed)} layers, the model has {self.num_layers}")
            _require(not listed or self.owner == "kiln", f"kv_cache.{name} needs the KV cache kiln owns (owner kiln)")
        _require(all(len(hd) == 2 and min(hd) > 0 for hd in self.layer_kv),
                 "kv_cache.layer_kv must give each layer [kv heads, head dim]")
        _require(all(0 <= s <= i and s in self.owners and self.kv_of(s) == self.kv_of(i)
                     for i, s in enumerate(self.layer_sources) if not (self.layer_states and self.layer_states[i])),
                 "kv_cache.layer_sources must name, for each layer, itself or an earlier layer of its shape that "
                 "holds pages")
        _require(all(shape and min(shape) > 0 for shape in self.states),
                 "kv_cache.layer_states must give each state tensor a shape of positive sizes")
        _require(not self.states or set(OWNED_STATE_TABLES) <= set(self.tables),
                 f"kv_cache has recurrent states but its tables lack {OWNED_STATE_TABLES}")


@dataclass(frozen=True)
class ArtifactConfig:
    """kiln-config.json, validated: every field the runtime relies on is present and consistent."""

    model: ModelInfo
    quantization: dict                           # scheme name, dtype, per-format counts (informational)
    target: TargetInfo
    entry_functions: tuple[str, ...]
    params: tuple[str, ...]                      # parameter names, in the order the entry functions take them
    vocab_size: int
    hidden_size: int
    context_window_size: int
    prefill_chunk_size: int
    max_batch_size: int
    kv_cache: KVCacheLayout
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    tokenizer_files: tuple[str, ...] = ()
    kiln_version: str = ""
    tvm_version: str = ""
    compile_seconds: float = 0.0
    tuned_kernels: int = 0                       # kernels scheduled with `kiln tune` knobs
    activation_bytes: int = 0                    # device memory the planned buffers take at most; 0: unknown
    library_gemm_bytes: int = 0                  # LIBRARY_GEMM_WEIGHTS' float weights (bytes), kept while loaded
    library_gemm_call_values: int = 0            # weight values a BLAS call of LIBRARY_GEMM_DECODE multiplies (mean)
    notes: tuple[str, ...] = ()
    golden: dict = field(default_factory=dict)   # {"file", "reference", "prompts", "top_k"} or {"skipped": why}
    files: dict[str, str] = field(default_factory=dict)   # relative path -> sha256 (set when written)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        for name in ("entry_functions", "params", "eos_token_ids", "tokenizer_files", "notes"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        needed = ENTRY_FUNCTIONS if self.kv_cache.owner == "tvm" else OWNED_KV_ENTRY_FUNCTIONS
        missing = [f for f in needed if f not in self.entry_functions]
        _require(not missing, f"the artifact lacks entry functions {missing}")
        for name in ("vocab_size", "hidden_size", "context_window_size", "prefill_chunk_size", "max_batch_size"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value > 0, f"{name} must be a positive integer, got {value!r}")
        _require(self.prefill_chunk_size <= self.context_window_size,
                 f"prefill_chunk_size ({self.prefill_chunk_size}) exceeds context_window_size "
                 f"({self.context_window_size})")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "ArtifactConfig":
        """Validate a parsed kiln-config.json; ArtifactError names the first problem."""
        _require(isinstance(d, dict), "the config is not a JSON object")
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise ArtifactError(f"artifact format {version}, this kiln reads {FORMAT_VERSION}; "
                                "recompile it with this kiln")
        try:
            return cls(**{**d, "model": ModelInfo(**{**d["model"], "source": SourceInfo(**d["model"]["source"])}),
                          "target": TargetInfo(**d["target"]), "kv_cache": KVCacheLayout(**d["kv_cache"])})
        except KeyError as e:
            raise ArtifactError(f"the config lacks field {e.args[0]!r}") from None
        except TypeError as e:      # a missing or unknown field in one of the records
            raise ArtifactError(f"the config does not match the artifact schema ({e})") from None


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ArtifactError(message)


def write_config(root: Path, config: ArtifactConfig) -> None:
    """kiln-config.json for a finished artifact directory: the record plus every other file's sha256."""
    config = dataclasses.replace(config, files=file_hashes(root), format_version=FORMAT_VERSION)
    (root / CONFIG_NAME).write_text(json.dumps(config.to_dict(), indent=2))


def read_config(root: Path) -> ArtifactConfig:
    """The validated record of the artifact at root (ArtifactError says what is wrong and how to fix it)."""
    path = root / CONFIG_NAME
    if not path.is_file():
        raise ArtifactError(f"{root} is not a kiln artifact (no {CONFIG_NAME}); compile the model "
                            f"with `kiln compile MODEL -o {root}`")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path} is not valid JSON ({e}); recompile the artifact") from None
    try:
        return ArtifactConfig.from_dict(raw)
    except ArtifactError as e:
        raise ArtifactError(f"{path}: {e}; recompile the artifact with `kiln compile`") from None


def verify_files(root: Path, config: ArtifactConfig) -> None:
    """Every file the config lists exists and matches its sha256."""
    for rel, digest in config.files.items():
        f = root / rel
        if not f.is_file():
            raise ArtifactError(f"artifact {root} is missing {rel}; recompile it")
        if sha256_file(f) != digest:
            raise ArtifactError(f"artifact {root}: {rel} does not match its hash in {CONFIG_NAME} "
                                "(edited or corrupted); recompile it with `kiln compile`")


# ----------------------------------------------------------------------------- golden logits


@dataclass(frozen=True)
class GoldenPrompt:
    """One prompt's token ids and the reference's top-k logits at every position."""
    ids: np.ndarray                              # [n] int32
    top_ids: np.ndarray                          # [n, k] int32, best first
    top_values: np.ndarray                       # [n, k] float32


def write_golden(root: Path, prompts: list[GoldenPrompt]) -> None:
    arrays = {}
    for i, p in enumerate(prompts):
        arrays.update({f"ids_{i}": p.ids.astype(np.int32), f"top_ids_{i}": p.top_ids.astype(np.int32),
                       f"top_values_{i}": p.top_values.astype(np.float32)})
    np.savez(root / GOLDEN_NAME, **arrays)


def read_golden(root: Path) -> list[GoldenPrompt]:
    """The golden prompts of the artifact at root (its hash already verified); ArtifactError names the file."""
    try:
        with np.load(root / GOLDEN_NAME, allow_pickle=False) as z:
            count = len([k for k in z.files if k.startswith("ids_")])
            prompts = [GoldenPrompt(z[f"ids_{i}"], z[f"top_ids_{i}"], z[f"top_values_{i}"]) for i in range(count)]
    except (OSError, ValueError, KeyError) as e:
        raise ArtifactError(f"artifact {root}: {GOLDEN_NAME} is unreadable ({e}); recompile it") from None
    for p in prompts:
        _require(p.ids.ndim == 1 and p.top_ids.shape == p.top_values.shape == (len(p.ids), p.top_ids.shape[1]),
                 f"artifact {root}: {GOLDEN_NAME} has inconsistent shapes; recompile it")
    _require(bool(prompts), f"artifact {root}: {GOLDEN_NAME} holds no prompts; recompile it")
    return prompts


# ----------------------------------------------------------------------------- parameter shards


class ParamWriter:
    """Appends tensors to ~64 MB shards; only the tensor being written is held in memory."""

    def __init__(self, params_dir: Path):
        self.dir = params_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.tensors: list[dict] = []
        self.shards: list[str] = []
        self._fh = None
        self._size = 0

    def add(self, name: str, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array)
        if self._fh is None or (self._size and self._size + data.nbytes > SHARD_BYTES):
            self._open_shard()
        self.tensors.append({"name": name, "dtype": str(data.dtype), "shape": list(data.shape),
                             "shard": len(self.shards) - 1, "offset": self._size, "nbytes": data.nbytes})
        self._fh.write(data.tobytes())
        self._size += data.nbytes

    def _open_shard(self) -> None:
        if self._fh:
            self._fh.close()
        self.shards.append(f"shard-{len(self.shards):03d}.bin")
        self._fh = open(self.dir / self.shards[-1], "wb")
        self._size = 0

    def close(self) -> None:
        if self._fh:
            self._fh.close()
        index = {"format": PARAMS_INDEX_FORMAT, "shards": self.shards, "tensors": self.tensors}
        (self.dir / PARAMS_INDEX).write_text(json.dumps(index, indent=1))


def iter_params(root: Path, names: tuple[str, ...]) -> Iterator[np.ndarray]:
    """The named tensors of the artifact at root, in order, each read into its own buffer: a
    consumer that copies each to the device and drops it holds one tensor on the host, not the
    model (a memory map would keep every touched page resident beside the device copies)."""
    params_dir = root / PARAMS_DIR
    try:
        index = json.loads((params_dir / PARAMS_INDEX).read_text())
        by_name = {t["name"]: t for t in index["tensors"]}
        shards = index["shards"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ArtifactError(f"artifact {root}: {PARAMS_DIR}/{PARAMS_INDEX} is unreadable ({e}); recompile it") from None
    missing = [name for name in names if name not in by_name]
    if missing:
        raise ArtifactError(f"artifact {root}: {PARAMS_DIR}/{PARAMS_INDEX} lacks {missing[0]}; recompile it")
    files = [open(params_dir / s, "rb") for s in shards]
    try:
        for name in names:
            t = by_name[name]
            buf = np.empty(t["shape"], np.dtype(t["dtype"]))
            files[t["shard"]].seek(t["offset"])
            if files[t["shard"]].readinto(memoryview(buf).cast("B")) != t["nbytes"]:
                raise ArtifactError(f"artifact {root}: shard {shards[t['shard']]} is truncated; recompile it")
            yield buf
    finally:
        for f in files:
            f.close()
