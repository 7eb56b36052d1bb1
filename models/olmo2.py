"""OLMo 2 (AI2): a Llama whose norms come after attention and MLP instead of before (each block's
output is normed, then added), and whose q and k are RMS-normed over all heads' dims at once
(`q_norm` [heads x head_dim]) before RoPE. OLMo 3 adds sliding-window attention on 3 of every 4
layers (`layer_types`), the full ones alone taking a RoPE scaling (YaRN in the long-context
checkpoints). EXAONE 4.0 (LG) norms the same way but q and k per head, and where it has a
`sliding_window` its full layers attend without RoPE (as Command R7B's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import LLAMA_NAMES, CausalLM, LayerAttention, WeightMap, decoder_weight_map, \
    local_rope_on_sliding, rope_on_sliding_only
from .config import ConfigField, layer_types, split_layer_rope, window_of
from .layers import Flags
from .llama import LlamaConfig

# kiln's post_attn_norm / post_mlp_norm are OLMo 2's post_attention_layernorm / post_feedforward_layernorm.
NAMES = dict(LLAMA_NAMES, post_attn_norm="post_attention_layernorm", post_mlp_norm="post_feedforward_layernorm")


@dataclass(frozen=True)
class Olmo2Config(LlamaConfig):
    ARCH: ClassVar[str] = "olmo2"
    QK_NORM_HEADS: ClassVar[bool] = False

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, mlp_bias=self.mlp_bias,
                     pre_norms=False, sandwich_norms=True, qk_norm=True, qk_norm_heads=self.QK_NORM_HEADS)


@dataclass(frozen=True)
class Olmo3Config(Olmo2Config):
    local_rope_theta: float = 500000.0

    ARCH: ClassVar[str] = "olmo3"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *Olmo2Config.FIELDS, ConfigField("local_rope_theta", ("rope_local_base_freq",), default=None))

    @classmethod
    def from_hf(cls, hf: dict) -> "Olmo3Config":
        hf = {"sliding_window": 4096, **split_layer_rope(hf, full_theta=500000.0, local_theta=500000.0)}
        return super().from_hf(hf)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        types = layer_types(values["layer_types"], values["num_hidden_layers"], hf, pattern=4)
        local = values["local_rope_theta"]
        return dict(values, sliding_window=window_of(values), layer_types=types,
                    local_rope_theta=values["rope_theta"] if local is None else local)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return local_rope_on_sliding(self)


@dataclass(frozen=True)
class ExaoneLayers:
    """EXAONE's layers (4.0 and K-EXAONE; a mixin before the Llama config): where config.json has a window
    (4096 where unwritten, transformers' default), every `sliding_window_pattern`-th layer is global and
    attends without RoPE, the others slide with it. The window and layer kinds are read here alone."""

    nope_full_layers: bool = False          # full layers attend without RoPE (wherever config.json sets a window)

    @classmethod
    def from_hf(cls, hf: dict):
        return super().from_hf({"sliding_window": 4096, **hf})

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        window = values["sliding_window"]
        if window is None:
            return dict(values, layer_types=())
        types = layer_types(values["layer_types"], values["num_hidden_layers"], hf, pattern=4)
        sliding = window < values["context_window_size"]
        return dict(values, sliding_window=window if sliding else None, layer_types=types, nope_full_layers=True)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        if not self.nope_full_layers:
            return super().layer_attention()
        return rope_on_sliding_only(self)


@dataclass(frozen=True)
class Exaone4Config(ExaoneLayers, Olmo2Config):
    ARCH: ClassVar[str] = "exaone4"
    QK_NORM_HEADS: ClassVar[bool] = True


Olmo2ForCausalLM = Olmo3ForCausalLM = Exaone4ForCausalLM = CausalLM


def weight_map(c: Olmo2Config) -> WeightMap:
    return decoder_weight_map(c, NAMES)
