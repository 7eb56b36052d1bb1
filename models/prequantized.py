"""GPTQ, AWQ and compressed-tensors checkpoints: Hugging Face folders whose Linear weights are 4- or 8-bit codes.

config.json's `quantization_config` names the method; each quantized Linear (K inputs, N outputs,
groups of G inputs sharing a scale and a zero point) is stored as tensors beside its `.weight`'s
name, one value of it `scale * (code - zero)` with a code of 0..15 (4-bit; GPTQ's and compressed-tensors'
8-bit ones, 0..255, pack 4 codes a word where 4-bit ones pack 8, each `bits` wide, the same layouts):

    gptq   qweight int32 [K/8, N]    input k of output n: bits 4 (k % 8) of word [k // 8, n]
           qzeros  int32 [K/G, N/8]  output n's zero: bits 4 (n % 8) of word [g, n // 8]
           scales  f16   [K/G, N]    g_idx int32 [K]: input k's group (k // G unless desc_act reorders)
           checkpoint_format "gptq" (AutoGPTQ's) stores every zero minus 1, "gptq_v2" as it is
    awq    qweight int32 [K, N/8]    output 8c + AWQ_ORDER[j] of input k: bits 4j of word [k, c]
           qzeros  int32 [K/G, N/8]  the same order;  scales f16 [K/G, N]  ("version": "gemm")
    compressed-tensors ("format": "pack-quantized", 4-bit int weights, llm-compressor's W4A16)
           weight_packed int32 [N, K/8]  input k of output n: bits 4 (k % 8) of word [n, k // 8]
           weight_scale  [N, K/G]        weight_zero_point int32 [N/8, K/G] (asymmetric only: output
           weight_shape  [2] = (N, K)    n's zero at bits 4 (n % 8) of word [n // 8, g]; else 8)

(the layouts gptqmodel's TorchQuantLinear, AutoAWQ's dequantize_gemm and compressed-tensors'
unpack_from_int32 read; compressed-tensors stores a signed code c as c + 8, so the zero is 8 plus
its signed zero point; 128 for 8-bit ones). `PrequantizedWeights` hands them to the compiler under the
`.weight` name, in Hugging Face layout: `get` dequantizes to float32 (exactly: a float16 or bfloat16 scale
times an integer of at most 9 bits needs at most 20 of float32's 24 bits), and `stored_codes` gives the
codes, zeros and scales themselves, for `--quant as-stored` to keep (compiler/quant_prequant.py)
wherever the groups run in order along K. bitsandbytes 4-bit is models/bnb.py's; other methods, formats and
bit widths are refused when the folder is opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .source import ModelLoadError

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)        # AutoAWQ's packing: field j of a word holds output AWQ_ORDER[j]
LABELS = {"gptq": "GPTQ", "awq": "AWQ", "compressed-tensors": "compressed-tensors"}
# per method: the tensors of one Linear beside <prefix>: codes, zeros, scales, the input's group
PLANES = {"gptq": ("qweight", "qzeros", "scales", "g_idx"), "awq": ("qweight", "qzeros", "scales", "g_idx"),
          "compressed-tensors": ("weight_packed", "weight_zero_point", "weight_scale", "weight_g_idx")}
_FIX = ("use the model's unquantized checkpoint (float16 / bfloat16 safetensors) or a GGUF of it, and "
        "`--quant` to choose how kiln quantizes it")


@dataclass(frozen=True)
class QuantMethod:
    """What config.json's quantization_config says, checked."""

    method: str                     # a key of LABELS
    group_size: int | None          # None: one group the whole input (GPTQ's -1, a "channel" strategy)
    zeros_minus_one: bool = False   # AutoGPTQ's v1 checkpoint format
    ordered: bool = True            # GPTQ's desc_act off: groups run in order along K
    symmetric: bool = False         # compressed-tensors: no zero points stored (every zero the middle code)
    bits: int = 4                   # 4 or 8 (GPTQ, compressed-tensors)

    @property
    def label(self) -> str:
        return LABELS[self.method]

    @property
    def middle(self) -> int:
        """The zero of a symmetric code: 8 for 4 bits, 128 for 8."""
        return 1 << (self.bits - 1)

    def describe(self) -> str:
        group = f"group {self.group_size}" if self.group_size else "one group a row"
        order = "" if self.ordered else ", desc_act (groups out of order)"
        return f"{self.label} {self.bits}-bit, {group}{order}"


def read_quant_method(d: Path, qc: dict) -> QuantMethod:
    """config.json's quantization_config -> QuantMethod, or a ModelLoadError naming what kiln cannot read."""
    method = str(qc.get("quant_method", "")).lower()
    where = f"{d}: config.json's quantization_config"
    if method not in LABELS:
        raise ModelLoadError(f"{where} says quant_method {qc.get('quant_method')!r}, which kiln cannot read "
                             f"(it reads 4- and 8-bit GPTQ, 4-bit AWQ, 4- and 8-bit compressed-tensors pack-quantized "
                             f"checkpoints, bitsandbytes 4-bit ones and FP8 "
                             f"ones dequantized); {_FIX}")
    if method == "compressed-tensors":
        return _compressed_tensors(where, qc)
    bits = qc.get("bits", 4)
    if bits not in ((4, 8) if method == "gptq" else (4,)):
        widths = "4- and 8-bit" if method == "gptq" else "4-bit"
        raise ModelLoadError(f"{where} says {method} with {bits} bits; kiln reads {widths} {LABELS[method]} "
                             f"checkpoints only; {_FIX}")
    group = _group(where, qc.get("group_size", 128))
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm" or qc.get("zero_point", True) is not True:
            raise ModelLoadError(f"{where} says AWQ version {version!r}, zero_point {qc.get('zero_point')!r}; kiln "
                                 f"reads AutoAWQ's GEMM packing with zero points (version 'gemm'); {_FIX}")
        return QuantMethod("awq", group)
    fmt = str(qc.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise ModelLoadError(f"{where} says GPTQ checkpoint_format {fmt!r}; kiln reads 'gptq' and 'gptq_v2' "
                             f"(repack it with gptqmodel, or {_FIX})")
    return QuantMethod("gptq", group, zeros_minus_one=fmt == "gptq", ordered=not qc.get("desc_act", False), bits=bits)


def _group(where: str, group) -> int | None:
    if not isinstance(group, int) or (group != -1 and (group < 8 or group % 8)):
        raise ModelLoadError(f"{where} has group_size {group!r}; expected -1 or a multiple of 8")
    return group if group > 0 else None


def compressed_tensors_formats(qc: dict) -> set[str]:
    """A compressed-tensors config's formats: each config group's, else the config's own."""
    groups = qc.get("config_groups") or {}
    return {str(g.get("format") or qc.get("format")) for g in groups.values()} or {str(qc.get("format"))}


def _compressed_tensors(where: str, qc: dict) -> QuantMethod:
    """One weight scheme for every config group: 4- or 8-bit ints, grouped or per channel, packed."""
    groups = qc.get("config_groups") or {}
    formats = compressed_tensors_formats(qc)
    if formats != {"pack-quantized"}:
        raise ModelLoadError(f"{where} says compressed-tensors format {', '.join(sorted(formats))}; kiln reads "
                             f"'pack-quantized' (4-bit integer weights, W4A16) and 'float-quantized' (FP8); {_FIX}")
    schemes = {(w.get("num_bits"), w.get("type"), w.get("strategy"), w.get("group_size"), bool(w.get("symmetric")),
                g.get("input_activations") is None) for g in groups.values() for w in [g.get("weights") or {}]}
    if len(schemes) != 1:
        raise ModelLoadError(f"{where} holds {len(schemes)} different weight schemes ({sorted(map(str, schemes))}); "
                             f"kiln reads one 4- or 8-bit scheme for every quantized Linear; {_FIX}")
    bits, kind, strategy, group, symmetric, weights_only = schemes.pop()
    if bits not in (4, 8) or kind != "int" or strategy not in ("group", "channel") or not weights_only:
        raise ModelLoadError(f"{where} says {bits}-bit {kind} weights by {strategy}"
                             f"{'' if weights_only else ' with quantized activations'}; kiln reads 4- or 8-bit int "
                             f"weights by group or channel, activations in float (W4A16, W8A16); {_FIX}")
    return QuantMethod("compressed-tensors", _group(where, group) if strategy == "group" else None,
                       symmetric=symmetric, bits=bits)


@dataclass(frozen=True)
class StoredCodes:
    """One quantized Linear in Hugging Face layout:
    value[n, k] = scales[n, k // group] * (codes[n, k] - zeros[n, k // group])."""

    codes: np.ndarray               # uint8 [N, K], 0..15 (0..255 for 8-bit)
    zeros: np.ndarray               # int16 [N, K / group] (GPTQ's v1 zeros, stored minus 1, can reach 16)
    scales: np.ndarray              # float32 [N, K / group]: the stored float16 / bfloat16 widened
    group: int
    bits: int = 4

    def dequantize(self) -> np.ndarray:
        """float32 [N, K], every value exact (see the module docstring)."""
        steps = self.codes.astype(np.float32) - np.repeat(self.zeros, self.group, axis=1).astype(np.float32)
        return steps * np.repeat(self.scales, self.group, axis=1)


def unpack_nibbles(words: np.ndarray, axis: int = 1, bits: int = 4) -> np.ndarray:
    """32-bit words -> their 8 4-bit fields (bits 4j is field j; with bits 8, 4 fields, bits 8j), uint8, the
    fields laid out along `axis` (1: [N, K/8] -> [N, K], kiln's q4 planes' layout too, compiler/quant_pack;
    0: [K/8, N] -> [K, N])."""
    per = 32 // bits
    fields = (words.view(np.uint32)[..., None] >> (bits * np.arange(per, dtype=np.uint32))) & np.uint32((1 << bits) - 1)
    fields = fields.astype(np.uint8)                                      # [..., words, per]
    if axis == 0:                                                          # [rows, cols, per] -> [rows * per, cols]
        return np.ascontiguousarray(fields.transpose(0, 2, 1)).reshape(-1, words.shape[1])
    return fields.reshape(words.shape[0], -1)                              # [rows, cols * per]


def _awq_order(fields: np.ndarray) -> np.ndarray:
    """[rows, 8 c] fields as unpacked -> in output order (output 8c + AWQ_ORDER[j] is field j of word c)."""
    rows = fields.shape[0]
    return fields.reshape(rows, -1, 8)[:, :, np.argsort(AWQ_ORDER)].reshape(rows, -1)


class PrequantizedWeights:
    """A WeightSource over another (SafetensorsWeights, TorchBinWeights) whose quantized Linears
    (`<prefix>.qweight` or `<prefix>.weight_packed` and the tensors beside it) appear as
    `<prefix>.weight`, float32 [N, K] on `get`."""

    def __init__(self, inner, method: QuantMethod, d: Path):
        self._inner, self.method, self._dir = inner, method, d
        self._planes = PLANES[method.method]
        codes = f".{self._planes[0]}"
        names = inner.names()
        self._quantized = {n[: -len(codes)] for n in names if n.endswith(codes)}
        hidden = {f"{p}.{plane}" for p in self._quantized for plane in (*self._planes, "weight_shape")}
        self._names = [n for n in names if n not in hidden] + [f"{p}.weight" for p in sorted(self._quantized)]
        if not self._quantized:
            raise ModelLoadError(f"{d}: config.json says the model is {method.label}-quantized, but no tensor is "
                                 f"named *{codes}; the weights and the config do not belong together")

    def names(self) -> list[str]:
        return list(self._names)

    def quantized(self) -> int:
        """How many Linear weights are stored quantized."""
        return len(self._quantized)

    def tensor_type(self, name: str) -> str:
        """The method's label ("GPTQ", "AWQ", ...) for a quantized Linear; for the rest, stored as floats,
        "F16" or "BF16" as stored (as-stored keeps their 16 bits), else "F32"."""
        if self._prefix(name) is not None:
            return self.method.label
        stored = self._inner.tensor_type(name)
        return stored if stored in ("F16", "BF16") else "F32"

    def get(self, name: str) -> np.ndarray:
        prefix = self._prefix(name)
        if prefix is None:
            return self._inner.get(name)
        codes = self.stored_codes(name)
        return codes.dequantize() if codes is not None else self._dequantize_by_g_idx(prefix)

    def stored_form(self, name: str) -> tuple[bool, int, int] | None:
        """(whether every zero is the middle code (8, or 128 for 8 bits), the group size, the bits) of what
        stored_codes gives for `name`, read from the zeros alone; None where it gives nothing."""
        prefix = self._prefix(name)
        if prefix is None or not self._in_order(prefix):
            return None
        k, n = self._shape(prefix)
        zeros = self._zeros(prefix, k, n)
        return bool((zeros == self.method.middle).all()), int(np.gcd(self.method.group_size or k, k)), self.method.bits

    def stored_codes(self, name: str) -> StoredCodes | None:
        """The codes of a quantized Linear whose groups run in order along K (AWQ, compressed-tensors, GPTQ
        without desc_act or with a g_idx that is k // G anyway); None otherwise. A ragged last group (K
        no multiple of G) is split into groups of gcd(G, K), each with its group's scale and zero."""
        prefix = self._prefix(name)
        if prefix is None or not self._in_order(prefix):
            return None
        codes, zeros, scales = self._unpacked(prefix)                     # [K, N], [K / G, N]
        k = codes.shape[0]
        group = self.method.group_size or k
        fine = int(np.gcd(group, k))
        if fine != group:
            zeros, scales = (np.repeat(a, group // fine, axis=0)[: k // fine] for a in (zeros, scales))
        return StoredCodes(np.ascontiguousarray(codes.T), np.ascontiguousarray(zeros.T),
                           np.ascontiguousarray(scales.T), fine, self.method.bits)

    # -- one Linear's tensors, as the file lays them out ------------------------------------
    def _prefix(self, name: str) -> str | None:
        prefix = name[: -len(".weight")] if name.endswith(".weight") else None
        return prefix if prefix in self._quantized else None

    def _plane(self, prefix: str, plane: str, widen: bool = False) -> np.ndarray:
        try:
            return (self._inner.get if widen else self._inner.stored)(f"{prefix}.{plane}")
        except KeyError:
            raise ModelLoadError(f"{self._dir}: {prefix}.{self._planes[0]} has no {prefix}.{plane} beside it; "
                                 f"the {self.method.label} checkpoint is incomplete, re-download it") from None

    def _words(self, prefix: str, plane: str) -> np.ndarray:
        a = self._plane(prefix, plane)
        if a.dtype != np.int32 or a.ndim != 2:
            raise ModelLoadError(f"{self._dir}: {prefix}.{plane} is {a.dtype} {list(a.shape)}; "
                                 f"{self.method.label} stores 2-D int32 words")
        return a

    def _shape(self, prefix: str) -> tuple[int, int]:
        """(K, N): the Linear's inputs and outputs."""
        if self.method.method == "compressed-tensors":
            n, k = (int(v) for v in np.asarray(self._plane(prefix, "weight_shape")).reshape(-1)[:2])
            return k, n
        rows = self._inner.shape(f"{prefix}.qweight")[0]
        return ((32 // self.method.bits) * rows if self.method.method == "gptq" else rows), \
            self._inner.shape(f"{prefix}.scales")[-1]

    def _zeros(self, prefix: str, k: int, n: int) -> np.ndarray:
        """int16 [K / G, N]: each group's zero of each output, as the file's format means it."""
        groups = -(-k // self.method.group_size) if self.method.group_size else 1
        bits = self.method.bits
        if self.method.method == "compressed-tensors":
            if self.method.symmetric:
                return np.full((groups, n), self.method.middle, np.int16)
            zeros = unpack_nibbles(self._words(prefix, "weight_zero_point"), axis=0, bits=bits).T   # [G', N padded]
        elif self.method.method == "gptq":
            zeros = unpack_nibbles(self._words(prefix, "qzeros"), axis=1, bits=bits)
        else:
            zeros = _awq_order(unpack_nibbles(self._words(prefix, "qzeros"), axis=1))
        zeros = zeros.astype(np.int16) + (1 if self.method.zeros_minus_one else 0)
        if zeros.shape[0] != groups or zeros.shape[1] < n:
            raise ModelLoadError(f"{self._dir}: {prefix}'s zero points hold {list(zeros.shape)} groups x outputs, "
                                 f"not {groups} x {n}; re-download the checkpoint")
        return zeros[:, :n]

    def _unpacked(self, prefix: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(codes [K, N], zeros [K / G, N], scales [K / G, N] float32) as the file lays them out by input."""
        codes_plane, _, scales_plane, _ = self._planes
        k, n = self._shape(prefix)
        words = self._words(prefix, codes_plane)
        scales = np.asarray(self._plane(prefix, scales_plane, widen=True), np.float32)
        bits = self.method.bits
        if self.method.method == "gptq":
            codes = unpack_nibbles(words, axis=0, bits=bits)
        elif self.method.method == "awq":
            codes = _awq_order(unpack_nibbles(words, axis=1))
        else:                                                                   # stored [N, K] and [N, K / G]
            codes, scales = unpack_nibbles(words, axis=1, bits=bits)[:, :k].T, scales.T
        groups = -(-k // self.method.group_size) if self.method.group_size else 1
        if codes.shape[0] != k or codes.shape[1] < n or scales.shape != (groups, n):
            raise ModelLoadError(f"{self._dir}: {prefix} has {codes_plane} {list(words.shape)} and {scales_plane} "
                                 f"of {scales.size} values: not one {self.method.describe()} weight of {k} inputs "
                                 f"and {n} outputs; re-download the checkpoint")
        return codes[:, :n], self._zeros(prefix, k, n), scales

    def _g_idx(self, prefix: str, k: int) -> np.ndarray:
        try:
            g_idx = np.asarray(self._inner.stored(f"{prefix}.{self._planes[3]}"), np.int64)
        except KeyError:
            return np.arange(k) // (self.method.group_size or k)
        if g_idx.shape != (k,):
            raise ModelLoadError(f"{self._dir}: {prefix}.{self._planes[3]} has shape {list(g_idx.shape)}, "
                                 f"expected [{k}]")
        return g_idx

    def _in_order(self, prefix: str) -> bool:
        if self.method.ordered and self.method.method != "compressed-tensors":
            return True
        k = self._shape(prefix)[0]
        return bool(np.array_equal(self._g_idx(prefix, k), np.arange(k) // (self.method.group_size or k)))

    def _dequantize_by_g_idx(self, prefix: str) -> np.ndarray:
        codes, zeros, scales = self._unpacked(prefix)                     # [K, N], [G', N]
        g_idx = self._g_idx(prefix, codes.shape[0])
        if g_idx.min(initial=0) < 0 or g_idx.max(initial=0) >= scales.shape[0]:
            raise ModelLoadError(f"{self._dir}: {prefix}.g_idx names groups outside 0..{scales.shape[0] - 1}")
        values = (codes.astype(np.float32) - zeros[g_idx].astype(np.float32)) * scales[g_idx]
        return np.ascontiguousarray(values.T)
