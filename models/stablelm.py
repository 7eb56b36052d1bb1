"""StableLM 2 / StableLM 3B (Stability AI): a Llama with LayerNorm (weight and bias) for every norm,
optional q/k/v biases (`use_qkv_bias`) and RoPE on the first `partial_rotary_factor` of each head
(a quarter in released checkpoints). The parallel-residual and per-head q/k LayerNorm variants
(StableLM 2 12B) are refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, CausalLM, DecoderConfig, WeightMap, decoder_weight_map
from .config import ConfigField, fields_with
from .layers import Flags


@dataclass(frozen=True)
class StableLmConfig(DecoderConfig):
    qkv_bias: bool = False

    ARCH: ClassVar[str] = "stablelm"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("norm_eps", ("layer_norm_eps",), default=1e-5),
        ConfigField("qkv_bias", ("use_qkv_bias",), default=False))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        for option in ("use_parallel_residual", "qk_layernorm"):
            if hf.get(option):
                raise ValueError(f"StableLM with {option} is not supported yet (StableLM 2 1.6B and 3B have "
                                 f"neither); load one without it")
        return values

    def flags(self) -> Flags:
        return Flags(norm="layer", qkv_bias=self.qkv_bias)


StableLmForCausalLM = CausalLM


def weight_map(c: StableLmConfig) -> WeightMap:
    return decoder_weight_map(c)
