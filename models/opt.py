"""Meta OPT (facebook/opt-125m .. 66b; vLLM's first example model): GPT-2's shape with plain Linear
weights — learned absolute positions (the table's first 2 rows unused: OPT looks up position + 2),
LayerNorm with biases before attention and MLP, a ReLU MLP not gated, biases on every projection
(`enable_bias`), a tied head. OPT-350m's post-norm layers (`do_layer_norm_before` false) and its
project_in / project_out (`word_embed_proj_dim` below hidden_size) are refused. Microsoft's BioGPT (biogpt,
BioGPT-Large) is the same with GELU, embeddings scaled by sqrt(hidden) (`scale_embedding`) and LayerNorms of
epsilon 1e-5 whatever layer_norm_eps says (its code builds them with torch's default), under its own names."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, WeightMap, WeightSpec, \
    decoder_weight_map
from .config import ConfigField, fields_with, one_of
from .layers import Flags

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh"}
POSITION_OFFSET = 2                         # OPTLearnedPositionalEmbedding looks up position + 2
NAMES = dict(LLAMA_NAMES, embed_tokens="model.decoder.embed_tokens", embed_positions="model.decoder.embed_positions",
             norm="model.decoder.final_layer_norm", layer="model.decoder.layers.{i}",
             input_layernorm="self_attn_layer_norm", post_attention_layernorm="final_layer_norm",
             o_proj="self_attn.out_proj", up_proj="fc1", down_proj="fc2")


@dataclass(frozen=True)
class OPTConfig(DecoderConfig):
    activation: str = "relu"
    bias: bool = True

    ARCH: ClassVar[str] = "opt"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("intermediate_size", ("ffn_dim",)),
        ConfigField("norm_eps", ("layer_norm_eps",), default=1e-5),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("activation", ("activation_function",), default="relu"),
        ConfigField("bias", ("enable_bias",), default=True))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        for key, default in (("do_layer_norm_before", True), ("layer_norm_elementwise_affine", True),
                             ("_remove_final_layer_norm", False)):
            if hf.get(key, default) != default:
                raise ValueError(f"OPT with {key}={hf[key]} (OPT-350m's layout) is not supported (only {default})")
        if hf.get("word_embed_proj_dim", values["hidden_size"]) != values["hidden_size"]:
            raise ValueError("OPT with word_embed_proj_dim apart from hidden_size (project_in / project_out, "
                             "OPT-350m) is not supported")
        return dict(values, activation=one_of(ACTIVATIONS, values["activation"], "activation_function", cls.ARCH))

    def flags(self) -> Flags:
        return Flags(norm="layer", activation=self.activation, gated_mlp=False, qkv_bias=self.bias, o_bias=self.bias,
                     mlp_bias=self.bias, learned_positions=True)


@dataclass(frozen=True)
class BioGptConfig(OPTConfig):
    scale_embedding: bool = True

    ARCH: ClassVar[str] = "biogpt"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(DECODER_FIELDS, ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
                     ConfigField("activation", ("hidden_act",), default="gelu")),
        ConfigField("scale_embedding", ("scale_embedding",), default=True))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        return dict(values, norm_eps=1e-5, bias=True,          # nn.LayerNorm(hidden) everywhere: torch's epsilon
                    activation=one_of(ACTIVATIONS, values["activation"], "hidden_act", cls.ARCH))

    def flags(self) -> Flags:
        scale = float(np.sqrt(self.hidden_size)) if self.scale_embedding else None
        return dataclasses.replace(super().flags(), embed_scale=scale)


BIOGPT_NAMES = dict(NAMES, embed_tokens="biogpt.embed_tokens", embed_positions="biogpt.embed_positions",
                    norm="biogpt.layer_norm", layer="biogpt.layers.{i}", lm_head="output_projection")
OPTForCausalLM = BioGptForCausalLM = CausalLM


def _past_offset(table: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(table[POSITION_OFFSET:])


def weight_map(c: OPTConfig) -> WeightMap:
    names = BIOGPT_NAMES if isinstance(c, BioGptConfig) else NAMES
    m = decoder_weight_map(c, names)
    m["model.embed_positions.weight"] = WeightSpec((f"{names['embed_positions']}.weight",), _past_offset)
    return m
