"""ModernBERT's decoder (transformers' ModernBertDecoder: the Ettin decoder models, jhu-clsp/ettin-decoder-*): the
embeddings LayerNormed, then pre-norm layers whose first has no norm before attention (its input is the embeddings'
norm), LayerNorms without bias (norm_bias), q/k/v and Wo, a GeGLU MLP fused in Wi (its first half through the
activation, times the second), every `global_attn_every_n_layers`-th layer global (RoPE base global_rope_theta,
160000) and the others sliding over `local_attention` / 2 tokens (local_rope_theta, 10000); after the final norm a
prediction head, dense -> classifier_activation -> LayerNorm, then the tied decoder with its own bias."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tvm.relax.frontend import nn

from .causal_lm import LLAMA_NAMES, CausalLM, LayerAttention, Tensor, WeightMap, decoder_weight_map, \
    local_rope_on_sliding
from .config import ConfigField, fields_with, layer_types, one_of, split_layer_rope, window_of
from .layers import Flags, Norm, _activation
from .llama import LlamaConfig

ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "silu": "silu",
               "relu": "relu"}
NAMES = dict(LLAMA_NAMES, embed_tokens="model.embeddings.tok_embeddings", norm="model.final_norm",
             input_layernorm="attn_norm", post_attention_layernorm="mlp_norm", q_proj="attn.q_proj",
             k_proj="attn.k_proj", v_proj="attn.v_proj", o_proj="attn.Wo", down_proj="mlp.Wo")


@dataclass(frozen=True)
class ModernBertDecoderConfig(LlamaConfig):
    local_rope_theta: float = 10000.0
    norm_bias: bool = False
    classifier_bias: bool = False
    decoder_bias: bool = True
    activation: str = "gelu"
    head_activation: str = "gelu"

    ARCH: ClassVar[str] = "modernbert-decoder"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(LlamaConfig.FIELDS, ConfigField("norm_eps", ("norm_eps",), default=1e-5)),
        ConfigField("local_rope_theta", ("rope_local_base_freq",), default=10000.0),
        ConfigField("norm_bias", ("norm_bias",), default=False),
        ConfigField("classifier_bias", ("classifier_bias",), default=False),
        ConfigField("decoder_bias", ("decoder_bias",), default=True),
        ConfigField("activation", ("hidden_activation",), default="gelu"),
        ConfigField("head_activation", ("classifier_activation",), default="gelu"))

    @classmethod
    def from_hf(cls, hf: dict) -> "ModernBertDecoderConfig":
        """transformers' config, or the Hub's older one (global_attn_every_n_layers, global_rope_theta /
        local_rope_theta instead of layer_types and rope_parameters)."""
        n, local = hf.get("num_hidden_layers", 22), hf.get("local_attention", 128)
        every = hf.get("global_attn_every_n_layers", 3)
        hf = {**hf, "sliding_window": local // 2 if local else None,
              "layer_types": hf.get("layer_types") or ["sliding_attention" if i % every else "full_attention"
                                                       for i in range(n)]}
        if hf.get("rope_parameters") is None:
            hf["rope_parameters"] = {
                "full_attention": {"rope_type": "default", "rope_theta": hf.get("global_rope_theta", 160000.0)},
                "sliding_attention": {"rope_type": "default", "rope_theta": hf.get("local_rope_theta", 10000.0)}}
        return super().from_hf(split_layer_rope(hf, full_theta=160000.0, local_theta=10000.0))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        types = layer_types(values["layer_types"], values["num_hidden_layers"], hf, pattern=3)
        act, head = (one_of(ACTIVATIONS, values[k], name, cls.ARCH) for k, name in (
            ("activation", "hidden_activation"), ("head_activation", "classifier_activation")))
        if values["num_key_value_heads"] != values["num_attention_heads"]:
            raise ValueError(f"{cls.ARCH} with num_key_value_heads is not supported (its attention has a k and v "
                             "head a q head); fix config.json")
        return dict(values, sliding_window=window_of(values), layer_types=types, activation=act, head_activation=head)

    def flags(self) -> Flags:
        return Flags(norm="layer" if self.norm_bias else "layer_nobias", activation=self.activation,
                     qkv_bias=self.attention_bias, o_bias=self.attention_bias, mlp_bias=self.mlp_bias,
                     embed_norm=True)

    def layer_flags(self, layer: int) -> Flags:
        return dataclasses.replace(self.flags(), input_norm=layer != 0)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return local_rope_on_sliding(self)


class ModernBertDecoderForCausalLM(CausalLM):
    """CausalLM with ModernBERT's prediction head before the tied decoder (and the decoder's bias after it)."""

    def __init__(self, config: ModernBertDecoderConfig):
        super().__init__(config)
        h = config.hidden_size
        self.head_dense = nn.Linear(h, h, bias=config.classifier_bias)
        self.head_norm = Norm(h, config.norm_eps, self.flags.norm)
        if config.decoder_bias:
            self.head_bias = nn.Parameter((config.vocab_size,))

    def _logits(self, hidden: Tensor) -> Tensor:
        logits = super()._logits(self.head_norm(_activation(self.head_dense(hidden), self.config.head_activation)))
        return logits + self.head_bias.astype("float32") if hasattr(self, "head_bias") else logits


def weight_map(c: ModernBertDecoderConfig) -> WeightMap:
    m = decoder_weight_map(c, NAMES)
    parts = ("weight", "bias") if c.norm_bias else ("weight",)
    for p in parts:
        del m[f"model.layers.0.input_layernorm.{p}"]            # the first layer's attn_norm is nn.Identity
        m[f"model.embed_norm.{p}"] = [f"model.embeddings.norm.{p}"]
        m[f"head_norm.{p}"] = [f"lm_head.norm.{p}"]
    for p in ("weight", "bias") if c.classifier_bias else ("weight",):
        m[f"head_dense.{p}"] = [f"lm_head.dense.{p}"]
    if c.decoder_bias:
        m["head_bias"] = ["decoder.bias"]
    for i in range(c.num_hidden_layers):
        for p in ("weight", "bias") if c.mlp_bias else ("weight",):
            m[f"model.layers.{i}.mlp.gate_up_proj.{p}"] = [f"model.layers.{i}.mlp.Wi.{p}"]
    if not c.tie_word_embeddings:
        m["lm_head.weight"] = ["decoder.weight"]
    return m
