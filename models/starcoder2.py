"""StarCoder2 (BigCode): a Llama with LayerNorm (weight and bias) for every norm, biases on every
projection (`use_bias`), a plain tanh-GELU MLP (`c_fc`, `c_proj`) and, where `sliding_window` is
below the context, sliding-window attention on every layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, LayerAttention, WeightMap, \
    decoder_weight_map
from .config import ConfigField, fields_with, one_of, window_of
from .gpt2 import ACTIVATIONS
from .layers import Flags

NAMES = dict(LLAMA_NAMES, up_proj="mlp.c_fc", down_proj="mlp.c_proj")


@dataclass(frozen=True)
class Starcoder2Config(DecoderConfig):
    use_bias: bool = True
    activation: str = "gelu_tanh"
    sliding_window: int | None = None

    ARCH: ClassVar[str] = "starcoder2"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("norm_eps", ("norm_epsilon",), default=1e-5),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("use_bias", ("use_bias",), default=True),
        ConfigField("activation", ("hidden_act",), default="gelu_pytorch_tanh"),
        ConfigField("sliding_window", ("sliding_window",), default=None))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        activation = one_of(ACTIVATIONS, values["activation"], "hidden_act", cls.ARCH)
        return dict(values, activation=activation, sliding_window=window_of(values))

    def flags(self) -> Flags:
        return Flags(norm="layer", activation=self.activation, gated_mlp=False, qkv_bias=self.use_bias,
                     o_bias=self.use_bias, mlp_bias=self.use_bias)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        kind = "sliding" if self.sliding_window else "full"
        return (LayerAttention(kind, self.sliding_window, self.rope_theta, self.rope_scaling),) * self.num_hidden_layers


Starcoder2ForCausalLM = CausalLM


def weight_map(c: Starcoder2Config) -> WeightMap:
    return decoder_weight_map(c, NAMES)
