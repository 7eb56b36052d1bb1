"""Muse Glimmer's language model (muse_glimmer_text, inside MuseGlimmerForConditionalGeneration): Gemma 2's four
norms a layer (x * (1 + w); the two after attention and MLP with their own epsilon, `post_norm_eps`), the embeddings
normed without a weight, q and k normed a head without one and q scaled by `qk_scale_factor` (kiln's softmax scale
qk_scale_factor / sqrt(head_dim)), the attention output gated by sigmoid(gate_proj(x)) before o_proj, sliding layers
with RoPE among full ones without (`layer_types`; RoPE where `layer_rope_theta` is not 0), a plain RMSNorm (x * w)
last and the logits 20 tanh(z * output_multiplier / 20) (`final_logit_softcapping`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, CausalLM, DecoderConfig, LayerAttention, WeightMap, WeightSpec
from .config import ConfigField, layer_types
from .glm4_moe import gates_after_queries
from .layers import Flags


@dataclass(frozen=True)
class MuseGlimmerTextConfig(DecoderConfig):
    attention_bias: bool = False
    sliding_window: int = 2048
    layer_types: tuple[str, ...] = ()
    rope_layers: tuple[bool, ...] = ()
    qk_scale_factor: float = 3.87
    output_multiplier: float = 1.0
    final_logit_softcap: float | None = 20.0
    post_norm_eps: float = 1e-8

    ARCH: ClassVar[str] = "muse_glimmer_text"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *DECODER_FIELDS, ConfigField("attention_bias", ("attention_bias",), default=False),
        ConfigField("sliding_window", ("sliding_window",), default=2048),
        ConfigField("layer_types", ("layer_types",), default=None),
        ConfigField("rope_layers", ("layer_rope_theta",), default=None),
        ConfigField("qk_scale_factor", ("qk_scale_factor",), default=3.87),
        ConfigField("output_multiplier", ("output_multiplier",), default=0.19611613513818404),
        ConfigField("final_logit_softcap", ("final_logit_softcapping",), default=20.0),
        ConfigField("post_norm_eps", ("post_norm_eps",), default=1e-8),
        ConfigField("hidden_act", ("hidden_activation", "hidden_act"), default="silu"))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n, act = values["num_hidden_layers"], values.pop("hidden_act")
        if act != "silu" or values["attention_bias"]:
            raise ValueError(f"Muse Glimmer with hidden_activation {act!r} or attention_bias "
                             f"{values['attention_bias']} is not supported (silu, no biases: the released form)")
        # transformers' defaults: every 4th layer from the last full and without RoPE, the others sliding with it
        types = values["layer_types"] or ["full_attention" if (n - 1 - i) % 4 == 0 else "sliding_attention"
                                          for i in range(n)]
        thetas = values["rope_layers"]
        rope = [bool(t) for t in thetas] if thetas is not None else [t == "sliding_attention" for t in types]
        if len(rope) != n:
            raise ValueError(f"Muse Glimmer's layer_rope_theta lists {len(rope)} layers of {n}; fix config.json")
        return dict(values, layer_types=tuple(layer_types(types, n, hf, pattern=4)), rope_layers=tuple(rope))

    def flags(self) -> Flags:
        return Flags(norm="rms_1p", sandwich_norms=True, post_norm_eps=self.post_norm_eps, qk_norm=True,
                     qk_norm_kind="rms_noparam", attn_scale=self.qk_scale_factor / self.head_dim ** 0.5,
                     attn_output_gate=True,
                     embed_norm=True, embed_norm_kind="rms_noparam", final_norm_kind="rms",
                     logit_divisor=1.0 / self.output_multiplier, final_logit_softcap=self.final_logit_softcap)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return tuple(LayerAttention("sliding" if kind == "sliding_attention" else "full",
                                    self.sliding_window if kind == "sliding_attention" else None, self.rope_theta,
                                    self.rope_scaling, rope)
                     for kind, rope in zip(self.layer_types, self.rope_layers))


MuseGlimmerForCausalLM = CausalLM


def weight_map(c: MuseGlimmerTextConfig) -> WeightMap:
    m: WeightMap = {f"model.{x}.weight": [f"model.{x}.weight"] for x in ("embed_tokens", "norm")}
    if not c.tie_word_embeddings:
        m["lm_head.weight"] = ["lm_head.weight"]
    for i in range(c.num_hidden_layers):
        k = f"model.layers.{i}"
        for kiln, hf in (("input_layernorm", "input_layernorm"), ("post_attn_norm", "post_attention_layernorm"),
                         ("post_attention_layernorm", "pre_feedforward_layernorm"),
                         ("post_mlp_norm", "post_feedforward_layernorm")):
            m[f"{k}.{kiln}.weight"] = [f"{k}.{hf}.weight"]
        qkv = tuple(f"{k}.self_attn.{x}_proj.weight" for x in ("q", "gate", "k", "v"))
        m[f"{k}.self_attn.qkv_proj.weight"] = WeightSpec(qkv, gates_after_queries(c.num_attention_heads, c.head_dim))
        m[f"{k}.self_attn.o_proj.weight"] = [f"{k}.self_attn.o_proj.weight"]
        m[f"{k}.mlp.gate_up_proj.weight"] = [f"{k}.mlp.gate_proj.weight", f"{k}.mlp.up_proj.weight"]
        m[f"{k}.mlp.down_proj.weight"] = [f"{k}.mlp.down_proj.weight"]
    return m
