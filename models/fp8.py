"""FP8 checkpoints: Hugging Face folders whose Linear weights are float8 (e4m3) values with scales.

Two producers, one value each, `fp8 * scale` (the product of a float8 value, 4 significant bits, and
a float32 or bfloat16 scale, rounded once to float32; transformers dequantizes to bfloat16 on a CPU):

    quant_method "fp8" (DeepSeek-V3, Qwen3-FP8; transformers' FineGrainedFP8)
        weight F8_E4M3 [N, K], weight_scale_inv float32 [ceil(N/bn), ceil(K/bk)]
        for weight_block_size [bn, bk] (per tensor when it is null); value [n, k] scaled by block
        (n // bn, k // bk), as DeepSeek's weight_dequant and vLLM read it (transformers' CPU
        dequantization divides N and K by the scale grid instead: the same where the blocks divide)
    quant_method "compressed-tensors", format "float-quantized" (llm-compressor's FP8 W8A8)
        weight F8_E4M3 [N, K], weight_scale [N, 1] (channel), [1] (tensor) or blocks

`FP8Weights` hands them to the compiler dequantized to float32 under `.weight`; nothing of the FP8
form is kept (no kiln kernel reads float8), so `--quant` decides the artifact's format as for a float
checkpoint, and the activations are computed in float (the checkpoint's activation quantization,
dynamic or static, is not applied: a note says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .prequantized import compressed_tensors_formats
from .source import ModelLoadError

_SCALES = ("weight_scale_inv", "weight_scale")                 # the per-block scale, by producer
_SIDE = ("input_scale", "activation_scale", "weight_zero_point", "input_zero_point")


def e4m3_values() -> np.ndarray:
    """float32 [256]: the value of each float8 e4m3fn byte (sign, 4 exponent bits with bias 7, 3
    mantissa bits; no infinities, S.1111.111 is NaN)."""
    b = np.arange(256)
    exponent, mantissa = (b >> 3) & 15, b & 7
    value = np.where(exponent == 0, mantissa / 8 * 2.0 ** -6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    value = np.where((b & 127) == 127, np.nan, value)
    return np.where(b & 128, -value, value).astype(np.float32)


_E4M3 = e4m3_values()


def decode_e4m3(raw: np.ndarray) -> np.ndarray:
    """uint8 bytes of float8 e4m3fn -> float32 of the same shape."""
    return _E4M3[raw]


@dataclass(frozen=True)
class FP8Method:
    block: tuple[int, int] | None           # weight_block_size; None: the scale's shape says (channel, tensor)
    activations: str                        # what the checkpoint does to activations (not applied), for the note

    def describe(self) -> str:
        how = f"blocks of {self.block[0]} x {self.block[1]}" if self.block else "per channel or tensor"
        return f"FP8 e4m3 weights ({how}) dequantized to float32; activations stay float ({self.activations} " \
               "activation scaling of the checkpoint not applied)"


def read_fp8_method(d: Path, qc: dict) -> FP8Method | None:
    """An FP8 quantization_config -> FP8Method; None when it is not FP8 (another reader's, or none)."""
    where = f"{d}: config.json's quantization_config"
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        if str(qc.get("fmt", "e4m3")).lower() != "e4m3":
            raise ModelLoadError(f"{where} says FP8 format {qc.get('fmt')!r}; kiln reads e4m3 weights")
        block = qc.get("weight_block_size")
        return FP8Method(_block(where, block), f"{qc.get('activation_scheme', 'dynamic')}")
    if method != "compressed-tensors" or compressed_tensors_formats(qc) != {"float-quantized"}:
        return None
    groups = qc.get("config_groups") or {}
    if not groups:
        raise ModelLoadError(f"{where} says compressed-tensors float-quantized but has no config_groups to say "
                             "how; the checkpoint's config.json is incomplete")
    weights = [g.get("weights") or {} for g in groups.values()]
    schemes = {(w.get("num_bits"), w.get("type"), w.get("strategy"), str(w.get("block_structure"))) for w in weights}
    bits, kind, strategy, block = next(iter(schemes))
    if len(schemes) != 1 or (bits, kind) != (8, "float") or strategy not in ("channel", "tensor", "block"):
        raise ModelLoadError(f"{where} holds compressed-tensors float-quantized weights {sorted(schemes)}; kiln reads "
                             "one 8-bit float scheme by channel, tensor or block")
    structure = weights[0].get("block_structure") if strategy == "block" else None
    acts = {str((g.get("input_activations") or {}).get("dynamic", "no")) for g in groups.values()}
    return FP8Method(_block(where, structure), "dynamic" if acts == {"True"} else "static" if acts == {"False"}
                     else "no")


def _block(where: str, block) -> tuple[int, int] | None:
    if block is None:
        return None
    if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise ModelLoadError(f"{where} has weight block size {block!r}; expected two positive integers")
    return int(block[0]), int(block[1])


class FP8Weights:
    """A WeightSource over another whose float8 weights (beside a `weight_scale_inv` or `weight_scale`)
    read as float32 [N, K] = fp8 * scale, and whose scale tensors are not listed."""

    def __init__(self, inner, method: FP8Method, d: Path):
        self._inner, self.method, self._dir = inner, method, d
        names = set(inner.names())
        self._scale = {n[: -len(".weight")]: f"{n[: -len('.weight')]}.{s}" for n in names if n.endswith(".weight")
                       for s in _SCALES if f"{n[: -len('.weight')]}.{s}" in names}
        hidden = set(self._scale.values()) | {n for n in names if n.rsplit(".", 1)[-1] in _SIDE}
        self._names = [n for n in inner.names() if n not in hidden]
        if not self._scale:
            raise ModelLoadError(f"{d}: config.json says the weights are FP8, but no tensor has a weight_scale_inv "
                                 "or weight_scale beside it; the weights and the config do not belong together")

    def names(self) -> list[str]:
        return list(self._names)

    def scaled(self) -> int:
        """How many weights are stored as FP8 with a scale."""
        return len(self._scale)

    def get(self, name: str) -> np.ndarray:
        prefix = name[: -len(".weight")] if name.endswith(".weight") else None
        if prefix not in self._scale:
            return self._inner.get(name)
        values = self._inner.get(name)                               # float8 bytes decoded: float32 [N, K]
        scale = np.asarray(self._inner.get(self._scale[prefix]), np.float32)
        n, k = values.shape
        if self.method.block is not None:
            bn, bk = self.method.block
        elif scale.size == 1:
            bn, bk = n, k
        else:                                                        # per channel: [N, 1]
            bn, bk = -(-n // scale.shape[0]), -(-k // (scale.shape[1] if scale.ndim == 2 else 1))
        want = (-(-n // bn), -(-k // bk))
        if scale.size != want[0] * want[1]:
            raise ModelLoadError(f"{self._dir}: {self._scale[prefix]} holds {scale.size} scales, not the "
                                 f"{want[0]} x {want[1]} blocks of {bn} x {bk} a [{n}, {k}] weight has")
        scale = scale.reshape(want)
        return values * np.repeat(np.repeat(scale, bn, axis=0)[:n], bk, axis=1)[:, :k]
