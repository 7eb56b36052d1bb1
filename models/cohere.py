"""Cohere Command-R / Aya (`cohere`) and Command R7B / Aya Vision's text model (`cohere2`): attention and
MLP side by side behind one LayerNorm without a bias (x + attn(n(x)) + mlp(n(x))), the logits scaled
by `logit_scale`, a tied head, and RoPE rotating adjacent pairs of dims (kiln reorders the q and k rows
as it loads them: causal_lm.rope_halves). Command R7B's layers are 3 sliding-window ones with RoPE to
each global one without any (`layer_types`, else every `sliding_window_pattern`-th is global).
Command-R+ (`use_qk_norm`) LayerNorms q and k per head before RoPE, each head with its own weight."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, CausalLM, DecoderConfig, LayerAttention, WeightMap, attention_by_type, \
    decoder_weight_map
from .config import ConfigField, fields_with, layer_types
from .layers import Flags


@dataclass(frozen=True)
class CohereConfig(DecoderConfig):
    logit_scale: float = 0.0625
    attention_bias: bool = False            # q, k, v and o
    use_qk_norm: bool = False

    ARCH: ClassVar[str] = "cohere"
    ADJACENT_ROPE: ClassVar[bool] = True
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("logit_scale", ("logit_scale",), default=0.0625),
        ConfigField("attention_bias", ("attention_bias",), default=False),
        ConfigField("use_qk_norm", ("use_qk_norm",), default=False))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if not values["logit_scale"]:
            raise ValueError(f"logit_scale {values['logit_scale']!r} would zero every logit; fix config.json")
        return values

    def flags(self) -> Flags:
        return Flags(norm="layer_nobias", qkv_bias=self.attention_bias, o_bias=self.attention_bias,
                     parallel_residual=True, shared_norm=True, logit_divisor=1.0 / self.logit_scale,
                     qk_norm=self.use_qk_norm, qk_norm_head_weights=True)


@dataclass(frozen=True)
class Cohere2Config(CohereConfig):
    sliding_window: int | None = 4096
    layer_types: tuple[str, ...] = ()

    ARCH: ClassVar[str] = "cohere2"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *CohereConfig.FIELDS, ConfigField("sliding_window", ("sliding_window",), default=4096),
        ConfigField("layer_types", ("layer_types",), default=None))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        types = layer_types(values["layer_types"], values["num_hidden_layers"], hf, pattern=4)
        # transformers' Cohere2 has no q/k norms, whatever config.json says
        return super().adapt(dict(values, layer_types=types, use_qk_norm=False), hf, notes)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        """Sliding layers rotate q and k; global ones attend with no positions at all."""
        window = self.sliding_window if self.sliding_window and self.sliding_window < self.context_window_size else None
        return attention_by_type(self.layer_types, window,
                                 lambda t: (self.rope_theta, self.rope_scaling, t == "sliding_attention"))


CohereForCausalLM = Cohere2ForCausalLM = CausalLM


def weight_map(c: CohereConfig) -> WeightMap:
    return decoder_weight_map(c)
