"""Phi-1 / Phi-1.5 / Phi-2 (Microsoft): one LayerNorm feeding attention and MLP side by side (x +
attn(n(x)) + mlp(n(x))), biases on every projection and on the head, a plain tanh-GELU MLP (`fc1`,
`fc2`) and RoPE on the first `partial_rotary_factor` of each head. Per-head q/k LayerNorm
(`qk_layernorm`, off in released checkpoints) is refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, WeightMap, decoder_weight_map
from .config import ConfigField, fields_with, one_of
from .gpt2 import ACTIVATIONS
from .layers import Flags

NAMES = dict(LLAMA_NAMES, norm="model.final_layernorm", o_proj="self_attn.dense", up_proj="mlp.fc1",
             down_proj="mlp.fc2")


@dataclass(frozen=True)
class PhiConfig(DecoderConfig):
    activation: str = "gelu_tanh"

    ARCH: ClassVar[str] = "phi"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("norm_eps", ("layer_norm_eps",), default=1e-5),
        ConfigField("activation", ("hidden_act",), default="gelu_new"))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        activation = one_of(ACTIVATIONS, values["activation"], "hidden_act", cls.ARCH)
        if hf.get("qk_layernorm"):
            raise ValueError("phi with qk_layernorm is not supported yet (released Phi-1/1.5/2 have none); "
                             "load one without it")
        return dict(values, activation=activation)

    def flags(self) -> Flags:
        return Flags(norm="layer", activation=self.activation, gated_mlp=False, qkv_bias=True, o_bias=True,
                     mlp_bias=True, parallel_residual=True, shared_norm=True, head_bias=True)


PhiForCausalLM = CausalLM


def weight_map(c: PhiConfig) -> WeightMap:
    return decoder_weight_map(c, NAMES)
