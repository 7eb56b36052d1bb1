"""NVIDIA Nemotron (Nemotron-3 / Minitron / Nemotron-Mini) and Arcee AFM: decoders whose MLP is not
gated, down(relu(up(x))^2). Nemotron adds LayerNorm with a bias and a (1 + w) scale ("LayerNorm1P")
for every norm, and RoPE on the first `partial_rotary_factor` (0.5 by default) of each head; Arcee is
otherwise a Llama (RMSNorm, every head's dims rotated, YaRN scaling in released configs); Jais 2
(Inception / MBZUAI) one with plain LayerNorm (a bias, no 1 + w)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import CausalLM, WeightMap, decoder_weight_map
from .config import ConfigField, fields_with, one_of
from .layers import Flags
from .llama import LlamaConfig

ACTIVATIONS = {"relu2": "relu2"}


@dataclass(frozen=True)
class ArceeConfig(LlamaConfig):
    ARCH: ClassVar[str] = "arcee"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*LlamaConfig.FIELDS,
                                                 ConfigField("hidden_act", ("hidden_act",), default="relu2"))
    NORM: ClassVar[str] = "rms"

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        one_of(ACTIVATIONS, values.pop("hidden_act"), "hidden_act", cls.ARCH)
        return super().adapt(values, hf, notes)

    def flags(self) -> Flags:
        return Flags(norm=self.NORM, activation="relu2", gated_mlp=False, qkv_bias=self.attention_bias,
                     o_bias=self.attention_bias, mlp_bias=self.mlp_bias)


@dataclass(frozen=True)
class NemotronConfig(ArceeConfig):
    ARCH: ClassVar[str] = "nemotron"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        ArceeConfig.FIELDS, ConfigField("partial_rotary_factor", ("partial_rotary_factor",), default=0.5))
    NORM: ClassVar[str] = "layer_1p"


@dataclass(frozen=True)
class Jais2Config(ArceeConfig):
    ARCH: ClassVar[str] = "jais2"
    NORM: ClassVar[str] = "layer"


ArceeForCausalLM = NemotronForCausalLM = Jais2ForCausalLM = CausalLM


def weight_map(c: ArceeConfig) -> WeightMap:
    return decoder_weight_map(c)
