"""Meituan's LongCat-Flash (longcat_flash: LongCat-Flash-Chat / -Thinking): each of its `num_layers` layers holds two
blocks of multi-head latent attention and a dense SwiGLU MLP each, and one mixture of experts beside them (a shortcut):
it reads the first block's MLP input and its output joins the second block's. Its router takes the softmax over
`n_routed_experts` experts and `zero_expert_num` zero-computation ones (identities: a token that picks one adds
itself times the weight), chooses by the scores plus a bias, and scales the chosen weights by routed_scaling_factor
without renormalising them. Its latent attention scales q by sqrt(hidden / q_lora_rank) and the normed KV latent by
sqrt(hidden / kv_lora_rank) (folded into q_b_proj's and kv_a_layernorm's weights at load).

The KV cache holds the two blocks of a layer as two layers (2 x num_layers: transformers' num_hidden_layers), each
the expanded latent attention models/mla.py describes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache

from .causal_lm import CausalLM, WeightMap, WeightSpec, head_weights
from .config import ConfigField, fields_with, refuse_unlike
from .deepseek import DeepseekV3Config
from .layers import MLP, Flags, Norm
from .mla import LatentAttention, latent_rows, query_rows
from .moe import MoESpec, SparseMoE


@dataclass(frozen=True)
class LongcatFlashConfig(DeepseekV3Config):
    zero_experts: int = 0

    ARCH: ClassVar[str] = "longcat_flash"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(DeepseekV3Config.FIELDS,
                     ConfigField("intermediate_size", ("ffn_hidden_size",)),
                     ConfigField("moe_intermediate_size", ("expert_ffn_hidden_size",)),
                     ConfigField("num_experts", ("n_routed_experts",)),
                     ConfigField("top_k", ("moe_topk",)),
                     ConfigField("routed_scale", ("routed_scaling_factor",), default=6.0),
                     ConfigField("q_lora_rank", ("q_lora_rank",), default=1536)),
        ConfigField("zero_experts", ("zero_expert_num",), default=0))

    @classmethod
    def from_hf(cls, hf: dict) -> "LongcatFlashConfig":
        if "num_layers" not in hf:
            raise ValueError("longcat_flash config.json without num_layers (its layers, each two attention blocks); "
                             "the checkpoint's config.json is incomplete")
        return super().from_hf({**hf, "num_hidden_layers": 2 * hf["num_layers"]})

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        # its router's classifier bias is never added (transformers' router reads the weight alone)
        refuse_unlike(hf, (("router_bias", False), ("hidden_act", "silu"), ("attention_bias", False)), cls.ARCH)
        if not values["q_lora_rank"]:
            raise ValueError("longcat_flash without q_lora_rank is not supported (its attention always projects q "
                             "through the latent); fix config.json")
        return super().adapt(dict(values, zero_experts=values["zero_experts"] or 0, first_dense=0), hf, notes)

    @property
    def num_layers(self) -> int:
        """Its own layers (each two of the KV cache's)."""
        return self.num_hidden_layers // 2

    def routed(self) -> MoESpec:
        return MoESpec(self.num_experts + self.zero_experts, self.top_k, self.moe_intermediate_size, normalize=False,
                       scoring="softmax", choice_bias=True, routed_scale=self.routed_scale,
                       zero_experts=self.zero_experts)


class LongcatLayer(nn.Module):
    def __init__(self, c: LongcatFlashConfig, flags: Flags):
        mla, h = c.latent_attention(), c.hidden_size
        self.self_attn = nn.ModuleList([LatentAttention(h, c.num_attention_heads, mla, flags.sm_scale(c.head_dim))
                                        for _ in range(2)])
        self.mlps = nn.ModuleList([MLP(h, c.intermediate_size, flags, c.norm_eps) for _ in range(2)])
        self.input_layernorm = nn.ModuleList([Norm(h, c.norm_eps) for _ in range(2)])
        self.post_attention_layernorm = nn.ModuleList([Norm(h, c.norm_eps) for _ in range(2)])
        self.mlp = SparseMoE(h, c.routed(), flags)

    def attentions(self) -> tuple[LatentAttention, ...]:
        return tuple(self.self_attn)

    def forward(self, x: Tensor, kv_cache: PagedKVCache, layer: int) -> Tensor:
        x = x + self.self_attn[0](self.input_layernorm[0](x), kv_cache, 2 * layer)
        normed = self.post_attention_layernorm[0](x)
        shortcut = self.mlp(normed)
        x = x + self.mlps[0](normed)
        x = x + self.self_attn[1](self.input_layernorm[1](x), kv_cache, 2 * layer + 1)
        return x + self.mlps[1](self.post_attention_layernorm[1](x)) + shortcut


class LongcatStack(nn.Module):
    needs_positions = False                 # one RoPE on every layer: the cache applies it

    def __init__(self, c: LongcatFlashConfig, flags: Flags):
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([LongcatLayer(c, flags) for _ in range(c.num_layers)])
        self.norm = Norm(c.hidden_size, c.norm_eps)

    def forward(self, x: Tensor, kv_cache: PagedKVCache) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, kv_cache, i)
        return self.norm(x)


class LongcatFlashForCausalLM(CausalLM):
    def stack(self, config: LongcatFlashConfig) -> nn.Module:
        return LongcatStack(config, self.flags)


def weight_map(c: LongcatFlashConfig) -> WeightMap:
    spec, heads = c.latent_attention(), c.num_attention_heads
    q_scale, kv_scale = math.sqrt(c.hidden_size / spec.q_lora_rank), math.sqrt(c.hidden_size / spec.kv_lora_rank)
    m = head_weights(c)
    for i in range(c.num_layers):
        k = f"model.layers.{i}"
        for j in (0, 1):
            a = f"{k}.self_attn.{j}"
            m.update({
                f"{a}.q_a_proj.weight": [f"{a}.q_a_proj.weight"],
                f"{a}.q_a_layernorm.weight": [f"{a}.q_a_layernorm.weight"],
                f"{a}.q_b_proj.weight": WeightSpec((f"{a}.q_b_proj.weight",),
                                                   lambda w: query_rows(spec, heads)(w) * q_scale),
                f"{a}.kv_a_proj_with_mqa.weight": WeightSpec((f"{a}.kv_a_proj_with_mqa.weight",), latent_rows(spec)),
                f"{a}.kv_a_layernorm.weight": WeightSpec((f"{a}.kv_a_layernorm.weight",), lambda w: w * kv_scale),
                f"{a}.kv_b_proj.weight": [f"{a}.kv_b_proj.weight"],
                f"{a}.o_proj.weight": [f"{a}.o_proj.weight"],
                f"{k}.input_layernorm.{j}.weight": [f"{k}.input_layernorm.{j}.weight"],
                f"{k}.post_attention_layernorm.{j}.weight": [f"{k}.post_attention_layernorm.{j}.weight"],
                f"{k}.mlps.{j}.gate_up_proj.weight": [f"{k}.mlps.{j}.gate_proj.weight", f"{k}.mlps.{j}.up_proj.weight"],
                f"{k}.mlps.{j}.down_proj.weight": [f"{k}.mlps.{j}.down_proj.weight"]})
        experts = [f"{k}.mlp.experts.{e}" for e in range(c.num_experts)]
        m.update({
            f"{k}.mlp.router": [f"{k}.mlp.router.classifier.weight"],
            f"{k}.mlp.choice_bias": [f"{k}.mlp.router.e_score_correction_bias"],
            f"{k}.mlp.experts_gate_up.weight": [f"{x}.{p}.weight" for x in experts for p in ("gate_proj", "up_proj")],
            f"{k}.mlp.experts_down.weight": [f"{x}.down_proj.weight" for x in experts]})
    return m
