"""Quantized stand-ins for nn.Linear and nn.Embedding, and the weight formats they store.

A quantized weight W[N, K] (Hugging Face layout: N output rows, K inputs) is kept as
planes, groups of `group_size` consecutive elements of a row sharing one scale:

    q4   qweight uint32 [N, K/8]   value = (q - 8) * scale           q in 0..15
    q4m  qweight uint32 [N, K/8]   value = q * scale + min           (llama.cpp Q4_1)
    q8   qweight int8   [N, K]     value = q * scale                 (llama.cpp Q8_0)
    q8m  qweight uint8  [N, K]     value = q * scale + min           (llama.cpp Q5_1, Q5_K)
         scale (and min) [N, K/group_size] in the format's scale dtype
    f16  qweight float16 [N, K]    value = w, widened to float32      (a stored float16 tensor)
    bf16 qweight uint16 [N, K]     value = the float32 whose top half is w   (a stored bfloat16 tensor)

f16 and bf16 hold a checkpoint's 16-bit float weights as stored, half the bytes of the float32
compute that as-stored keeps them in (QuantPlan._format_for), with no scale plane: widening to
float32 is exact. bfloat16 travels as its bits (uint16), so no runtime or target needs a bfloat16
type.

4-bit codes are packed 8 to a uint32 along K: element k of a row lives in word k // 8
at bits 4 * (k % 8).

The modules' forward emits a `dequantize_<format>` op (a TE function over the planes,
giving the float W) followed by exactly what the float modules emit
(`matmul(x, permute_dims(W))`, `take(W, ids)`), so the graph keeps the float structure
and the passes in compiler/passes/ fuse the dequantize into its consumer.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

KINDS = ("q4", "q4m", "q8", "q8m", "f16", "bf16")
BYTE_CODES = {"q8": "int8", "q8m": "uint8"}  # one code a byte, of this dtype (the rest: 4-bit codes, 8 a uint32)
BYTE_KINDS = tuple(BYTE_CODES)
FLOAT_KINDS = ("f16", "bf16")          # 16-bit floats as stored, widened to float32
_VALUE = {"q4": "(q - 8) * scale", "q4m": "q * scale + min", "q8": "q * scale", "q8m": "q * scale + min",
          "f16": "w (float16)",
          "bf16": "w (bfloat16 bits)"}
_FLOAT_PLANE = {"f16": "float16", "bf16": "uint16"}


@dataclass(frozen=True)
class QuantFormat:
    """How one weight is stored: its code kind, group size and scale dtype."""

    kind: str                   # one of KINDS
    group_size: int = 32
    scale_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown quantized format {self.kind!r}; known: {', '.join(KINDS)}")
        if self.group_size % 8:
            raise ValueError(f"group_size must be a multiple of 8, got {self.group_size}")

    @property
    def bits(self) -> int:
        return {"q8": 8, "q8m": 8, "f16": 16, "bf16": 16}.get(self.kind, 4)

    @property
    def plane_names(self) -> tuple[str, ...]:
        if self.kind in FLOAT_KINDS:
            return ("qweight",)
        return ("qweight", "scale", "min") if self.kind in ("q4m", "q8m") else ("qweight", "scale")

    def planes(self, rows: int, cols: int) -> dict[str, tuple[tuple[int, int], str]]:
        """{plane name: (shape, dtype)} for a [rows, cols] weight."""
        if self.kind in FLOAT_KINDS:
            return {"qweight": ((rows, cols), _FLOAT_PLANE[self.kind])}
        if cols % self.group_size:
            raise ValueError(f"a {self.kind} weight needs its last dim ({cols}) to be a multiple of "
                             f"the group size {self.group_size}")
        codes = ((rows, cols), BYTE_CODES[self.kind]) if self.kind in BYTE_KINDS \
            else ((rows, cols // 8), "uint32")
        groups = ((rows, cols // self.group_size), self.scale_dtype)
        return {"qweight": codes, "scale": groups, **({"min": groups} if "min" in self.plane_names else {})}

    def describe(self) -> dict:
        """The artifact's record of this format (kiln-config.json "quantization")."""
        if self.kind in FLOAT_KINDS:
            return {"kind": self.kind, "bits": self.bits, "value": _VALUE[self.kind]}
        return {"kind": self.kind, "bits": self.bits, "group_size": self.group_size,
                "scale_dtype": self.scale_dtype, "value": _VALUE[self.kind]}


def dequantize(fmt: QuantFormat, dtype: str, planes: list[Tensor], by_bits: bool = False) -> Tensor:
    """The float weight [N, K] (in `dtype`) from its planes, as one `dequantize_<kind>` op."""

    def compute(qweight: te.Tensor, scale: te.Tensor | None = None, minimum: te.Tensor | None = None) -> te.Tensor:
        rows, cols = qweight.shape[0], qweight.shape[1] * (8 if fmt.kind in ("q4", "q4m") else 1)
        return te.compute((rows, cols), lambda n, k: dequantize_element(fmt, dtype, qweight, scale, minimum, n, k,
                                                                        by_bits), name="dequantize")

    return op.tensor_expr_op(compute, f"dequantize_{fmt.kind}", planes)


def dequantize_element(fmt: QuantFormat, dtype: str, qweight, scale, minimum, n, k,
                       by_bits: bool = False) -> tirx.PrimExpr:
    """W[n, k] as a TIR expression over the plane buffers (TE tensors or TIR buffers); `by_bits`:
    the integer codes become floats through their bits (code_value), the same values."""
    if fmt.kind == "f16":
        return qweight[n, k].astype(dtype)
    if fmt.kind == "bf16":
        bits = qweight[n, k].astype("uint32") << tirx.const(16, "uint32")
        return tirx.reinterpret("float32", bits).astype(dtype)
    g = k // fmt.group_size
    s = scale[n, g].astype(dtype)
    if fmt.kind == "q8":
        if by_bits and dtype in _MAGIC:                  # int8 -> 0..255 by flipping the sign bit
            code = qweight[n, k].astype("uint8").astype("uint32") ^ tirx.const(0x80, "uint32")
            return code_value(code, dtype, 128) * s
        return qweight[n, k].astype(dtype) * s
    if fmt.kind == "q8m":
        q = code_value(qweight[n, k].astype("uint32"), dtype, 0) if by_bits and dtype in _MAGIC \
            else qweight[n, k].astype(dtype)
        return q * s + minimum[n, g].astype(dtype)
    shift = (k % 8 * 4).astype("uint32")
    code = (qweight[n, k // 8] >> shift) & tirx.const(15, "uint32")
    offset = 8 if fmt.kind == "q4" else 0
    if by_bits and dtype in _MAGIC:
        q = code_value(code, dtype, offset)
    else:
        q = code.astype(dtype) - tirx.const(offset, dtype) if offset else code.astype(dtype)
    if fmt.kind == "q4":
        return q * s
    return q * s + minimum[n, g].astype(dtype)


# A float whose bits with the code OR-ed into its low mantissa bits are that float plus the code
# (1024 in float16: the step is 1 up to 2048; 2**23 in float32), and the bits to OR into.
_MAGIC = {"float16": (1024, 0x6400, "uint16"), "float32": (1 << 23, 0x4B000000, "uint32")}


def code_value(code: tirx.PrimExpr, dtype: str, offset: int) -> tirx.PrimExpr:
    """An integer code 0..255 (uint32) minus `offset`, as `dtype`, without an integer-to-float
    conversion: (base | code) read as a float is base + code, and base + code - (base + offset) is
    exact. The same value as code.astype(dtype) - offset, in bit operations and one subtraction,
    for targets whose integer-to-float conversions are slow enough to cap a GEMV (every weight value
    needs one): TargetProfile.codes_by_bits says where."""
    base, bits, word = _MAGIC[dtype]
    pattern = (code | tirx.const(bits, "uint32")).astype(word)
    return tirx.reinterpret(dtype, pattern) - tirx.const(base + offset, dtype)


class _QuantizedWeight(nn.Module):
    """The planes of one quantized [rows, cols] weight as nn.Parameters (fixed dtypes)."""

    def _init_planes(self, fmt: QuantFormat, rows: int, cols: int, dtype: str, by_bits: bool) -> None:
        self.format = fmt
        self.dtype = dtype                  # the dequantized weight's (compute) dtype
        self.by_bits = by_bits              # codes to floats by their bits (dequantize_element)
        for name, (shape, plane_dtype) in fmt.planes(rows, cols).items():
            setattr(self, name, nn.Parameter(shape, plane_dtype))

    @property
    def weight_dtype(self) -> str:
        """The dequantized weight's dtype: float32 whenever the scales are (a GGUF's exact formats
        under float16 compute stay exact: q * scale rounded to float16 would not be) and for 16-bit
        floats as stored (bfloat16 has no float16 form), else the compute dtype."""
        exact = self.format.scale_dtype == "float32" or self.format.kind in FLOAT_KINDS
        return "float32" if exact else self.dtype

    def dequantized_weight(self) -> Tensor:
        return dequantize(self.format, self.weight_dtype, self.planes(), self.by_bits)

    def planes(self) -> list[Tensor]:
        return [getattr(self, p) for p in self.format.plane_names]

    def element(self, planes: list, n, k) -> tirx.PrimExpr:
        """W[n, k] in weight_dtype over `planes` (this weight's, as TE tensors): for a kernel that reads
        the weight's rows through an index (models/moe.py's expert matmul) instead of dequantize's op."""
        qweight, scale, minimum = (*planes, None, None)[:3]
        return dequantize_element(self.format, self.weight_dtype, qweight, scale, minimum, n, k, self.by_bits)

    def to(self, dtype: str | None = None) -> None:
        """Only the compute dtype follows `to`; the planes keep their storage dtypes."""
        if dtype is not None:
            self.dtype = dtype
        for item in self.__dict__.values():
            if isinstance(item, nn.Module):
                item.to(dtype)


class QuantizedLinear(_QuantizedWeight):
    """nn.Linear(in_features, out_features) with its weight [out, in] in a QuantFormat."""

    def __init__(self, in_features: int, out_features: int, fmt: QuantFormat, dtype: str,
                 bias: bool = False, by_bits: bool = False):
        self.in_features = in_features
        self.out_features = out_features
        self._init_planes(fmt, out_features, in_features, dtype, by_bits)
        self.bias = nn.Parameter((out_features,), dtype) if bias else None

    def to(self, dtype: str | None = None) -> None:
        super().to(dtype)
        if dtype is not None and self.bias is not None:
            self.bias.to(dtype)

    def forward(self, x: Tensor) -> Tensor:
        w = self.dequantized_weight()                      # [out, in]
        if w.dtype == x.dtype:
            y = op.matmul(x, op.permute_dims(w))           # [.., out]
        else:                                              # float16 x, exact float32 w: sum in float32
            y = op.matmul(x, op.permute_dims(w), out_dtype="float32").astype(self.dtype)
        return y + self.bias if self.bias is not None else y


class QuantizedEmbedding(_QuantizedWeight):
    """nn.Embedding(num, dim) with its table [num, dim] in a QuantFormat.

    `weight` is the dequantized table, so a tied LM head (`matmul(x, permute_dims(
    embed.weight))`) reads the same quantized planes."""

    def __init__(self, num: int, dim: int, fmt: QuantFormat, dtype: str, by_bits: bool = False):
        self.num = num
        self.dim = dim
        self._init_planes(fmt, num, dim, dtype, by_bits)

    @property
    def weight(self) -> Tensor:
        return self.dequantized_weight()                   # [num, dim]

    def forward(self, ids: Tensor) -> Tensor:
        table = self.dequantized_weight()                  # [num, dim]
        rows = op.take(table, ids if ids.ndim == 1 else op.reshape(ids, shape=[-1]), axis=0)
        rows = rows if rows.dtype == self.dtype else rows.astype(self.dtype)
        return rows if ids.ndim == 1 else op.reshape(rows, shape=[*ids.shape, self.dim])


__all__ = ["BYTE_CODES", "BYTE_KINDS", "FLOAT_KINDS", "KINDS", "QuantFormat", "QuantizedEmbedding", "QuantizedLinear",
           "code_value", "dequantize", "dequantize_element"]
