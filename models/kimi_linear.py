"""Kimi Linear (Moonshot AI, Kimi-Linear-48B-A3B): Kimi Delta Attention (KDA) layers among latent-attention ones
(3:1 by `linear_attn_config`: its kda_layers and full_attn_layers, 1-based; else transformers' `layer_types`),
DeepSeek-V3's experts (sigmoid router with a choice bias, a shared expert) after the first dense layers.

    KDA layer        Qwen3.5's gated DeltaNet (models/qwen3_5.py) with a decay a key channel, not a head:
                     q, k, v (q_proj, k_proj, v_proj) each through a causal depthwise conv (q_conv1d, k_conv1d,
                     v_conv1d) and SiLU, q and k l2-normed, q scaled by head_dim ** -0.5; the log decay
                     g = -exp(A_log[h]) * softplus(f_b(f_a(x)) + dt_bias) [heads, head_dim]; beta =
                     sigmoid(b_proj(x)); the delta rule over a head's state [head_dim, head_dim] (targets/
                     recurrent.py, channels); its output RMS-normed a head (o_norm, rms_norm_eps) times
                     sigmoid(g_b(g_a(x))), then o_proj. The state sits in a slot of the KV cache kiln owns.
    attention layer  DeepSeek-V3's multi-head latent attention (models/mla.py) without RoPE (the shared key
                     part is kept, never rotated), scaled by (qk_nope_head_dim + qk_rope_head_dim) ** -0.5
    MLP              a SwiGLU MLP on the dense layers (`mlp_layer_types`, else the first `first_k_dense_replace`),
                     experts elsewhere (block_sparse_moe: experts' w1 / w3 / w2, a shared expert's gate / up /
                     down_proj)

Checkpoints under Moonshot's names, which transformers renames at load (and, saving, writes back but for the
dense layers' MLPs: `block_sparse_moe.` where Moonshot's files say `mlp.`; kiln reads Moonshot's). A KDA
layer's state holds every token before it: forks only at a sequence's end, as OLMo Hybrid's (models/
olmo_hybrid.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .causal_lm import LayerAttention, PositionalStack, WeightMap, WeightSpec
from .config import ConfigField, fields_with
from .deepseek import DeepseekV3Config
from .glm4_moe import MLP_LAYER_TYPES, DenseByType
from .layers import DecoderLayer
from .mamba2 import HybridLM, hybrid_weight_map
from .mla import LatentAttention, latent_weight_map
from .moe import SparseMoE, moe_weight_map
from .qwen3_5 import _l2norm

NAMES = dict(router="block_sparse_moe.gate", expert="block_sparse_moe.experts.{j}", gate="w1", up="w3", down="w2",
             shared="block_sparse_moe.shared_experts", choice_bias="block_sparse_moe.gate.e_score_correction_bias")


@dataclass(frozen=True)
class KimiLinearConfig(DenseByType, DeepseekV3Config):
    kda_layers: tuple[int, ...] = ()        # 0-based
    kda_heads: int = 32
    kda_head_dim: int = 128
    conv_taps: int = 4

    ARCH: ClassVar[str] = "kimi_linear"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*fields_with(
        DeepseekV3Config.FIELDS,
        ConfigField("context_window_size", ("max_position_embeddings", "model_max_length")),
        ConfigField("top_k", ("num_experts_per_tok", "num_experts_per_token")),
        ConfigField("groups", ("n_group", "num_expert_group"), default=1),
        ConfigField("norm_topk_prob", ("norm_topk_prob", "moe_renormalize"), default=True),
        ConfigField("first_dense", ("first_k_dense_replace",), default=1)), MLP_LAYER_TYPES)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        for key, want in (("moe_router_activation_func", "sigmoid"), ("mla_use_nope", True), ("moe_layer_freq", 1),
                          ("hidden_act", "silu")):
            if hf.get(key, want) != want:
                raise ValueError(f"Kimi Linear with {key} {hf[key]!r} is not supported (transformers' Kimi Linear: "
                                 f"{want!r}); fix config.json")
        linear = hf.get("linear_attn_config") or {}
        n = values["num_hidden_layers"]
        if hf.get("layer_types"):
            kda = [i for i, t in enumerate(hf["layer_types"]) if t == "linear_attention"]
        elif "kda_layers" in linear and "full_attn_layers" in linear:
            kda = [i - 1 for i in linear["kda_layers"]]                       # 1-based in the checkpoint
        else:
            kda = [i for i in range(n) if not (i and i % 4 == 0)]            # transformers' default
        values = dict(values, kda_layers=tuple(kda), kda_heads=int(linear.get("num_heads", hf.get(
            "linear_num_heads", 32))), kda_head_dim=int(linear.get("head_dim", hf.get("linear_head_dim", 128))),
            conv_taps=int(linear.get("short_conv_kernel_size", hf.get("linear_conv_kernel_dim", 4))),
            layer_types=())
        return super().adapt(values, hf, notes)

    @property
    def mamba_layers(self) -> tuple[int, ...]:
        """The KDA layers (HybridStack's recurrent ones)."""
        return self.kda_layers

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return (LayerAttention("full", None, self.rope_theta, None, rope=False),) * self.num_hidden_layers

    def conv_channels(self) -> int:
        return 3 * self.kda_heads * self.kda_head_dim

    def state_layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """A KDA layer's states: the conv's last inputs [channels, taps - 1] and S [heads, head_dim, head_dim]."""
        return tuple(((self.conv_channels(), self.conv_taps - 1), (self.kda_heads, self.kda_head_dim,
                                                                    self.kda_head_dim))
                     if i in self.kda_layers else () for i in range(self.num_hidden_layers))


class KimiDeltaAttention(nn.Module):
    """KDA over the layer's state slot (see the module's docstring)."""

    kv_dtype: str | None = None             # unused: the states are float32

    def __init__(self, c: KimiLinearConfig):
        h, d = self.heads, self.head_dim = c.kda_heads, c.kda_head_dim
        self.eps, width = c.norm_eps, h * d
        self.in_proj_qkv = nn.Linear(c.hidden_size, 3 * width, bias=False)
        self.conv = nn.Parameter((3 * width, c.conv_taps))
        self.f_a_proj = nn.Linear(c.hidden_size, d, bias=False)
        self.f_b_proj = nn.Linear(d, width, bias=False)
        self.dt_bias = nn.Parameter((width,))
        self.A_log = nn.Parameter((h,))
        self.b_proj = nn.Linear(c.hidden_size, h, bias=False)
        self.g_a_proj = nn.Linear(c.hidden_size, d, bias=False)
        self.g_b_proj = nn.Linear(d, width, bias=False)
        self.norm = nn.Parameter((d,))
        self.o_proj = nn.Linear(width, c.hidden_size, bias=False)

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        b, s, _ = x.shape
        h, d = self.heads, self.head_dim
        mixed = op.silu(kv.recurrent_conv(layer_id, self.in_proj_qkv(x), self.conv))
        q, k, v = (op.reshape(t, (b, s, h, d)) for t in op.split(mixed.astype("float32"), 3, axis=-1))
        q, k = _l2norm(q) * (d ** -0.5), _l2norm(k)
        f = self.f_b_proj(self.f_a_proj(x)).astype("float32") + self.dt_bias.astype("float32")
        rate = op.reshape(op.negative(op.exp(self.A_log.astype("float32"))), (h, 1))
        g = rate * op.softplus(op.reshape(f, (b, s, h, d)))                      # [b, s, h, d]: a key channel's
        beta = op.sigmoid(self.b_proj(x).astype("float32"))
        o = kv.gated_delta(layer_id, q, k, v, g, beta)                          # [b, s, h, d] f32
        gate = op.reshape(self.g_b_proj(self.g_a_proj(x)), (b, s, h, d)).astype("float32")
        o = op.rms_norm(o, self.norm.astype("float32"), axes=[-1], epsilon=self.eps) * op.sigmoid(gate)
        return self.o_proj(op.reshape(o, (b, s, h * d)).astype(x.dtype))


class KimiLinearStack(PositionalStack):
    def __init__(self, c: KimiLinearConfig):
        flags, spec = c.flags(), c.latent_attention()

        def layer(i: int) -> DecoderLayer:
            mixer = KimiDeltaAttention(c) if i in c.kda_layers else \
                LatentAttention(c.hidden_size, c.num_attention_heads, spec, flags.sm_scale(c.head_dim),
                                flags.qkv_bias)                                  # no RoPE
            moe = c.layer_moe(i)
            return DecoderLayer(c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                                c.head_dim, c.norm_eps, flags, None, SparseMoE(c.hidden_size, moe, flags) if moe
                                else None, mixer)
        super().__init__(c, [layer(i) for i in range(c.num_hidden_layers)], flags.norm)


class KimiLinearForCausalLM(HybridLM):
    STACK: ClassVar[type] = KimiLinearStack
    OWNED_ONLY: ClassVar[str] = "its KDA layers keep a recurrent state a sequence"


def weight_map(c: KimiLinearConfig) -> WeightMap:
    """DeepSeek-V3's map (latent attention, experts under block_sparse_moe, the shared expert's projections by
    their Llama names), each KDA layer's attention swapped for its mixer."""
    m = latent_weight_map(c, moe_weight_map(c, NAMES))
    for i in range(c.num_hidden_layers):
        if c.layer_moe(i) is not None:
            k, shared = f"model.layers.{i}.mlp.shared", f"model.layers.{i}.{NAMES['shared']}"
            m[f"{k}.gate_up_proj.weight"] = [f"{shared}.gate_proj.weight", f"{shared}.up_proj.weight"]
            m[f"{k}.down_proj.weight"] = [f"{shared}.down_proj.weight"]
    return hybrid_weight_map(c, m, "self_attn", _kda_weights)


def _kda_weights(c: KimiLinearConfig, s: str, a: str) -> WeightMap:
    """A KDA layer's weights: kiln's mixer `s` (q, k, v and their convs joined) from the checkpoint's `a`."""
    m: WeightMap = {f"{s}.in_proj_qkv.weight": [f"{a}.{x}_proj.weight" for x in "qkv"],
                    f"{s}.conv": WeightSpec(tuple(f"{a}.{x}_conv1d.weight" for x in "qkv"),   # [channels, 1, taps]
                                            lambda w: np.ascontiguousarray(w.reshape(-1, c.conv_taps))),  # (GGUF:
                                                                                  # [1, channels, 1, taps])
                    f"{s}.A_log": WeightSpec((f"{a}.A_log",), lambda w: np.ascontiguousarray(w.reshape(-1))),
                    f"{s}.norm": [f"{a}.o_norm.weight"], f"{s}.dt_bias": [f"{a}.dt_bias"]}
    for name in ("f_a_proj", "f_b_proj", "b_proj", "g_a_proj", "g_b_proj", "o_proj"):
        m[f"{s}.{name}.weight"] = [f"{a}.{name}.weight"]
    return m
