"""AI2 OLMo (1: OLMo-1B / 7B, OLMo 1.7): a Llama whose norms are LayerNorms without any weight or
bias (eps 1e-5, fixed), with q, k and v clamped to [-clip_qkv, clip_qkv] where the config sets it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import CausalLM, WeightMap, decoder_weight_map
from .config import ConfigField
from .layers import Flags
from .llama import LlamaConfig

OLMO_NORM_EPS = 1e-5                        # OlmoLayerNorm's, whatever config.json says


@dataclass(frozen=True)
class OlmoConfig(LlamaConfig):
    clip_qkv: float | None = None

    ARCH: ClassVar[str] = "olmo"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*LlamaConfig.FIELDS,
                                                 ConfigField("clip_qkv", ("clip_qkv",), default=None))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        clip = values["clip_qkv"]
        if clip is not None and clip <= 0:
            raise ValueError(f"clip_qkv {clip} must be above 0 (or null); fix config.json")
        return super().adapt(dict(values, norm_eps=OLMO_NORM_EPS), {**hf, "clip_qkv": None}, notes)

    def flags(self) -> Flags:
        return Flags(norm="layer_noparam", qkv_bias=self.attention_bias, o_bias=self.attention_bias,
                     clip_qkv=self.clip_qkv)


OlmoForCausalLM = CausalLM


def weight_map(c: OlmoConfig) -> WeightMap:
    return decoder_weight_map(c)
