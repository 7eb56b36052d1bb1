"""The Llama family: Llama 2/3 (RoPE scaling `llama3`), SmolLM2, TinyLlama, Mistral (sliding-window
attention on every layer when `sliding_window` is below the context, or on the layers `layer_types`
names: Ministral), and the Llamas under other names: InternLM 3 (`qkv_bias` / `bias`), IQuest-Coder,
Seed-OSS (q/k/v biases apart from o's: `attention_out_bias`), Meta's CWM (3 sliding layers to each
full one, full first; Llama 3 RoPE scaling by default), Ministral 3 (queries scaled by position) and
EXAONE 3.0 / 3.5 (LG AI Research: a Llama under GPT-2-like tensor and config names), XVERSE (a Llama under its own
name) and Orion (LayerNorms with biases).
The causal-LM base with Llama's defaults (models/causal_lm.py)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import (DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, LayerAttention, WeightMap,
                        WeightSpec, attention_by_type, decoder_weight_map, prefixed_names)
from .config import ConfigField, TextModelOf, fields_with, layer_types, one_of, window_of
from .layers import Flags
from .rope import query_temperature


@dataclass(frozen=True)
class LlamaConfig(DecoderConfig):
    attention_bias: bool = False            # q, k, v and o projections
    mlp_bias: bool = False
    sliding_window: int | None = None       # Mistral: every layer attends to the last this-many tokens
    layer_types: tuple[str, ...] = ()       # which layers slide where not every one does (Ministral, CWM)

    ARCH: ClassVar[str] = "llama"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*DECODER_FIELDS,
                                                 ConfigField("attention_bias", ("attention_bias",), default=False),
                                                 ConfigField("mlp_bias", ("mlp_bias",), default=False),
                                                 ConfigField("sliding_window", ("sliding_window",), default=None),
                                                 ConfigField("layer_types", ("layer_types",), default=None))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("clip_qkv") is not None:
            raise ValueError(f"{cls.ARCH} with clip_qkv is not supported (released checkpoints leave it null)")
        window, types, n = window_of(values), values["layer_types"], values["num_hidden_layers"]
        types = layer_types(types, n, hf, pattern=1) if window and types else ()
        if types and "sliding_attention" not in types:
            window, types = None, ()
        return dict(values, sliding_window=window, layer_types=() if set(types) == {"sliding_attention"} else types)

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, mlp_bias=self.mlp_bias)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        types = self.layer_types or ("sliding_attention",) * self.num_hidden_layers
        return attention_by_type(types, self.sliding_window, lambda t: (self.rope_theta, self.rope_scaling))


@dataclass(frozen=True)
class InternLM3Config(LlamaConfig):
    """InternLM 3: config.json names the q/k/v/o biases `qkv_bias` and the MLP's `bias`."""

    ARCH: ClassVar[str] = "internlm3"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        LlamaConfig.FIELDS, ConfigField("attention_bias", ("attention_bias", "qkv_bias"), default=False),
        ConfigField("mlp_bias", ("mlp_bias", "bias"), default=False))


@dataclass(frozen=True)
class InternLMConfig(LlamaConfig):
    """The first InternLM (its own code: InternLMForCausalLM; internlm-7b / -chat-7b / -20b): a Llama whose q, k, v
    and o have biases where config.json's `bias` says (the MLP none), its RoPE base as `rotary.base` where written.
    Its dynamic NTK scaling (`rotary.type` dynamic) turns RoPE only past max_position_embeddings, the context kiln
    serves: within it, plain RoPE."""

    ARCH: ClassVar[str] = "internlm"
    ROPE_TYPES: ClassVar[tuple[str, ...]] = (*LlamaConfig.ROPE_TYPES, "dynamic")
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        LlamaConfig.FIELDS, ConfigField("attention_bias", ("bias", "attention_bias"), default=True))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        rotary = hf.get("rotary") or {}
        if rotary.get("type", "dynamic") not in ("dynamic", "origin", "default"):
            raise ValueError(f"InternLM's rotary type {rotary['type']!r} is not supported (dynamic NTK, which is plain "
                             "RoPE within the context, or origin)")
        values = dict(values, rope_theta=float(rotary.get("base", values["rope_theta"])), mlp_bias=False)
        return super().adapt(values, hf, notes)


@dataclass(frozen=True)
class InternLM2Config(LlamaConfig):
    """InternLM 2 / 2.5 (their own code: InternLM2ForCausalLM; InternVL 2's language model): a Llama whose q, k
    and v are one Linear (attention.wqkv), its rows grouped by KV head (each group's query heads, then its key,
    then its value: WQKV_ORDER), under its own names (tok_embeddings, attention.wo, feed_forward.w1 / w3 / w2,
    attention_norm, ffn_norm, output); `bias` puts biases on wqkv and wo. Its dynamic NTK scaling turns RoPE
    only past max_position_embeddings, the context kiln serves: within it, plain RoPE."""

    ARCH: ClassVar[str] = "internlm2"
    ROPE_TYPES: ClassVar[tuple[str, ...]] = (*LlamaConfig.ROPE_TYPES, "dynamic")
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        LlamaConfig.FIELDS, ConfigField("attention_bias", ("bias", "attention_bias"), default=False))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if (values["rope_scaling"] or {}).get("rope_type") == "dynamic":
            notes.append("dynamic NTK RoPE scaling acts past max_position_embeddings only, which caps the context: "
                         "within it RoPE is unscaled")
            values = dict(values, rope_scaling=None)
        return super().adapt(values, hf, notes)


INTERNLM2_NAMES = dict(LLAMA_NAMES, embed_tokens="model.tok_embeddings", lm_head="output",
                       input_layernorm="attention_norm", post_attention_layernorm="ffn_norm", o_proj="attention.wo",
                       gate_proj="feed_forward.w1", up_proj="feed_forward.w3", down_proj="feed_forward.w2")


def wqkv_order(c: LlamaConfig) -> np.ndarray:
    """InternLM 2's wqkv rows in kiln's order (every query head, then the keys, then the values): its rows are
    [kv heads, q heads a group + 2, head_dim], a group's queries, then its key, then its value."""
    groups, per = c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads
    rows = np.arange(groups * (per + 2) * c.head_dim).reshape(groups, per + 2, c.head_dim)
    return np.concatenate([rows[:, :per].reshape(-1), rows[:, per].reshape(-1), rows[:, per + 1].reshape(-1)])


MUP_FIELDS = (ConfigField("scale_emb", ("scale_emb",), default=1.0),
              ConfigField("scale_depth", ("scale_depth",), default=None),
              ConfigField("dim_model_base", ("dim_model_base",), default=None))


@dataclass(frozen=True)
class MuPScales:
    """MiniCPM's muP scales (a mixin before the family's config class; MUP_FIELDS reads them): the embeddings
    times scale_emb, each residual branch times scale_depth / sqrt(layers), the logits divided by hidden_size /
    dim_model_base (Granite's multipliers, by other names)."""

    scale_emb: float = 1.0
    scale_depth: float | None = None
    dim_model_base: int | None = None

    def flags(self) -> Flags:
        depth = self.scale_depth if self.scale_depth is not None else math.sqrt(self.num_hidden_layers)
        return dataclasses.replace(super().flags(), embed_scale=float(self.scale_emb),
                                   residual_scale=depth / math.sqrt(self.num_hidden_layers),
                                   logit_divisor=self.hidden_size / (self.dim_model_base or self.hidden_size))


@dataclass(frozen=True)
class MiniCPMConfig(MuPScales, LlamaConfig):
    """MiniCPM 1 / 2 / 4 (their own code: MiniCPMForCausalLM): a Llama with muP's scales (MuPScales, as
    MiniCPM3's); LongRoPE read with its short factors (the context capped at its pretraining length,
    models/phi3.py longrope); MiniCPM 4's InfLLM v2 sparse attention attends to every key up to its dense_len:
    the context is capped there."""

    ARCH: ClassVar[str] = "minicpm"
    ROPE_TYPES: ClassVar[tuple[str, ...]] = ("default", "longrope", "su")
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*LlamaConfig.FIELDS, *MUP_FIELDS)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        from .phi3 import longrope
        values = longrope(values, hf, notes)
        dense = (hf.get("sparse_config") or {}).get("dense_len")
        if hf.get("sparse_config") and not dense:
            raise ValueError("MiniCPM sparse_config without dense_len: kiln runs InfLLM v2's dense span only; "
                             "fix config.json")
        if dense and values["context_window_size"] > dense:
            notes.append(f"context window capped at sparse_config.dense_len ({dense} tokens): within it, InfLLM v2 "
                         "attends to every key (its sparse attention past it is not supported yet)")
            values["context_window_size"] = int(dense)
        return super().adapt(values, hf, notes)


@dataclass(frozen=True)
class OrionConfig(LlamaConfig):
    """OrionStar's Orion-14B (orion, its own code): a Llama whose norms are LayerNorms with biases (config.json names
    their epsilon rms_norm_eps), the context max_sequence_length where it is given."""

    ARCH: ClassVar[str] = "orion"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        LlamaConfig.FIELDS, ConfigField("context_window_size", ("max_sequence_length", "max_position_embeddings")))

    def flags(self) -> Flags:
        return dataclasses.replace(super().flags(), norm="layer")


@dataclass(frozen=True)
class SeedOssConfig(LlamaConfig):
    """Seed-OSS (ByteDance): biases on q, k and v (`attention_bias`) apart from o's (`attention_out_bias`)."""

    attention_out_bias: bool = False

    ARCH: ClassVar[str] = "seed_oss"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *LlamaConfig.FIELDS, ConfigField("attention_out_bias", ("attention_out_bias",), default=False))

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_out_bias, mlp_bias=self.mlp_bias)


# CWM's RoPE where config.json writes none (transformers' CwmConfig default).
CWM_ROPE = dict(rope_type="llama3", rope_theta=1e6, factor=16.0, high_freq_factor=4.0, low_freq_factor=1.0,
                original_max_position_embeddings=8192)


@dataclass(frozen=True)
class CwmConfig(LlamaConfig):
    """Meta's Code World Model: a Llama 3 with a window of 8192 on 3 of every 4 layers, the first of each 4 full."""

    ARCH: ClassVar[str] = "cwm"

    @classmethod
    def from_hf(cls, hf: dict) -> "CwmConfig":
        n = hf.get("num_hidden_layers", 0)
        defaults = {"sliding_window": 8192,
                    "layer_types": ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(n)]}
        if not any(hf.get(k) for k in ("rope_parameters", "rope_theta", "rope_scaling")):
            defaults["rope_parameters"] = CWM_ROPE
        unwritten = {k: v for k, v in defaults.items() if k not in hf or k == "layer_types" and hf[k] is None}
        return super().from_hf({**hf, **unwritten})


@dataclass(frozen=True)
class Ministral3Config(TextModelOf, LlamaConfig):
    """Ministral 3 (Mistral 3's 3B/8B/14B): a Mistral with YaRN whose queries are scaled by
    1 + llama_4_scaling_beta * log(1 + floor(position / original_max_position_embeddings)) after RoPE
    (1 within the pretraining context). Mistral3ForConditionalGeneration's text model is read from its
    text_config, its weights under model.language_model (the vision tower is left out)."""

    attn_temperature: tuple[float, int] | None = None
    weight_prefix: str = "model"

    ARCH: ClassVar[str] = "ministral3"

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        return super().adapt(dict(values, attn_temperature=query_temperature(values["rope_scaling"])), hf, notes)

    def flags(self) -> Flags:
        return dataclasses.replace(super().flags(), attn_temperature=self.attn_temperature)


@dataclass(frozen=True)
class ExaoneConfig(LlamaConfig):
    """EXAONE 3.0 and 3.5 (LG AI Research): a Llama (Llama 3 RoPE scaling on 3.5, a tied head on
    3.5's 2.4B) whose config.json says num_layers, layer_norm_epsilon and activation_function, and
    whose tensors are named as GPT-2's (transformer.h.N.attn.attention.q_proj, mlp.c_fc_0 / c_fc_1 /
    c_proj: EXAONE_NAMES). transformers 5 runs it as its Llama and saves it under these names."""

    ARCH: ClassVar[str] = "exaone"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *LlamaConfig.FIELDS, ConfigField("activation", ("activation_function", "hidden_act"), default="silu"))

    activation: str = "silu"

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        one_of({"silu": "silu"}, values["activation"], "activation_function", cls.ARCH)   # every EXAONE 3.x's
        return super().adapt(values, hf, notes)


# EXAONE 3.x's tensor names (transformers 5 renames them to Llama's at load and back at save).
EXAONE_NAMES = dict(LLAMA_NAMES, embed_tokens="transformer.wte", norm="transformer.ln_f", layer="transformer.h.{i}",
                    input_layernorm="ln_1", post_attention_layernorm="ln_2", q_proj="attn.attention.q_proj",
                    k_proj="attn.attention.k_proj", v_proj="attn.attention.v_proj", o_proj="attn.attention.out_proj",
                    gate_proj="mlp.c_fc_0", up_proj="mlp.c_fc_1", down_proj="mlp.c_proj")

LlamaForCausalLM = Ministral3ForCausalLM = SeedOssForCausalLM = CwmForCausalLM = CausalLM
InternLMForCausalLM = InternLM3ForCausalLM = CausalLM
OrionForCausalLM = CausalLM
InternLM2ForCausalLM = MiniCPMForCausalLM = CausalLM
ExaoneForCausalLM = CausalLM


def weight_map(c: LlamaConfig) -> WeightMap:
    if isinstance(c, ExaoneConfig):
        return decoder_weight_map(c, EXAONE_NAMES)
    if isinstance(c, InternLM2Config):
        m, order = decoder_weight_map(c, INTERNLM2_NAMES), wqkv_order(c)
        for i in range(c.num_hidden_layers):
            for p in ("weight", "bias") if c.attention_bias else ("weight",):
                m[f"model.layers.{i}.self_attn.qkv_proj.{p}"] = WeightSpec(
                    (f"model.layers.{i}.attention.wqkv.{p}",), lambda rows, order=order: rows[order])
        return m
    return decoder_weight_map(c, prefixed_names(LLAMA_NAMES, getattr(c, "weight_prefix", "model")))
