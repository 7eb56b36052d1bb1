"""Zyphra's Zamba 2 (1.2B, 2.7B, 7B): Mamba-2 layers, some of them (`layers_block_type` "hybrid") behind a
transformer block that `num_mem_blocks` shared blocks take turns being.

    hybrid layer   t = linear(mlp_h(n2(attention_h(n1([x, e])))))   e: the embeddings, [x, e] 2 x hidden wide
                   x = x + mamba(n(x + t))
    Mamba layer    x = x + mamba(n(x))
    attention_h    q, k and v from [x, e] (heads of 2 x hidden / heads dims), softmax scale (head_dim / 2) ** -0.5,
                   RoPE where use_mem_rope, the output projected to hidden
    mlp_h          down(act(gate) * up), act hidden_act (gelu)
    mamba          models/mamba2.py's mixer (gated norm over groups, eps 1e-5; dt at least time_step_min)

Hybrid layer h (counted among the hybrid layers) is block h % num_mem_blocks with its own LoRA adapters: on
gate_up always, on q, k and v where use_shared_attention_adapter. kiln folds each adapter into its layer's copy of
the block's weights at load (W + B A: exact but for float rounding), so a hybrid layer holds a whole block of its
own (the blocks' weights once per hybrid layer: Zamba2-2.7B's 9 hybrid layers over 2 blocks hold ~4.5x the
blocks' bytes). Transformers ties a block's copies with the embeddings (tie_word_embeddings, as the released
models are) and saves its weights, and every adapter of it, under the first hybrid layer that is that block; kiln
reads them there (untied: each hybrid layer's own). The KV cache kiln owns gives a cache layer keys and values
or a state: hybrid layer h attends over cache layer h, and layer i's Mamba-2 keeps its state in cache layer H + i
(H hybrid layers)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .causal_lm import LayerAttention, OwnedStackLM, PositionalStack, WeightMap, WeightSpec, head_weights
from .config import ConfigField, fields_with
from .layers import MLP, Flags, Norm, PagedAttention
from .llama import LlamaConfig
from .mamba2 import MAMBA_FIELDS, Mamba2Fields, Mamba2Mixer, mamba_weights
from .rope import inv_freq

_HYBRID, _MAMBA = ("hybrid", "h", "g"), ("mamba", "linear_attention", "m")
_ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "silu": "silu",
                "relu": "relu"}


@dataclass(frozen=True)
class Zamba2Config(Mamba2Fields, LlamaConfig):
    hybrid_layers: tuple[int, ...] = ()
    mem_blocks: int = 1
    attention_adapter: bool = False
    mem_rope: bool = False
    activation: str = "gelu"

    ARCH: ClassVar[str] = "zamba2"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        (*LlamaConfig.FIELDS, *MAMBA_FIELDS),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("intermediate_size", ("intermediate_size",), default=None),
        ConfigField("mamba_heads", ("n_mamba_heads",), default=8),
        ConfigField("mamba_head_dim", ("mamba_headdim",), default=None),
        ConfigField("mamba_groups", ("mamba_ngroups",), default=1),
        ConfigField("mamba_state", ("mamba_d_state",), default=64),
        ConfigField("mamba_taps", ("mamba_d_conv",), default=4),
        ConfigField("mamba_expand", ("mamba_expand",), default=2),
        ConfigField("mamba_conv_bias", ("use_conv_bias",), default=True),
        ConfigField("mamba_proj_bias", ("add_bias_linear",), default=False),
        ConfigField("dt_limit", ("time_step_min",), default=0.001),
        ConfigField("hybrid_layers", ("layers_block_type",), default=None),
        ConfigField("mem_blocks", ("num_mem_blocks",), default=1),
        ConfigField("attention_adapter", ("use_shared_attention_adapter",), default=False),
        ConfigField("mem_rope", ("use_mem_rope",), default=False),
        ConfigField("long_context", ("use_long_context",), default=False),
        ConfigField("activation", ("hidden_act",), default="gelu"))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n, hidden, heads = values["num_hidden_layers"], values["hidden_size"], values["num_attention_heads"]
        kinds = values["hybrid_layers"]
        if kinds is None or len(kinds) != n or set(kinds) - {*_HYBRID, *_MAMBA}:
            raise ValueError(f"layers_block_type must say 'mamba' or 'hybrid' for each of the {n} layers; got "
                             f"{kinds}; fix config.json")
        if values["mamba_proj_bias"]:
            raise ValueError("Zamba 2 with add_bias_linear is not supported (no released model has biases)")
        if values["activation"] not in _ACTIVATIONS:
            raise ValueError(f"hidden_act {values['activation']!r} is not supported ({', '.join(_ACTIVATIONS)})")
        if values["attention_adapter"] and values["num_key_value_heads"] != heads:
            raise ValueError("Zamba 2's q/k/v adapters need num_key_value_heads = num_attention_heads (transformers "
                             "adds a 2 x hidden adapter output to k and v); fix config.json")
        if 2 * hidden % heads:
            raise ValueError(f"num_attention_heads ({heads}) must divide 2 x hidden_size ({2 * hidden})")
        context = 16384 if values.pop("long_context") else values["context_window_size"]   # transformers' rule
        values = dict(values, hybrid_layers=tuple(i for i, k in enumerate(kinds) if k in _HYBRID),
                      head_dim=2 * hidden // heads, intermediate_size=values["intermediate_size"] or 4 * hidden,
                      activation=_ACTIVATIONS[values["activation"]], dt_limit=(values["dt_limit"], float("inf")),
                      mamba_norm="gated", context_window_size=context)
        return super().adapt(cls.mamba_values(values, range(n)), hf, notes)

    def flags(self) -> Flags:
        return Flags(activation=self.activation, attn_scale=(self.head_dim / 2) ** -0.5)

    # The KV cache's layers: each hybrid layer's attention (0..H-1), then each layer's Mamba-2 state (H..H+L-1).
    def layer_attention(self) -> tuple[LayerAttention, ...]:
        attends = LayerAttention("full", None, self.rope_theta, self.rope_scaling, rope=self.mem_rope)
        state = LayerAttention("full", None, self.rope_theta, None, rope=False)
        return (attends,) * len(self.hybrid_layers) + (state,) * self.num_hidden_layers

    def state_layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        return ((),) * len(self.hybrid_layers) + (self.mamba_states(),) * self.num_hidden_layers


class SharedBlock(nn.Module):
    """A hybrid layer's transformer block: attention over [x, e], then the MLP, then `linear`."""

    def __init__(self, c: Zamba2Config):
        flags = c.flags()
        width = 2 * c.hidden_size
        self.input_layernorm = Norm(width, c.norm_eps)
        rope = inv_freq(c.rotary_dim, c.rope_theta, c.rope_scaling) if c.mem_rope else None
        self.self_attn = PagedAttention(width, c.num_attention_heads, c.num_key_value_heads, c.head_dim, flags,
                                        c.norm_eps, rope)
        self.self_attn.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.pre_ff_layernorm = Norm(c.hidden_size, c.norm_eps)
        self.mlp = MLP(c.hidden_size, c.intermediate_size, flags)
        self.linear = nn.Linear(c.hidden_size, c.hidden_size, bias=False)

    def forward(self, x: Tensor, embeddings: Tensor, kv, cache_layer: int, positions: Tensor) -> Tensor:
        h = self.self_attn(self.input_layernorm(op.concat([x, embeddings], dim=-1)), kv, cache_layer, positions)
        return self.linear(self.mlp(self.pre_ff_layernorm(h)))


class Zamba2Layer(nn.Module):
    def __init__(self, c: Zamba2Config, layer: int):
        self.hybrids, self.layers = len(c.hybrid_layers), c.num_hidden_layers
        self.hybrid = c.hybrid_layers.index(layer) if layer in c.hybrid_layers else None
        if self.hybrid is not None:
            self.shared = SharedBlock(c)
        self.input_layernorm = Norm(c.hidden_size, c.norm_eps)
        self.mamba = Mamba2Mixer(dataclasses.replace(c, norm_eps=1e-5))     # (the gated norm's fixed epsilon)

    def forward(self, x: Tensor, embeddings: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        h = x if self.hybrid is None else x + self.shared(x, embeddings, kv, self.hybrid, positions)
        return x + self.mamba(self.input_layernorm(h), kv, self.hybrids + layer_id)


class Zamba2Stack(PositionalStack):
    def __init__(self, c: Zamba2Config):
        super().__init__(c, [Zamba2Layer(c, i) for i in range(c.num_hidden_layers)])

    def forward(self, x: Tensor, kv) -> Tensor:
        b, s, _ = x.shape
        positions = kv.get_query_positions(b * s)
        embeddings = x
        for i, layer in enumerate(self.layers):
            x = layer(x, embeddings, kv, i, positions)
        return self.norm(x)


class Zamba2ForCausalLM(OwnedStackLM):
    """CausalLM's entry functions over Zamba2Stack; its KV cache always the one kiln owns."""

    STACK: ClassVar[type] = Zamba2Stack
    OWNED_ONLY: ClassVar[str] = "Zamba 2's Mamba-2 layers keep a recurrent state a sequence"


def _adapted(base: str, adapter: str) -> tuple[str, str, str]:
    """The block's weight and its hybrid layer's LoRA adapter (Linear `adapter`.0, then .1): the names _fold takes."""
    return f"{base}.weight", f"{adapter}.0.weight", f"{adapter}.1.weight"


def _fold(w: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """W + B A: a weight with its adapter folded in."""
    return (w.astype(np.float32) + b.astype(np.float32) @ a.astype(np.float32)).astype(w.dtype)


def weight_map(c: Zamba2Config) -> WeightMap:
    m: WeightMap = head_weights(c, norm="final_layernorm")
    for i in range(c.num_hidden_layers):
        k = hf = f"model.layers.{i}"
        is_hybrid = i in c.hybrid_layers
        decoder = f"{hf}.mamba_decoder" if is_hybrid else hf
        m[f"{k}.input_layernorm.weight"] = [f"{decoder}.input_layernorm.weight"]
        m.update(mamba_weights(c, f"{k}.mamba", f"{decoder}.mamba"))
        if not is_hybrid:
            continue
        h = c.hybrid_layers.index(i)
        # where its weights are: the block's first hybrid layer, transformers tying the rest to it with the
        # embeddings (tie_word_embeddings false: each hybrid layer's block its own)
        source = c.hybrid_layers[h % c.mem_blocks] if c.tie_word_embeddings else i
        block = f"model.layers.{source}.shared_transformer"
        s, a, f = f"{k}.shared", f"{block}.self_attn", f"{block}.feed_forward"
        m[f"{s}.input_layernorm.weight"] = [f"{block}.input_layernorm.weight"]
        m[f"{s}.pre_ff_layernorm.weight"] = [f"{block}.pre_ff_layernorm.weight"]
        m[f"{s}.linear.weight"] = [f"{hf}.linear.weight"]
        if c.attention_adapter:
            names = tuple(n for p in "qkv" for n in _adapted(f"{a}.{p}_proj", f"{a}.linear_{p}_adapter_list.{h}"))
            m[f"{s}.self_attn.qkv_proj.weight"] = WeightSpec(
                names, lambda w: np.concatenate([_fold(*w[j:j + 3]) for j in (0, 3, 6)]), apart=True)
        else:
            m[f"{s}.self_attn.qkv_proj.weight"] = [f"{a}.{p}_proj.weight" for p in "qkv"]
        m[f"{s}.self_attn.o_proj.weight"] = [f"{a}.o_proj.weight"]
        m[f"{s}.mlp.gate_up_proj.weight"] = WeightSpec(
            _adapted(f"{f}.gate_up_proj", f"{f}.gate_up_proj_adapter_list.{h}"), lambda w: _fold(*w), apart=True)
        m[f"{s}.mlp.down_proj.weight"] = [f"{f}.down_proj.weight"]
    return m
