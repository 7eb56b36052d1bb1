"""Gemma, Gemma 2 and Gemma 3 (text): the causal-LM base with Gemma's choices switched on.

All three: embeddings scaled by sqrt(hidden), RMSNorm as x/rms * (1 + w), tanh-GELU gating, norms before
and after attention and MLP, softmax scale query_pre_attn_scalar ** -0.5, a tied head, and layers
that alternate sliding-window and global attention (`layer_types`, else the family's pattern).
Gemma (1, and CodeGemma) stops there: every layer global, one norm before attention and one
before the MLP, nothing capped.
Gemma 2 soft-caps the final logits and the attention scores (the latter inside the target's
attention kernels: kiln's take the cap, TVM's get it written into their score store,
targets/attention_softcap.py; a target whose kernels could not refuses the model,
TargetProfile.attn_softcap).
Gemma 3 drops soft-capping for a per-head QK norm, and gives sliding layers their own RoPE base
(`rope_local_base_freq`) while global layers may scale theirs: RoPE is then applied in the graph.
VaultGemma is Gemma 2 with only the norms before attention and MLP.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, LayerAttention, WeightMap, \
    attention_by_type, decoder_weight_map, prefixed_names
from .config import ConfigField, fields_with, layer_types, one_of, split_layer_rope, text_model, window_of
from .layers import Flags

# HF Gemma names for the four norms of a layer (kiln: input, post_attention = before the MLP,
# post_attn = on the attention output, post_mlp = on the MLP output).
NAMES = dict(LLAMA_NAMES, post_attention_layernorm="pre_feedforward_layernorm",
             post_attn_norm="post_attention_layernorm", post_mlp_norm="post_feedforward_layernorm")
ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh", "gelu": "gelu"}

_GEMMA_FIELDS = fields_with(
    DECODER_FIELDS, ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
    ConfigField("query_pre_attn_scalar", ("query_pre_attn_scalar",), default="head_dim"),
    ConfigField("sliding_window", ("sliding_window",), default=None),
    ConfigField("layer_types", ("layer_types",), default=None),
    ConfigField("activation", ("hidden_activation", "hidden_act"), default="gelu_pytorch_tanh"),
    ConfigField("final_logit_softcapping", ("final_logit_softcapping",), default=None),
    ConfigField("attn_logit_softcapping", ("attn_logit_softcapping",), default=None),
)


@dataclass(frozen=True)
class Gemma2Config(DecoderConfig):
    query_pre_attn_scalar: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    activation: str = "gelu_tanh"
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None

    ARCH: ClassVar[str] = "gemma2"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = _GEMMA_FIELDS
    PATTERN: ClassVar[int] = 2                  # every PATTERN-th layer is global (Gemma 2: odd layers)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        activation = one_of(ACTIVATIONS, values["activation"], "hidden_activation", cls.ARCH)
        types = layer_types(values["layer_types"], values["num_hidden_layers"], hf, cls.PATTERN)
        if values["query_pre_attn_scalar"] is None:
            values["query_pre_attn_scalar"] = values["head_dim"]
        return dict(values, layer_types=types, activation=activation)

    def flags(self) -> Flags:
        return Flags(norm="rms_1p", activation=self.activation, sandwich_norms=True, embed_scale=self.hidden_size ** 0.5,
                     qk_norm=self.ARCH == "gemma3", final_logit_softcap=self.final_logit_softcapping,
                     attn_logit_softcap=self.attn_logit_softcapping,
                     query_pre_attn_scalar=self.query_pre_attn_scalar)

    def layer_rope(self, kind: str) -> tuple[float, dict | None]:
        return self.rope_theta, self.rope_scaling

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        window = window_of(vars(self))
        return attention_by_type(self.layer_types, window, self.layer_rope)


@dataclass(frozen=True)
class GemmaConfig(Gemma2Config):
    ARCH: ClassVar[str] = "gemma"
    PATTERN: ClassVar[int] = 1                  # every layer global

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("use_bidirectional_attention"):
            raise ValueError("Gemma with use_bidirectional_attention (an embedding model) is not a causal LM; "
                             "load a causal checkpoint")
        return super().adapt(values, hf, notes)

    def flags(self) -> Flags:
        return Flags(norm="rms_1p", activation=self.activation, embed_scale=self.hidden_size ** 0.5)


@dataclass(frozen=True)
class VaultGemmaConfig(Gemma2Config):
    """VaultGemma (Google's differentially private Gemma): Gemma 2 without the norms on the attention and
    MLP outputs."""

    ARCH: ClassVar[str] = "vaultgemma"

    def flags(self) -> Flags:
        return dataclasses.replace(super().flags(), sandwich_norms=False)


@dataclass(frozen=True)
class Gemma3Config(Gemma2Config):
    local_rope_theta: float = 10000.0
    weight_prefix: str = "model"

    ARCH: ClassVar[str] = "gemma3"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *_GEMMA_FIELDS, ConfigField("local_rope_theta", ("rope_local_base_freq",), default=10000.0))
    PATTERN: ClassVar[int] = 6
    ROPE_TYPES: ClassVar[tuple[str, ...]] = ("default", "linear")

    @classmethod
    def from_hf(cls, hf: dict) -> "Gemma3Config":
        """Gemma3ForConditionalGeneration keeps the text model's config under `text_config` and its weights
        under language_model (transformers 4 names) or model.language_model (transformers 5)."""
        hf, prefix = text_model(hf)
        c = super().from_hf(split_layer_rope(hf, full_theta=1e6, local_theta=10000.0))
        return dataclasses.replace(c, weight_prefix=prefix)

    def layer_rope(self, kind: str) -> tuple[float, dict | None]:
        return (self.local_rope_theta, None) if kind == "sliding_attention" else (self.rope_theta, self.rope_scaling)


GemmaForCausalLM = Gemma2ForCausalLM = Gemma3ForCausalLM = VaultGemmaForCausalLM = CausalLM


def weight_map(c: Gemma2Config) -> WeightMap:
    if isinstance(c, GemmaConfig):                      # Llama's two norms a layer
        return decoder_weight_map(c)
    return decoder_weight_map(c, prefixed_names(NAMES, getattr(c, "weight_prefix", "model")))
