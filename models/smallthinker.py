"""SmallThinker (PowerInfer / SJTU IPADS: SmallThinker-4BA0.6B, SmallThinker-21BA3B; their own code's
SmallThinkerForCausalLM, no transformers class; llama.cpp's smallthinker GGUFs): on-device mixtures of experts. A Llama
whose every MLP is `moe_num_primary_experts` ReGLU experts (down(up x * relu(gate x))), of which the router picks the
`moe_num_active_primary_experts` best per token from the layer's INPUT (before its attention and norms: what lets an
engine prefetch a layer's experts while the attention runs), weighted by the softmax of their logits
(`moe_primary_router_apply_softmax`) or by their sigmoids renormalised. Per layer, `rope_layout` says whether it
rotates q and k (0: NoPE) and `sliding_window_layout` whether it attends to the last `sliding_window_size` tokens
only (SmallThinker-21B: three sliding RoPE layers to each full NoPE one; the 4B: RoPE everywhere, no window)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache

from .causal_lm import DECODER_FIELDS, CausalLM, DecoderConfig, DecoderStack, LayerAttention, WeightMap
from .config import ConfigField, fields_with
from .layers import DecoderLayer, Flags
from .moe import MoESpec, SparseMoE, moe_weight_map

NAMES = {"router": "block_sparse_moe.primary_router", "expert": "block_sparse_moe.experts.{j}", "gate": "gate",
         "up": "up", "down": "down"}


@dataclass(frozen=True)
class SmallThinkerConfig(DecoderConfig):
    num_experts: int = 32
    top_k: int = 4
    softmax_router: bool = False            # else sigmoid scores renormalised over the chosen
    rope_layers: tuple[bool, ...] = ()      # per layer: whether it applies RoPE
    sliding_layers: tuple[bool, ...] = ()   # per layer: whether it slides (over `sliding_window` tokens)
    sliding_window: int | None = None

    ARCH: ClassVar[str] = "smallthinker"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("intermediate_size", ("moe_ffn_hidden_size",)),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("num_experts", ("moe_num_primary_experts",)),
        ConfigField("top_k", ("moe_num_active_primary_experts",)),
        ConfigField("softmax_router", ("moe_primary_router_apply_softmax",), default=False),
        ConfigField("rope_layers", ("rope_layout",), default=None),
        ConfigField("sliding_layers", ("sliding_window_layout",), default=None),
        ConfigField("sliding_window", ("sliding_window_size",), default=None))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        if hf.get("moe_enable_secondary_experts") or hf.get("moe_shared_primary_experts"):
            raise ValueError("SmallThinker with secondary or shared experts is not supported (its code runs neither; "
                             "released checkpoints have none): set moe_enable_secondary_experts false and "
                             "moe_shared_primary_experts 0 in config.json")
        if any(not x for x in hf.get("moe_layer_layout") or [1]):
            raise ValueError("SmallThinker with dense layers (a 0 in moe_layer_layout) is not supported (its code "
                             "makes every layer a mixture of experts); fix config.json")
        layouts = {}
        for key, field, default in (("rope_layout", "rope_layers", 1), ("sliding_window_layout", "sliding_layers", 0)):
            layout = values[field]
            layout = [default] * n if layout is None else layout
            if not isinstance(layout, (list, tuple)) or len(layout) != n or set(layout) - {0, 1}:
                raise ValueError(f"{key} must hold 1 or 0 for each of the {n} layers; got {layout!r}; fix "
                                 "config.json")
            layouts[field] = tuple(bool(x) for x in layout)
        window = values["sliding_window"]
        if not window or window >= values["context_window_size"]:     # sliding over the whole context: no window
            window, layouts["sliding_layers"] = None, (False,) * n
        elif not any(layouts["sliding_layers"]):
            window = None
        return dict(values, **layouts, sliding_window=window, softmax_router=bool(values["softmax_router"]))

    def flags(self) -> Flags:
        return Flags(activation="relu")

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return tuple(LayerAttention("sliding" if s else "full", self.sliding_window if s else None, self.rope_theta,
                                    self.rope_scaling, rope=r) for r, s in zip(self.rope_layers, self.sliding_layers))

    def layer_moe(self, layer: int) -> MoESpec:
        # the k best logits (not scores: sigmoids that round to 1 would tie), weighted by their softmax (the
        # renormalised softmax's weights) or by their sigmoids renormalised
        return MoESpec(self.num_experts, self.top_k, self.intermediate_size, normalize=True,
                       scoring="softmax" if self.softmax_router else "sigmoid", choice_from="logits")


class SmallThinkerLayer(DecoderLayer):
    """Attention, then the experts, the router reading the layer's input x."""

    def forward(self, x: Tensor, kv_cache: PagedKVCache, layer_id: int, positions: Tensor | None = None) -> Tensor:
        h = x + self.self_attn(self.input_layernorm(x), kv_cache, layer_id, positions)
        return h + self.mlp(self.post_attention_layernorm(h), x)


class SmallThinkerStack(DecoderStack):
    def decoder_layer(self, c: SmallThinkerConfig, i: int, flags: Flags, rope: tuple | None) -> nn.Module:
        return SmallThinkerLayer(c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                                 c.head_dim, c.norm_eps, flags, rope, SparseMoE(c.hidden_size, c.layer_moe(i), flags))


class SmallThinkerForCausalLM(CausalLM):
    def stack(self, config: SmallThinkerConfig) -> nn.Module:
        return SmallThinkerStack(config, self.flags, self.attention)


def weight_map(c: SmallThinkerConfig) -> WeightMap:
    return moe_weight_map(c, NAMES)
