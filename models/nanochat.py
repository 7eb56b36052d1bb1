"""Karpathy's nanochat (karpathy/nanochat-d20, -d32 as transformers writes them): a Llama whose every
norm is an RMSNorm without a weight, the embeddings normed before the first layer, q and k normed
per head after RoPE (RoPE then in the graph), a relu^2 MLP not gated (fc1, fc2), and the final logits
soft-capped (`final_logit_softcapping`, 15). Its RoPE turns the other way (rotate_half is (x2, -x1)):
kiln negates the second half of each q and k head's rows as they load, which turns kiln's RoPE into
nanochat's with those halves negated in q and k alike, so every score q.k, and each head's RMS, is the
checkpoint's (exact)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import LLAMA_NAMES, CausalLM, WeightMap, WeightSpec, decoder_weight_map
from .config import ConfigField, one_of
from .layers import Flags
from .llama import LlamaConfig

NAMES = dict(LLAMA_NAMES, up_proj="mlp.fc1", down_proj="mlp.fc2")
ACTIVATIONS = {"relu2": "relu2", "relu": "relu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}


@dataclass(frozen=True)
class NanoChatConfig(LlamaConfig):
    activation: str = "relu2"
    final_logit_softcapping: float | None = 15.0

    ARCH: ClassVar[str] = "nanochat"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *LlamaConfig.FIELDS, ConfigField("activation", ("hidden_act",), default="relu2"),
        ConfigField("final_logit_softcapping", ("final_logit_softcapping",), default=None))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        activation = one_of(ACTIVATIONS, values["activation"], "hidden_act", cls.ARCH)
        if values["partial_rotary_factor"] != 1.0:
            raise ValueError("nanochat with partial_rotary_factor is not supported (its RoPE turns whole heads)")
        return super().adapt(dict(values, activation=activation), hf, notes)

    def flags(self) -> Flags:
        return Flags(norm="rms_noparam", activation=self.activation, gated_mlp=False, qkv_bias=self.attention_bias,
                     o_bias=self.attention_bias, qk_norm=True, qk_norm_after_rope=True, embed_norm=True,
                     final_logit_softcap=self.final_logit_softcapping)


NanoChatForCausalLM = CausalLM


def _second_halves_negated(c: NanoChatConfig):
    """q/k/v rows with the second half of each q and k head negated (v's rows as they are)."""
    d, rotated = c.head_dim, c.num_attention_heads + c.num_key_value_heads
    sign = np.ones((rotated + c.num_key_value_heads) * d, np.float32)
    for h in range(rotated):
        sign[h * d + d // 2:(h + 1) * d] = -1.0
    return lambda rows: (rows * sign.reshape(-1, *[1] * (rows.ndim - 1))).astype(rows.dtype)


def weight_map(c: NanoChatConfig) -> WeightMap:
    m = decoder_weight_map(c, NAMES)
    for i in range(c.num_hidden_layers):
        for p in ("weight", "bias") if c.attention_bias else ("weight",):
            key = f"model.layers.{i}.self_attn.qkv_proj.{p}"
            m[key] = WeightSpec(tuple(m[key]), _second_halves_negated(c))
    return m
