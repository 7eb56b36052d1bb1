"""bitsandbytes 4-bit checkpoints (QLoRA's and unsloth's `-bnb-4bit` folders: quantization_config quant_method
"bitsandbytes" with load_in_4bit) read as the float weights they stand for.

Each quantized Linear's `.weight` is uint8 [N x K / 2, 1], two 4-bit codes a byte (the first in the high
nibble), in the weight's row-major order; beside it (transformers' save of bitsandbytes' QuantState):

    .weight.quant_map          float32 [16]   each code's value (NF4: normal quantiles; FP4)
    .weight.absmax             float32 [N x K / blocksize], each block's scale; with double quantization
                               uint8 codes of an 8-bit blockwise quantization of those scales:
    .weight.nested_quant_map   float32 [256]  and  .weight.nested_absmax  float32 [blocks / nested_blocksize]
    .weight.quant_state.bitsandbytes__nf4 (or __fp4)   uint8, JSON: quant_type, blocksize, dtype, shape,
                               nested_blocksize, nested_offset

    value = quant_map[code] * absmax[i // blocksize]
    absmax = nested_quant_map[a] * nested_absmax[j // nested_blocksize] + nested_offset     (double quantization)

in float32, then rounded to the state's dtype: bitsandbytes' dequantize_4bit, what transformers' forward
multiplies by. NF4 and FP4 have no kiln form (their 16 levels are not evenly spaced): --quant re-quantizes
them (as-stored, auto's choice: to q4, with a note). 8-bit LLM.int8 checkpoints (load_in_8bit), whose
forward splits outlier columns off in float16 at run time, are refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .source import ModelLoadError

_STATE = ".weight.quant_state.bitsandbytes__"
_SIDE = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")
_FIX = ("use the model's unquantized checkpoint (float16 / bfloat16 safetensors) or a GGUF of it, and `--quant` "
        "to choose how kiln quantizes it")


@dataclass(frozen=True)
class BnbMethod:
    """What config.json's quantization_config says, checked."""

    quant_type: str                 # "nf4" | "fp4"
    double_quant: bool

    def describe(self) -> str:
        return f"bitsandbytes {self.quant_type.upper()}{' (double quantization)' if self.double_quant else ''}"


def read_bnb_method(d: Path, qc: dict) -> BnbMethod | None:
    """A bitsandbytes quantization_config -> BnbMethod; None for another method; a ModelLoadError for one
    kiln cannot read."""
    if str(qc.get("quant_method", "")).lower() != "bitsandbytes":
        return None
    where = f"{d}: config.json's quantization_config"
    if qc.get("load_in_8bit") or qc.get("_load_in_8bit"):
        raise ModelLoadError(f"{where} says bitsandbytes 8-bit (LLM.int8, load_in_8bit), whose forward splits outlier "
                             f"columns off at run time; kiln reads bitsandbytes 4-bit (NF4 / FP4); {_FIX}")
    if not (qc.get("load_in_4bit") or qc.get("_load_in_4bit")):
        raise ModelLoadError(f"{where} says bitsandbytes without load_in_4bit; {_FIX}")
    storage = str(qc.get("bnb_4bit_quant_storage", "uint8"))
    if storage != "uint8":
        raise ModelLoadError(f"{where} stores bitsandbytes codes as {storage} (bnb_4bit_quant_storage); kiln reads "
                             f"uint8 storage; {_FIX}")
    quant_type = str(qc.get("bnb_4bit_quant_type", "fp4")).lower()
    if quant_type not in ("nf4", "fp4"):
        raise ModelLoadError(f"{where} says bnb_4bit_quant_type {quant_type!r}; kiln reads nf4 and fp4")
    return BnbMethod(quant_type, bool(qc.get("bnb_4bit_use_double_quant")))


class BnbWeights:
    """A WeightSource over another (SafetensorsWeights, TorchBinWeights) whose bitsandbytes 4-bit Linears read
    as float32 [N, K] (the values their codes stand for), their quant-state tensors unlisted."""

    def __init__(self, inner, method: BnbMethod, d: Path):
        self._inner, self.method, self._dir = inner, method, d
        names = inner.names()
        self._all = set(names)
        self._states = {n[: n.index(_STATE)] + ".weight": n for n in names if _STATE in n}
        hidden = set(self._states.values()) | {f"{w}.{side}" for w in self._states for side in _SIDE}
        self._names = [n for n in names if n not in hidden]
        if not self._states:
            raise ModelLoadError(f"{d}: config.json says bitsandbytes 4-bit, but no tensor has a quant_state beside it "
                                 "(*.weight.quant_state.bitsandbytes__nf4); the weights and the config do not belong "
                                 "together")

    def names(self) -> list[str]:
        return list(self._names)

    def quantized(self) -> int:
        """How many weights are stored 4-bit."""
        return len(self._states)

    def tensor_type(self, name: str) -> str:
        """"NF4" or "FP4" for a 4-bit weight; the stored float type ("F16", "BF16", "F32") for the rest."""
        if name in self._states:
            return self._state(name)["quant_type"].upper()
        stored = self._inner.tensor_type(name)
        return stored if stored in ("F16", "BF16") else "F32"

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self._states:
            return tuple(int(v) for v in self._state(name)["shape"])
        return self._inner.shape(name)

    def get(self, name: str) -> np.ndarray:
        if name not in self._states:
            return self._inner.get(name)
        state = self._state(name)
        shape = tuple(int(v) for v in state["shape"])
        count, block = int(np.prod(shape)), int(state["blocksize"])
        packed = np.asarray(self._inner.stored(name)).reshape(-1).view(np.uint8)
        if packed.size * 2 < count:
            raise ModelLoadError(f"{self._dir}: {name} holds {packed.size} bytes, not the {count // 2} of a "
                                 f"{list(shape)} weight's 4-bit codes; re-download the checkpoint")
        codes = np.empty(packed.size * 2, np.uint8)
        codes[0::2], codes[1::2] = packed >> 4, packed & 15
        levels = self._side(name, "quant_map", 16)
        absmax = self._absmax(name, state, -(-count // block))
        values = levels[codes[:count]] * np.repeat(absmax, block)[:count]
        return rounded(values, state.get("dtype", "float32")).reshape(shape)

    # -- one weight's state ---------------------------------------------------------------------
    def _state(self, name: str) -> dict:
        raw = np.asarray(self._inner.stored(self._states[name])).reshape(-1).astype(np.uint8)
        try:
            state = json.loads(bytes(raw.tolist()).decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModelLoadError(f"{self._dir}: {self._states[name]} is not bitsandbytes' JSON quant state ({e}); "
                                 "re-download the checkpoint") from None
        missing = [k for k in ("quant_type", "blocksize", "shape") if k not in state]
        if missing or state["quant_type"] not in ("nf4", "fp4") or len(state["shape"]) != 2:
            raise ModelLoadError(f"{self._dir}: {self._states[name]} lacks {missing or 'a nf4 / fp4 2-D weight'}; "
                                 "re-download the checkpoint")
        return state

    def _side(self, name: str, side: str, size: int | None = None) -> np.ndarray:
        try:
            a = np.asarray(self._inner.get(f"{name}.{side}"), np.float32).reshape(-1)
        except KeyError:
            raise ModelLoadError(f"{self._dir}: {name} has no {name}.{side} beside it; the bitsandbytes checkpoint "
                                 "is incomplete, re-download it") from None
        if size is not None and a.size != size:
            raise ModelLoadError(f"{self._dir}: {name}.{side} holds {a.size} values, not {size}")
        return a

    def _absmax(self, name: str, state: dict, blocks: int) -> np.ndarray:
        """Each block's scale, float32 [blocks]: stored, or decoded from its 8-bit blockwise codes."""
        if f"{name}.absmax" not in self._all:
            raise ModelLoadError(f"{self._dir}: {name} has no {name}.absmax beside it; re-download the checkpoint")
        stored = np.asarray(self._inner.stored(f"{name}.absmax")).reshape(-1)
        if stored.size != blocks:
            raise ModelLoadError(f"{self._dir}: {name}.absmax holds {stored.size} scales, not {blocks}")
        if stored.dtype != np.uint8:                                   # plain float32 scales
            return np.asarray(self._inner.get(f"{name}.absmax"), np.float32).reshape(-1)
        nested_block = int(state.get("nested_blocksize", 256))
        table = self._side(name, "nested_quant_map", 256)
        scales = self._side(name, "nested_absmax", -(-blocks // nested_block))
        offset = np.float32(state.get("nested_offset", 0.0))
        return (table[stored] * np.repeat(scales, nested_block)[:blocks] + offset).astype(np.float32)


def rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to `dtype` ("float16", "bfloat16": to nearest even; bitsandbytes' state dtype,
    RecurrentGemma's bfloat16 constant), as float32."""
    if dtype == "float16":
        return values.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":                                    # round to nearest even on the top 16 bits
        bits = values.astype(np.float32).view(np.uint32)
        bits = (bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)
        return bits.view(np.float32)
    return values.astype(np.float32)
