"""EleutherAI GPT-Neo (125M, 1.3B, 2.7B): GPT-2's shape as plain Linear weights — learned absolute
positions, LayerNorm, a tanh-GELU MLP not gated, a tied head — with attention scores left unscaled
(no head_dim ** -0.5), no biases on q, k and v (one on the output projection), and layers alternating
global attention and local attention over the last `window_size` tokens (`attention_layers`, else
`attention_types` expanded)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, LayerAttention, WeightMap, \
    decoder_weight_map
from .config import ConfigField, fields_with, one_of
from .gpt2 import ACTIVATIONS
from .layers import Flags

NAMES = dict(LLAMA_NAMES, embed_tokens="transformer.wte", embed_positions="transformer.wpe", norm="transformer.ln_f",
             layer="transformer.h.{i}", input_layernorm="ln_1", post_attention_layernorm="ln_2",
             q_proj="attn.attention.q_proj", k_proj="attn.attention.k_proj", v_proj="attn.attention.v_proj",
             o_proj="attn.attention.out_proj", up_proj="mlp.c_fc", down_proj="mlp.c_proj")


@dataclass(frozen=True)
class GPTNeoConfig(DecoderConfig):
    activation: str = "gelu_tanh"
    window_size: int = 256
    local_layers: tuple[int, ...] = ()

    ARCH: ClassVar[str] = "gpt_neo"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("intermediate_size", ("intermediate_size",), default=None),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("activation", ("activation_function",), default="gelu_new"),
        ConfigField("window_size", ("window_size",), default=256))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        kinds = hf.get("attention_layers") or [kind for group, repeat in hf.get("attention_types", [[["global"], n]])
                                               for _ in range(repeat) for kind in group]
        if len(kinds) != n or set(kinds) - {"global", "local"}:
            raise ValueError(f"attention_layers must list 'global' or 'local' for each of the {n} layers; got {kinds}")
        local = tuple(i for i, k in enumerate(kinds) if k == "local") if values["window_size"] < \
            values["context_window_size"] else ()
        return dict(values, activation=one_of(ACTIVATIONS, values["activation"], "activation_function", cls.ARCH),
                    intermediate_size=values["intermediate_size"] or 4 * values["hidden_size"], local_layers=local)

    def flags(self) -> Flags:
        return Flags(norm="layer", activation=self.activation, gated_mlp=False, o_bias=True, mlp_bias=True,
                     learned_positions=True, attn_scale=1.0)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return tuple(LayerAttention("sliding", self.window_size) if i in self.local_layers else LayerAttention()
                     for i in range(self.num_hidden_layers))


GPTNeoForCausalLM = CausalLM


def weight_map(c: GPTNeoConfig) -> WeightMap:
    return decoder_weight_map(c, NAMES)
