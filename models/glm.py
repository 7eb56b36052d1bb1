"""Zhipu GLM-4 (`glm`: glm-4-9b-chat-hf and kin; `glm4`: GLM-4-0414, GLM-Z1): a Llama with q/k/v
biases, gate and up stored fused (`gate_up_proj`), and RoPE on the first half of each head
(`partial_rotary_factor`, 0.5 by default) rotating adjacent pairs of dims (kiln reorders the q and
k rows as it loads them: causal_lm.rope_halves). GLM-4-0414 adds a norm on the attention and on the
MLP output before each residual add (`post_self_attn_layernorm`, `post_mlp_layernorm`).

`chatglm`: the same model in its own code's format (ChatGLMModel / ChatGLMForConditionalGeneration: ChatGLM2-6B,
ChatGLM3-6B, glm-4-9b-chat and GLM-4's other first releases, CodeGeeX4), whose config.json names its sizes
ffn_hidden_size, num_layers, kv_channels, multi_query_group_num (with multi_query_attention), seq_length,
padded_vocab_size, layernorm_epsilon, its RoPE base 10000 x rope_ratio, its q/k/v biases add_qkv_bias, and whose
tensors sit under transformer.* (q, k and v one query_key_value: every q head's rows, then k's, then v's; gate and
up one dense_h_to_4h, gate first). The first ChatGLM-6B (2D positions, GELU, post-norm residuals) is refused. Its
tokenizer files are not its tokenizer (its code adds the special tokens and the [gMASK]<sop> prefix): without a
tokenizer.json kiln builds none (models/hf.py OWN_CODE_TOKENIZERS); the -hf release's is the one to pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import (DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, WeightMap, WeightSpec,
                        decoder_weight_map, rope_halves)
from .config import ConfigField, fields_with
from .layers import Flags

# kiln's post_attn_norm / post_mlp_norm are GLM-4-0414's post_self_attn_layernorm / post_mlp_layernorm.
NAMES = dict(LLAMA_NAMES, post_attn_norm="post_self_attn_layernorm", post_mlp_norm="post_mlp_layernorm")


@dataclass(frozen=True)
class GlmConfig(DecoderConfig):
    attention_bias: bool = True             # q, k and v (o has none)

    ARCH: ClassVar[str] = "glm"
    ADJACENT_ROPE: ClassVar[bool] = True
    POST_NORMS: ClassVar[bool] = False
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("partial_rotary_factor", ("partial_rotary_factor",), default=0.5),
        ConfigField("attention_bias", ("attention_bias",), default=True))

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, sandwich_norms=self.POST_NORMS)


@dataclass(frozen=True)
class Glm4Config(GlmConfig):
    ARCH: ClassVar[str] = "glm4"
    POST_NORMS: ClassVar[bool] = True


@dataclass(frozen=True)
class ChatGLMConfig(GlmConfig):
    ARCH: ClassVar[str] = "chatglm"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        GlmConfig.FIELDS, ConfigField("vocab_size", ("padded_vocab_size", "vocab_size")),
        ConfigField("intermediate_size", ("ffn_hidden_size",)), ConfigField("num_hidden_layers", ("num_layers",)),
        ConfigField("num_key_value_heads", ("multi_query_group_num",), default="num_attention_heads"),
        ConfigField("head_dim", ("kv_channels",), default=None),
        ConfigField("norm_eps", ("layernorm_epsilon",), default=1e-5),
        ConfigField("context_window_size", ("seq_length",)),
        ConfigField("attention_bias", ("add_qkv_bias",), default=False))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if "position_encoding_2d" in hf or "inner_hidden_size" in hf:
            raise ValueError("the first ChatGLM-6B (2D position encoding, GELU, post-norm residuals) is not "
                             "supported; ChatGLM2 / ChatGLM3 / GLM-4 in this format are")
        refused = [k for k, runs in (("rmsnorm", True), ("post_layer_norm", True), ("add_bias_linear", False),
                                     ("apply_residual_connection_post_layernorm", False), ("original_rope", True))
                   if k in hf and bool(hf[k]) != runs]
        if refused:
            raise ValueError(f"ChatGLM with {', '.join(f'{k} {hf[k]}' for k in refused)} is not supported (ChatGLM2 / "
                             "3 and GLM-4 set rmsnorm, post_layer_norm and original_rope true, add_bias_linear and "
                             "apply_residual_connection_post_layernorm false); fix config.json")
        if not hf.get("multi_query_attention"):           # multi_query_group_num only counts with it
            values = dict(values, num_key_value_heads=values["num_attention_heads"])
        return dict(values, rope_theta=10000.0 * float(hf.get("rope_ratio") or 1.0))


GlmForCausalLM = Glm4ForCausalLM = ChatGLMForCausalLM = CausalLM

# ChatGLM's own tensor names (kiln's Llama names -> its)
CHATGLM_NAMES = dict(NAMES, embed_tokens="transformer.embedding.word_embeddings",
                     norm="transformer.encoder.final_layernorm", lm_head="transformer.output_layer",
                     layer="transformer.encoder.layers.{i}", o_proj="self_attention.dense",
                     down_proj="mlp.dense_4h_to_h")


def weight_map(c: GlmConfig) -> WeightMap:
    own = isinstance(c, ChatGLMConfig)
    names = CHATGLM_NAMES if own else NAMES
    m = decoder_weight_map(c, names)
    for i in range(c.num_hidden_layers):                  # gate and up: one stored tensor, gate first
        h = names["layer"].format(i=i)
        m[f"model.layers.{i}.mlp.gate_up_proj.weight"] = [f"{h}.mlp.dense_h_to_4h.weight" if own
                                                          else f"{h}.mlp.gate_up_proj.weight"]
        if own:                                           # q, k and v: one stored tensor, rows q, k, v
            for p in ("weight", "bias") if c.attention_bias else ("weight",):
                m[f"model.layers.{i}.self_attn.qkv_proj.{p}"] = WeightSpec(
                    (f"{h}.self_attention.query_key_value.{p}",), rope_halves(c))
    return m
