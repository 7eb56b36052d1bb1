"""Swiss AI Apertus (8B, 70B): a Llama whose q and k are RMS-normed per head before RoPE, whose norms
are named attention_layernorm / feedforward_layernorm, and whose MLP is not gated, down(xIELU(up(x))),
xIELU's alpha_p, alpha_n, beta and eps kept per layer (mlp.act_fn.*: models/layers.XIELU)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import LLAMA_NAMES, CausalLM, WeightMap, WeightSpec, decoder_weight_map
from .config import ConfigField, one_of
from .layers import Flags
from .llama import LlamaConfig

NAMES = dict(LLAMA_NAMES, input_layernorm="attention_layernorm", post_attention_layernorm="feedforward_layernorm")
ACTIVATIONS = {"xielu": "xielu", "relu2": "relu2", "silu": "silu", "gelu": "gelu"}


@dataclass(frozen=True)
class ApertusConfig(LlamaConfig):
    activation: str = "xielu"

    ARCH: ClassVar[str] = "apertus"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*LlamaConfig.FIELDS,
                                                 ConfigField("activation", ("hidden_act",), default="xielu"))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        activation = one_of(ACTIVATIONS, values["activation"], "hidden_act", cls.ARCH)
        return super().adapt(dict(values, activation=activation), hf, notes)

    def flags(self) -> Flags:
        return Flags(activation=self.activation, gated_mlp=False, qkv_bias=self.attention_bias,
                     o_bias=self.attention_bias, mlp_bias=self.mlp_bias, qk_norm=True)


ApertusForCausalLM = CausalLM


def _one(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).reshape(1)


def weight_map(c: ApertusConfig) -> WeightMap:
    m = decoder_weight_map(c, NAMES)
    if c.activation == "xielu":
        for i in range(c.num_hidden_layers):
            for p in ("alpha_p", "alpha_n", "beta", "eps"):
                m[f"model.layers.{i}.mlp.act_fn.{p}"] = WeightSpec((f"model.layers.{i}.mlp.act_fn.{p}",), _one)
    return m
