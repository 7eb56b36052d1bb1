"""AI2's Molmo 2 (Molmo2ForConditionalGeneration), its language model on text: a Qwen3 (Molmo2-4B / -8B:
`qk_norm_type` qwen3, per-head q/k RMSNorm, norms before attention and MLP) or an OLMo 2 / 3 (Molmo2-O: q/k RMSNorm
over all heads, `norm_after`: each branch's output normed before its residual add), RoPE on halves with its scaling
on the `rope_scaling_layers` (every layer where unset; the others unscaled), q/k/v biased where `qkv_bias` (o never).

Its checkpoints, as released and as transformers saves them, keep the original code's layout under
`model.transformer.`: the embedding split into `wte.embedding` and `wte.new_embedding` (the image tokens' rows after
the vocabulary's; the head predicts the vocabulary only, so its first `vocab_size` rows are read), q/k/v fused as
`att_proj` (rows q, k, v: kiln's layout), the MLP's `ff_proj` with up's rows before gate's (read swapped), `ln_f`
the final norm; the vision tower and adapter beside it are not read (a note says so)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import DECODER_FIELDS, CausalLM, DecoderConfig, LayerAttention, WeightMap, WeightSpec
from .config import ConfigField, fields_with, text_model
from .layers import Flags

PREFIX = "model.transformer"


@dataclass(frozen=True)
class Molmo2TextConfig(DecoderConfig):
    qkv_bias: bool = False
    qk_norm_heads: bool = True              # Qwen3's per-head q/k norms; False: OLMo's over all heads
    norm_after: bool = False
    scaled_layers: tuple[int, ...] = ()     # the layers RoPE's scaling applies to

    ARCH: ClassVar[str] = "molmo2_text"
    ROPE_TYPES: ClassVar[tuple[str, ...]] = ("default", "linear", "yarn", "llama3", "dynamic")
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(DECODER_FIELDS, ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=False)),
        ConfigField("qkv_bias", ("qkv_bias", "attention_bias"), default=False),
        ConfigField("qk_norm_heads", ("qk_norm_type",), default="olmo"),
        ConfigField("norm_after", ("norm_after",), default=False),
        ConfigField("scaled_layers", ("rope_scaling_layers",), default=None))

    @classmethod
    def from_hf(cls, hf: dict) -> "Molmo2TextConfig":
        return super().from_hf(text_model(hf)[0])

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        kind = values["qk_norm_heads"]
        if kind not in ("qwen3", "olmo"):
            raise ValueError(f"Molmo 2 with qk_norm_type {kind!r} is not supported (qwen3, olmo)")
        if hf.get("use_qk_norm") is False:
            raise ValueError("Molmo 2 with use_qk_norm false is not supported (transformers norms q and k always)")
        n, scaled = values["num_hidden_layers"], values["scaled_layers"]
        notes.append("Molmo 2's language model only: its vision tower and adapter are not read (prompts are text)")
        return dict(values, qk_norm_heads=kind == "qwen3",
                    scaled_layers=tuple(range(n)) if scaled is None else tuple(int(i) for i in scaled))

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.qkv_bias, qk_norm=True, qk_norm_heads=self.qk_norm_heads,
                     pre_norms=not self.norm_after, sandwich_norms=self.norm_after)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return tuple(LayerAttention("full", None, self.rope_theta, self.rope_scaling if i in self.scaled_layers
                                    else None) for i in range(self.num_hidden_layers))


Molmo2ForCausalLM = CausalLM


def weight_map(c: Molmo2TextConfig) -> WeightMap:
    vocab = c.vocab_size
    m: WeightMap = {
        "model.embed_tokens.weight": WeightSpec((f"{PREFIX}.wte.embedding", f"{PREFIX}.wte.new_embedding"),
                                                lambda rows: rows[:vocab]),
        "model.norm.weight": [f"{PREFIX}.ln_f.weight"]}
    if not c.tie_word_embeddings:
        m["lm_head.weight"] = ["lm_head.weight"]
    norms = ("post_attn_norm", "post_mlp_norm") if c.norm_after else ("input_layernorm", "post_attention_layernorm")
    for i in range(c.num_hidden_layers):
        k, h = f"model.layers.{i}", f"{PREFIX}.blocks.{i}"
        m[f"{k}.{norms[0]}.weight"] = [f"{h}.attn_norm.weight"]
        m[f"{k}.{norms[1]}.weight"] = [f"{h}.ff_norm.weight"]
        for p in ("weight", "bias") if c.qkv_bias else ("weight",):
            m[f"{k}.self_attn.qkv_proj.{p}"] = [f"{h}.self_attn.att_proj.{p}"]
        for x in ("q_norm", "k_norm"):
            m[f"{k}.self_attn.{x}.weight"] = [f"{h}.self_attn.{x}.weight"]
        m[f"{k}.self_attn.o_proj.weight"] = [f"{h}.self_attn.attn_out.weight"]
        m[f"{k}.mlp.gate_up_proj.weight"] = WeightSpec((f"{h}.mlp.ff_proj.weight",), _gate_first)
        m[f"{k}.mlp.down_proj.weight"] = [f"{h}.mlp.ff_out.weight"]
    return m


def _gate_first(up_gate: np.ndarray) -> np.ndarray:
    """ff_proj's rows [up; gate] as kiln's gate_up_proj [gate; up]."""
    up, gate = np.split(up_gate, 2, axis=0)
    return np.concatenate([gate, up], axis=0)
