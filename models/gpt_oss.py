"""OpenAI gpt-oss: a decoder whose every layer's attention has sinks (a learned logit per head in each
softmax: over the KV cache kiln owns, models/owned_kv.py), q/k/v/o biases, sliding layers (by default
every other one, from the first) among full ones, YaRN RoPE (in the graph), and on every layer a
sparse mixture of `num_local_experts` experts:

    logits  = x @ router.T + router_bias; the top `num_experts_per_tok`, weighted by their softmax
    expert  = down(act(gate_up(x) + b_gate_up)) + b_down,   gate and up interleaved (gate the even
              rows), act = (clip(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)

Checkpoints store the experts as 3-D tensors, in transformers' layout (gate_up_proj [experts, hidden,
2 x ffn], down_proj [experts, ffn, hidden], biases beside them) or, as OpenAI released them, in MXFP4
(`*_blocks`: two 4-bit e2m1 values a byte, the low nibble first; `*_scales`: a power of two a 32
values, biased by 127; rows the outputs): both are read (MXFP4 decoded exactly to float, then stored
by the --quant scheme).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import CausalLM, LayerAttention, WeightMap, WeightSpec, attention_by_type, decoder_weight_map
from .config import ConfigField, layer_types
from .layers import Flags
from .llama import LlamaConfig
from .moe import EXPERT_FIELDS, MoESpec

# e2m1: the 16 values a 4-bit MXFP4 code stands for (sign, two exponent bits, one mantissa bit)
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      np.float32)


@dataclass(frozen=True)
class GptOssConfig(LlamaConfig):
    num_experts: int = 128
    top_k: int = 4
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    mxfp4: bool = False                     # the experts stored in MXFP4 (quantization_config quant_method mxfp4)

    ARCH: ClassVar[str] = "gpt_oss"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *LlamaConfig.FIELDS, *EXPERT_FIELDS, ConfigField("swiglu_alpha", ("swiglu_alpha",), default=1.702),
        ConfigField("swiglu_limit", ("swiglu_limit",), default=7.0))

    @classmethod
    def from_hf(cls, hf: dict) -> "GptOssConfig":
        if hf.get("rope_parameters") is None and hf.get("rope_scaling") is None:    # transformers' default
            hf = {**hf, "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                            "truncate": False, "original_max_position_embeddings": 4096,
                                            "rope_theta": hf.get("rope_theta", 150000.0)}}
        return super().from_hf({"attention_bias": True, **hf})

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        types = tuple(values["layer_types"] or ("sliding_attention" if (i + 1) % 2 else "full_attention"
                                                for i in range(n)))
        qc = hf.get("quantization_config") or {}
        values = dict(values, layer_types=layer_types(types, n, hf, pattern=2),
                      mxfp4=str(qc.get("quant_method", "")).lower() == "mxfp4")
        return super().adapt(values, {**hf, "layer_types": list(values["layer_types"])}, notes)

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, attn_sinks=True)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return attention_by_type(self.layer_types, self.sliding_window,
                                 lambda t: (self.rope_theta, self.rope_scaling))

    def layer_moe(self, layer: int) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.intermediate_size, normalize=True, router_bias=True,
                       expert_bias=True, clamped_glu=(self.swiglu_alpha, self.swiglu_limit))


GptOssForCausalLM = CausalLM


def mxfp4_decode(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 blocks [..., groups, 16] uint8 and scales [..., groups] uint8 -> float32 [..., groups * 32]:
    each byte two e2m1 codes (low nibble first), each group of 32 times 2^(scale - 127)."""
    blocks, scales = np.asarray(blocks, np.uint8), np.asarray(scales, np.uint8)
    if blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {blocks.shape} do not match their scales {scales.shape}")
    values = np.empty((*blocks.shape[:-1], blocks.shape[-1] * 2), np.float32)
    values[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    values[..., 1::2] = FP4_VALUES[blocks >> 4]
    values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
    return values.reshape(*blocks.shape[:-2], -1)


def _gate_then_up(rows: np.ndarray) -> np.ndarray:
    """[experts, 2 x ffn, ...] with gate and up rows interleaved -> each expert's gate rows, then its up
    rows (models/moe.py's order), experts one after another."""
    return np.ascontiguousarray(np.concatenate([rows[:, 0::2], rows[:, 1::2]], axis=1)).reshape(-1, *rows.shape[2:])


def _experts(c: GptOssConfig, experts: str) -> tuple[WeightSpec, WeightSpec]:
    """The experts' gate/up and down weights as kiln's expert Linears hold them ([experts x rows, cols]),
    from MXFP4 blocks and scales (rows the outputs) or transformers' [experts, inputs, outputs] tensors."""
    f = c.intermediate_size
    if c.mxfp4:
        return (WeightSpec((f"{experts}.gate_up_proj_blocks", f"{experts}.gate_up_proj_scales"),
                           lambda parts: _gate_then_up(mxfp4_decode(*parts)), apart=True),
                WeightSpec((f"{experts}.down_proj_blocks", f"{experts}.down_proj_scales"),
                           lambda parts: mxfp4_decode(*parts).reshape(-1, f), apart=True))
    return (WeightSpec((f"{experts}.gate_up_proj",), lambda w: _gate_then_up(w.transpose(0, 2, 1))),
            WeightSpec((f"{experts}.down_proj",), lambda w: np.ascontiguousarray(w.transpose(0, 2, 1)).reshape(-1, f)))


def weight_map(c: GptOssConfig) -> WeightMap:
    m = decoder_weight_map(c)
    for i in range(c.num_hidden_layers):
        k = f"model.layers.{i}"
        experts = f"{k}.mlp.experts"
        for key in [key for key in m if key.startswith(f"{k}.mlp.")]:
            del m[key]
        m[f"{k}.self_attn.sinks"] = [f"{k}.self_attn.sinks"]
        m[f"{k}.mlp.router"] = [f"{k}.mlp.router.weight"]
        m[f"{k}.mlp.router_bias"] = [f"{k}.mlp.router.bias"]
        m[f"{k}.mlp.experts_gate_up_bias"] = WeightSpec((f"{experts}.gate_up_proj_bias",),
                                                        lambda b: _gate_then_up(b).reshape(b.shape))
        m[f"{k}.mlp.experts_down_bias"] = [f"{experts}.down_proj_bias"]
        m[f"{k}.mlp.experts_gate_up.weight"], m[f"{k}.mlp.experts_down.weight"] = _experts(c, experts)
    return m
