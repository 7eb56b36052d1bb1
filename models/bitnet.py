"""Microsoft BitNet b1.58 (bitnet-b1.58-2B-4T and its -bf16 master weights): a Llama with ternary weights and 8-bit
activations, a squared-ReLU gated MLP (SiLU in 1bitLLM's bitnet_b1_58, which llama.cpp's GGUF bitnet holds) and two
more RMSNorms a layer: on the attention output before o_proj
(attn_sub_norm) and on the MLP's hidden before down_proj (ffn_sub_norm).

Where config.json's quantization_config says quant_method "bitnet" (transformers' BitLinear / AutoBitLinear), every
decoder Linear quantizes its input a token at a time, x -> round(x * s) / s with s = 127 / max|x| (Flags.act_quant:
models/layers.py act_quant), and its weight is ternary times one scale a tensor:

    linear_class bitlinear (the default; offline)    weight uint8 [out / 4, in], four rows a byte (row r + k *
                                                     out / 4 in bits 2k, 2k + 1; codes 0, 1, 2 for -1, 0, 1);
                                                     the output divided by weight_scale
    autobitlinear, offline                           the same codes (or already unpacked), the output times
                                                     weight_scale
    autobitlinear, online                            float weights, made ternary as transformers does in every
                                                     forward: W -> round(W * s).clip(-1, 1) / s, s = 1 / mean|W|

kiln folds each tensor's scale into its ternary values at load (the weights then hold t / scale, t * scale or
the online rounding's result), so any --quant stores them: as-stored keeps exactly the values transformers
multiplies by. The head stays a float Linear (transformers leaves lm_head unquantized). Without a bitnet
quantization_config the checkpoint is a plain float model: no activation quantization, as transformers runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import CausalLM, WeightMap, WeightSpec, decoder_weight_map, weight_spec
from .config import ConfigField
from .layers import Flags
from .llama import LlamaConfig

LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
VALUES_PER_BYTE = 4


@dataclass(frozen=True)
class BitNetConfig(LlamaConfig):
    activation: str = "relu2"               # the gated MLP's: relu2 (2B-4T) or silu (1bitLLM's bitnet_b1_58)
    ternary: str | None = None              # how the decoder Linears are stored: "bitlinear" (the output divided by
                                            # weight_scale), "autobitlinear" (times it), "online" (float weights
                                            # made ternary at load); None: a float model, no activation rounding

    ARCH: ClassVar[str] = "bitnet"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*LlamaConfig.FIELDS,
                                                 ConfigField("hidden_act", ("hidden_act",), default="relu2"))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        act = values.pop("hidden_act")
        if act not in ("relu2", "silu"):
            raise ValueError(f"BitNet with hidden_act {act!r} is not supported (relu2: bitnet-b1.58-2B-4T's; silu: "
                             "1bitLLM's bitnet_b1_58, as llama.cpp's GGUF bitnet); fix config.json")
        if values["attention_bias"] or values["mlp_bias"]:
            raise ValueError("BitNet with biases is not supported (the released models have none); fix config.json")
        qc = hf.get("quantization_config") or {}
        ternary = None
        if str(qc.get("quant_method", "")).lower() == "bitnet":
            if qc.get("use_rms_norm"):
                raise ValueError("BitNet quantization_config use_rms_norm (an RMSNorm inside each Linear) is not "
                                 "supported; load a checkpoint without it")
            kind, mode = qc.get("linear_class", "bitlinear"), qc.get("quantization_mode", "offline")
            if kind not in ("bitlinear", "autobitlinear") or mode not in ("offline", "online"):
                raise ValueError(f"BitNet quantization_config linear_class {kind!r}, quantization_mode {mode!r}: "
                                 "kiln reads bitlinear and autobitlinear, offline or online; fix config.json")
            if kind == "bitlinear" and mode == "online":
                raise ValueError("BitNet linear_class bitlinear holds packed ternary weights: quantization_mode "
                                 "'online' contradicts it (transformers runs BitLinear offline); fix config.json")
            ternary = "online" if mode == "online" else kind
            notes.append(f"BitNet {kind} ({mode}): ternary weights with their scales folded in, activations "
                         "rounded to 8 bits a token before each decoder Linear, as transformers computes")
        return super().adapt(dict(values, ternary=ternary, activation=act), hf, notes)

    def flags(self) -> Flags:
        return Flags(activation=self.activation, sub_norms=True, act_quant=self.ternary is not None)


BitNetForCausalLM = CausalLM


def unpack(packed: np.ndarray) -> np.ndarray:
    """transformers' unpack_weights: uint8 [rows, in] -> the ternary float32 [4 rows, in] (-1, 0, 1)."""
    packed = np.asarray(packed).astype(np.uint8)
    parts = [((packed >> (2 * k)) & 3).astype(np.float32) - 1.0 for k in range(VALUES_PER_BYTE)]
    return np.concatenate(parts, axis=0)


def ternary_of(weight: np.ndarray, scale: np.ndarray | None, kind: str, rows: int) -> np.ndarray:
    """One checkpoint Linear's weight ([rows, in] as transformers multiplies by it, float32), from its stored
    form: packed where it has a quarter of the rows (the reader may hand the bytes over as floats)."""
    w = np.asarray(weight)
    if kind == "online":                    # transformers' WeightQuant, in float32
        w = w.astype(np.float32)
        s = np.float32(1.0) / np.maximum(np.abs(w).mean(dtype=np.float32), np.float32(1e-5))
        return np.clip(np.round(w * s), -1.0, 1.0) / s
    if w.shape[0] * VALUES_PER_BYTE == rows:
        w = unpack(w)
    elif w.shape[0] != rows:
        raise ValueError(f"a BitNet weight of {w.shape[0]} rows where its Linear has {rows} (or a quarter packed)")
    w = w.astype(np.float32)
    s = np.float32(np.asarray(scale, np.float32).reshape(-1)[0])
    return w / s if kind == "bitlinear" else w * s


def weight_map(c: BitNetConfig) -> WeightMap:
    m = decoder_weight_map(c)
    for i in range(c.num_hidden_layers):
        k = f"model.layers.{i}"
        for norm in ("self_attn.attn_sub_norm", "mlp.ffn_sub_norm"):
            m[f"{k}.{norm}.weight"] = [f"{k}.{norm}.weight"]
        if c.ternary is None:
            continue
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        rows = {"self_attn.qkv_proj": (q, kv, kv), "self_attn.o_proj": (c.hidden_size,),
                "mlp.gate_up_proj": (c.intermediate_size,) * 2, "mlp.down_proj": (c.hidden_size,)}
        for linear in LINEARS:
            names = weight_spec(m[f"{k}.{linear}.weight"]).hf_names
            scaled = c.ternary != "online"
            hf = tuple(n for name in names for n in ((name, name.replace(".weight", ".weight_scale")) if scaled
                                                     else (name,)))
            m[f"{k}.{linear}.weight"] = WeightSpec(hf, _ternary(c.ternary, scaled, rows[linear]), apart=True)
    return m


def _ternary(kind: str, scaled: bool, rows: tuple[int, ...]):
    def transform(tensors: list[np.ndarray]) -> np.ndarray:
        pairs = zip(tensors[::2], tensors[1::2]) if scaled else ((t, None) for t in tensors)
        return np.concatenate([ternary_of(w, s, kind, n) for (w, s), n in zip(pairs, rows)], axis=0)
    return transform
