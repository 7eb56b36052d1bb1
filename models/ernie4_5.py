"""Baidu ERNIE 4.5 (dense, e.g. ERNIE-4.5-0.3B): a Llama whose RoPE rotates adjacent pairs of each
head's dims (kiln reorders the q and k rows as it loads them: causal_lm.rope_halves) and whose
projections all carry biases, or none (`use_bias`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, CausalLM, DecoderConfig, WeightMap, decoder_weight_map
from .config import ConfigField, fields_with
from .layers import Flags


@dataclass(frozen=True)
class Ernie4_5Config(DecoderConfig):
    use_bias: bool = False

    ARCH: ClassVar[str] = "ernie4_5"
    ADJACENT_ROPE: ClassVar[bool] = True
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("use_bias", ("use_bias",), default=False))

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.use_bias, o_bias=self.use_bias, mlp_bias=self.use_bias)


Ernie4_5ForCausalLM = CausalLM


def weight_map(c: Ernie4_5Config) -> WeightMap:
    return decoder_weight_map(c)
