"""TII Falcon (Falcon-7B/40B/180B, Falcon 2 11B; Falcon 3 is a Llama): LayerNorm (biases) and a plain
GELU MLP, attention and MLP side by side (`parallel_attn`: x + attn(n(x)) + mlp(n(x)), one norm, or
`ln_attn` / `ln_mlp` apart in the new decoder architecture's two-norm layers), RoPE over whole heads,
and q/k/v fused in `query_key_value` three ways: per key/value group [its q heads, k, v] (the new
decoder architecture), [every q, k, v] with one key/value head (`multi_query`), or each head's q, k, v
in turn; all reordered to kiln's every q, every k, every v. ALiBi checkpoints (Falcon-RW) are refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, WeightMap, WeightSpec, \
    decoder_weight_map
from .config import ConfigField, fields_with, one_of
from .gpt2 import ACTIVATIONS
from .gpt_neox import _by_kind
from .layers import Flags

NAMES = dict(LLAMA_NAMES, embed_tokens="transformer.word_embeddings", norm="transformer.ln_f",
             layer="transformer.h.{i}", o_proj="self_attention.dense", up_proj="mlp.dense_h_to_4h",
             down_proj="mlp.dense_4h_to_h")


@dataclass(frozen=True)
class FalconConfig(DecoderConfig):
    activation: str = "gelu"
    bias: bool = False
    parallel_attn: bool = True
    new_decoder_architecture: bool = False
    two_norms: bool = False                 # ln_attn and ln_mlp (the new architecture's parallel layers)

    ARCH: ClassVar[str] = "falcon"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("hidden_size", ("hidden_size", "n_embed")),
        ConfigField("intermediate_size", ("ffn_hidden_size",), default=None),
        ConfigField("norm_eps", ("layer_norm_epsilon",), default=1e-5),
        ConfigField("num_key_value_heads", ("num_kv_heads", "n_head_kv"), default=None),
        ConfigField("context_window_size", ("max_position_embeddings",), default=2048),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("activation", ("activation",), default="gelu"),
        ConfigField("bias", ("bias",), default=False),
        ConfigField("parallel_attn", ("parallel_attn",), default=True),
        ConfigField("new_decoder_architecture", ("new_decoder_architecture",), default=False))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("alibi"):
            raise ValueError("Falcon with alibi (Falcon-RW's ALiBi positions) is not supported; kiln's attention "
                             "kernels apply RoPE only")
        activation = one_of(ACTIVATIONS, values["activation"], "activation", cls.ARCH)
        heads, new = values["num_attention_heads"], values["new_decoder_architecture"]
        if new:
            kv_heads = values["num_key_value_heads"] or heads
        else:
            kv_heads = 1 if hf.get("multi_query", True) else heads
        lns = hf.get("num_ln_in_parallel_attn") or (2 if new else 1)
        return dict(values, activation=activation, num_key_value_heads=kv_heads,
                    intermediate_size=values["intermediate_size"] or 4 * values["hidden_size"],
                    two_norms=bool(new and values["parallel_attn"] and lns == 2))

    def flags(self) -> Flags:
        return Flags(norm="layer", activation=self.activation, gated_mlp=False, qkv_bias=self.bias,
                     o_bias=self.bias, mlp_bias=self.bias, parallel_residual=self.parallel_attn,
                     shared_norm=self.parallel_attn and not self.two_norms)


FalconForCausalLM = CausalLM


def _by_group(c: FalconConfig):
    """query_key_value rows [groups, q heads per group + 2, head_dim] -> every q, then every k and v."""
    g, d = c.num_attention_heads // c.num_key_value_heads, c.head_dim

    def reorder(a: np.ndarray) -> np.ndarray:
        grouped = a.reshape(c.num_key_value_heads, g + 2, d, *a.shape[1:])
        parts = (grouped[:, :g], grouped[:, g:g + 1], grouped[:, g + 1:])
        return np.ascontiguousarray(np.concatenate([p.reshape(-1, *a.shape[1:]) for p in parts]))
    return reorder


def weight_map(c: FalconConfig) -> WeightMap:
    names = dict(NAMES, input_layernorm="ln_attn", post_attention_layernorm="ln_mlp") if c.two_norms else NAMES
    m = decoder_weight_map(c, names)
    if c.new_decoder_architecture:
        reorder = _by_group(c)
    else:
        reorder = None if c.num_key_value_heads == 1 else _by_kind(c.num_attention_heads)
    for i in range(c.num_hidden_layers):
        fused = f"transformer.h.{i}.self_attention.query_key_value"
        for p in ("weight", "bias") if c.bias else ("weight",):
            m[f"model.layers.{i}.self_attn.qkv_proj.{p}"] = WeightSpec((f"{fused}.{p}",), reorder)
    return m
