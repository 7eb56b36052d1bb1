"""Kimi Delta Attention (KDA) hybrids: KDA layers among latent-attention ones, DeepSeek-V3's experts.

    kimi_linear      Moonshot's Kimi Linear (Kimi-Linear-48B-A3B): 3:1 by `linear_attn_config` (its kda_layers
                     and full_attn_layers, 1-based; else transformers' `layer_types`), the MLA without RoPE
    bailing_hybrid   inclusionAI's Ling 3.0 (transformers' bailing_hybrid; the released code's
                     BailingMoeV3ForCausalLM): KDA with full-rank gate projections (f_proj, g_proj) and a bounded
                     decay (kda_safe_gate: lower_bound * sigmoid), the last layer of each `layer_group_size` MLA
                     with RoPE on pairs and each head's output gated (g_proj), SwiGLU clamped after its activation
                     a layer (expert_swiglu_limit_list, share_expert_swiglu_limit_list), under Bailing's names

    KDA layer        Qwen3.5's gated DeltaNet (models/qwen3_5.py) with a decay a key channel, not a head:
                     q, k, v (q_proj, k_proj, v_proj) each through a causal depthwise conv (q_conv1d, k_conv1d,
                     v_conv1d) and SiLU, q and k l2-normed, q scaled by head_dim ** -0.5; the log decay g
                     [heads, head_dim] = -exp(A_log[h]) * softplus(f + dt_bias), or with a lower bound b
                     b * sigmoid(exp(A_log[h]) * (f + dt_bias)), f = f_b(f_a(x)) (Kimi) or f_proj(x) (Ling);
                     beta = sigmoid(b_proj(x)); the delta rule over a head's state [head_dim, head_dim]
                     (targets/recurrent.py, channels); its output RMS-normed a head (o_norm, rms_norm_eps) times
                     sigmoid(g_b(g_a(x))) (or g_proj(x)), then o_proj. The state sits in a slot of the KV cache
                     kiln owns.
    attention layer  DeepSeek-V3's multi-head latent attention (models/mla.py), scaled by (qk_nope_head_dim +
                     qk_rope_head_dim) ** -0.5, RoPE (Ling's) in the graph
    MLP              a SwiGLU MLP on the dense layers (`mlp_layer_types`, else the first `first_k_dense_replace`),
                     experts elsewhere (Kimi: block_sparse_moe, experts' w1 / w3 / w2, a shared expert's gate /
                     up / down_proj; Ling: Qwen's names under mlp)

The released checkpoints' names, which transformers renames at load; saved by transformers (its config.json has
linear_head_dim) two differ, and kiln reads those (weight_map). A KDA layer's state holds every token before it:
forks only at a sequence's end, as OLMo Hybrid's (models/olmo_hybrid.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .causal_lm import LLAMA_NAMES, LayerAttention, PositionalStack, WeightMap, WeightSpec
from .config import ConfigField, fields_with, refuse_unlike
from .deepseek import DeepseekV3Config
from .glm4_moe import BAILING_NAMES, MLP_LAYER_TYPES, DenseByType
from .glm4_moe import NAMES as GLM4_NAMES
from .layers import DecoderLayer
from .mamba2 import HybridLM, hybrid_weight_map
from .mla import LatentAttention, latent_weight_map
from .moe import MoESpec, SparseMoE, moe_weight_map
from .qwen3_5 import _l2norm
from .rope import inv_freq

NAMES = dict(router="block_sparse_moe.gate", expert="block_sparse_moe.experts.{j}", gate="w1", up="w3", down="w2",
             shared="block_sparse_moe.shared_experts", shared_proj=("gate_proj", "up_proj", "down_proj"),
             choice_bias="block_sparse_moe.gate.e_score_correction_bias")


@dataclass(frozen=True)
class KimiLinearConfig(DenseByType, DeepseekV3Config):
    kda_layers: tuple[int, ...] = ()        # 0-based
    kda_heads: int = 32
    kda_head_dim: int = 128
    conv_taps: int = 4
    kda_low_rank: bool = True               # the decay's and output gate's projections through head_dim (Kimi's)
    kda_lower_bound: float | None = None    # a bounded decay b * sigmoid(...) (Ling's safe gate); None: softplus's
    mla_rope: bool = False
    mla_gated: bool = False
    saved_by_transformers: bool = False     # config.json as transformers writes it (linear_head_dim): its tensor
                                            # names differ from the released checkpoints' in places (weight_map)

    ARCH: ClassVar[str] = "kimi_linear"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*fields_with(
        DeepseekV3Config.FIELDS,
        ConfigField("context_window_size", ("max_position_embeddings", "model_max_length")),
        ConfigField("top_k", ("num_experts_per_tok", "num_experts_per_token")),
        ConfigField("groups", ("n_group", "num_expert_group"), default=1),
        ConfigField("norm_topk_prob", ("norm_topk_prob", "moe_renormalize"), default=True),
        ConfigField("first_dense", ("first_k_dense_replace",), default=1)), MLP_LAYER_TYPES)

    REFUSED: ClassVar[tuple[tuple[str, object], ...]] = (       # config.json values transformers' model does not
        ("moe_router_activation_func", "sigmoid"), ("mla_use_nope", True), ("moe_layer_freq", 1),   # run: the
        ("hidden_act", "silu"))                                                                     # ones it does

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        refuse_unlike(hf, cls.REFUSED, cls.ARCH)
        return super().adapt(dict(values, **cls._kda(values, hf, notes), layer_types=(),
                                  saved_by_transformers="linear_head_dim" in hf), hf, notes)

    @classmethod
    def _kda(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        """The KDA layers and their shape."""
        linear = hf.get("linear_attn_config") or {}
        n = values["num_hidden_layers"]
        if hf.get("layer_types"):
            kda = [i for i, t in enumerate(hf["layer_types"]) if t == "linear_attention"]
        elif "kda_layers" in linear and "full_attn_layers" in linear:
            kda = [i - 1 for i in linear["kda_layers"]]                       # 1-based in the checkpoint
        else:
            kda = [i for i in range(n) if not (i and i % 4 == 0)]            # transformers' default
        return dict(kda_layers=tuple(kda), kda_heads=int(linear.get("num_heads", hf.get("linear_num_heads", 32))),
                    kda_head_dim=int(linear.get("head_dim", hf.get("linear_head_dim", 128))),
                    conv_taps=int(linear.get("short_conv_kernel_size", hf.get("linear_conv_kernel_dim", 4))))

    @property
    def mamba_layers(self) -> tuple[int, ...]:
        """The KDA layers (HybridStack's recurrent ones)."""
        return self.kda_layers

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return (LayerAttention("full", None, self.rope_theta, self.rope_scaling, rope=self.mla_rope),) * \
            self.num_hidden_layers

    def conv_channels(self) -> int:
        return 3 * self.kda_heads * self.kda_head_dim

    def state_layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """A KDA layer's states: the conv's last inputs [channels, taps - 1] and S [heads, head_dim, head_dim]."""
        return tuple(((self.conv_channels(), self.conv_taps - 1), (self.kda_heads, self.kda_head_dim,
                                                                    self.kda_head_dim))
                     if i in self.kda_layers else () for i in range(self.num_hidden_layers))


@dataclass(frozen=True)
class BailingHybridConfig(KimiLinearConfig):
    glu_limits: tuple[float, ...] = ()      # a layer's experts' SwiGLU clamp (0: none)
    shared_glu_limits: tuple[float, ...] = ()
    shared_width: int | None = None         # moe_shared_expert_intermediate_size (the released code's)

    ARCH: ClassVar[str] = "bailing_hybrid"
    STAND_IN: ClassVar[tuple[str, str]] = ("bailing_hybrid", "BailingHybridForCausalLM")   # (the released code's
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(                                 # config.json too)
        KimiLinearConfig.FIELDS, ConfigField("groups", ("n_group", "num_expert_group"), default=8),
        ConfigField("top_groups", ("topk_group",), default=4),
        ConfigField("routed_scale", ("routed_scaling_factor",), default=2.5),
        ConfigField("first_dense", ("first_k_dense_replace",), default=2),
        ConfigField("context_window_size", ("max_position_embeddings", "model_max_length"), default=262144),
        ConfigField("rope_theta", ("rope_theta",), default=6000000.0),
        ConfigField("shared_width", ("moe_shared_expert_intermediate_size",), default=None))

    REFUSED: ClassVar[tuple[tuple[str, object], ...]] = (
        ("no_kda_lora", True), ("gated_attention_proj_granularity_type", "head_wise"), ("score_function", "sigmoid"),
        ("hidden_act", "silu"))

    @classmethod
    def _kda(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        """KDA on every layer but the last of each layer_group_size (else `layer_types`), the attention's heads,
        head_dim wide (linear_head_dim where transformers saved the config); the clamps a layer."""
        n, group = values["num_hidden_layers"], int(hf.get("layer_group_size", 6))
        types = hf.get("layer_types") or ["full_attention" if (i + 1) % group == 0 else "linear_attention"
                                          for i in range(n)]
        if not hf.get("layer_types") and n % group:
            notes.append(f"layers {n // group * group}-{n - 1} (a last group shorter than layer_group_size {group}) "
                         "are KDA as transformers builds them; llama.cpp's converter makes them latent attention")

        def limits(key: str) -> tuple[float, ...]:
            given = [float(v or 0.0) for v in (hf.get(key) or [])[:n]]
            return tuple(given + [0.0] * (n - len(given)))
        return dict(kda_layers=tuple(i for i, t in enumerate(types) if t == "linear_attention"),
                    kda_heads=values["num_attention_heads"],
                    kda_head_dim=int(hf.get("linear_head_dim") or hf.get("head_dim") or 128),
                    conv_taps=int(hf.get("short_conv_kernel_size", 4)), kda_low_rank=False,
                    kda_lower_bound=float(hf.get("kda_lower_bound", -5.0)) if hf.get("kda_safe_gate", True) else None,
                    mla_rope=True, mla_gated=True, glu_limits=limits("expert_swiglu_limit_list"),
                    shared_glu_limits=limits("share_expert_swiglu_limit_list"))

    def layer_moe(self, layer: int) -> MoESpec | None:
        spec = super().layer_moe(layer)
        if spec is None:
            return None
        shared = self.shared_width if self.shared_width is not None else spec.shared_intermediate_size
        return dataclasses.replace(spec, shared_intermediate_size=shared, glu_limit=self.glu_limits[layer],
                                   shared_glu_limit=self.shared_glu_limits[layer])


class KimiDeltaAttention(nn.Module):
    """KDA over the layer's state slot (see the module's docstring)."""

    kv_dtype: str | None = None             # unused: the states are float32

    def __init__(self, c: KimiLinearConfig):
        h, d = self.heads, self.head_dim = c.kda_heads, c.kda_head_dim
        self.eps, self.lower_bound, width = c.norm_eps, c.kda_lower_bound, h * d
        self.in_proj_qkv = nn.Linear(c.hidden_size, 3 * width, bias=False)
        self.conv = nn.Parameter((3 * width, c.conv_taps))
        if c.kda_low_rank:
            self.f_a_proj = nn.Linear(c.hidden_size, d, bias=False)
            self.f_b_proj = nn.Linear(d, width, bias=False)
            self.g_a_proj = nn.Linear(c.hidden_size, d, bias=False)
            self.g_b_proj = nn.Linear(d, width, bias=False)
        else:
            self.f_proj = nn.Linear(c.hidden_size, width, bias=False)
            self.g_proj = nn.Linear(c.hidden_size, width, bias=False)
        self.dt_bias = nn.Parameter((width,))
        self.A_log = nn.Parameter((h,))
        self.b_proj = nn.Linear(c.hidden_size, h, bias=False)
        self.norm = nn.Parameter((d,))
        self.o_proj = nn.Linear(width, c.hidden_size, bias=False)

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        b, s, _ = x.shape
        h, d = self.heads, self.head_dim
        low = hasattr(self, "f_a_proj")
        mixed = op.silu(kv.recurrent_conv(layer_id, self.in_proj_qkv(x), self.conv))
        q, k, v = (op.reshape(t, (b, s, h, d)) for t in op.split(mixed.astype("float32"), 3, axis=-1))
        q, k = _l2norm(q) * (d ** -0.5), _l2norm(k)
        f = self.f_b_proj(self.f_a_proj(x)) if low else self.f_proj(x)
        f = op.reshape(f.astype("float32") + self.dt_bias.astype("float32"), (b, s, h, d))
        rate = op.reshape(op.exp(self.A_log.astype("float32")), (h, 1))
        if self.lower_bound is None:
            g = op.negative(rate) * op.softplus(f)                              # [b, s, h, d]: a key channel's
        else:
            g = op.sigmoid(rate * f) * self.lower_bound
        beta = op.sigmoid(self.b_proj(x).astype("float32"))
        o = kv.gated_delta(layer_id, q, k, v, g, beta)                          # [b, s, h, d] f32
        gate = self.g_b_proj(self.g_a_proj(x)) if low else self.g_proj(x)
        gate = op.reshape(gate, (b, s, h, d)).astype("float32")
        o = op.rms_norm(o, self.norm.astype("float32"), axes=[-1], epsilon=self.eps) * op.sigmoid(gate)
        return self.o_proj(op.reshape(o, (b, s, h * d)).astype(x.dtype))


class KimiLinearStack(PositionalStack):
    def __init__(self, c: KimiLinearConfig):
        flags, spec = c.flags(), c.latent_attention()
        rope = inv_freq(c.rotary_dim, c.rope_theta, c.rope_scaling) if c.mla_rope else None

        def layer(i: int) -> DecoderLayer:
            mixer = KimiDeltaAttention(c) if i in c.kda_layers else \
                LatentAttention(c.hidden_size, c.num_attention_heads, spec, flags.sm_scale(c.head_dim),
                                flags.qkv_bias, rope, gated=c.mla_gated)
            moe = c.layer_moe(i)
            return DecoderLayer(c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                                c.head_dim, c.norm_eps, flags, None, SparseMoE(c.hidden_size, moe, flags) if moe
                                else None, mixer)
        super().__init__(c, [layer(i) for i in range(c.num_hidden_layers)], flags.norm)


class KimiLinearForCausalLM(HybridLM):
    STACK: ClassVar[type] = KimiLinearStack
    OWNED_ONLY: ClassVar[str] = "its KDA layers keep a recurrent state a sequence"


BailingHybridForCausalLM = KimiLinearForCausalLM


def weight_map(c: KimiLinearConfig) -> WeightMap:
    """DeepSeek-V3's map (latent attention; Kimi's experts under block_sparse_moe, the shared expert's projections
    by their Llama names; Ling's under Bailing's names), each KDA layer's attention swapped for its mixer. Where
    transformers saved the checkpoint, its conversion's reverse names two tensors otherwise: Kimi's dense MLPs under
    block_sparse_moe (Moonshot's: mlp), Ling's KDA output projection attention.dense (the released: o_proj)."""
    if isinstance(c, BailingHybridConfig):
        m = latent_weight_map(c, moe_weight_map(c, dict(GLM4_NAMES, choice_bias="mlp.gate.expert_bias"),
                                                BAILING_NAMES), "attention")
        for i in range(c.num_hidden_layers):
            if i not in c.kda_layers:
                m[f"model.layers.{i}.self_attn.g_proj.weight"] = [f"model.layers.{i}.attention.g_proj.weight"]
        return hybrid_weight_map(c, m, "attention", _kda_weights)
    dense = {p: f"block_sparse_moe.{p}" for p in ("gate_proj", "up_proj", "down_proj")} \
        if c.saved_by_transformers else {}
    m = latent_weight_map(c, moe_weight_map(c, NAMES, dict(LLAMA_NAMES, **dense)))
    return hybrid_weight_map(c, m, "self_attn", _kda_weights)


def _kda_weights(c: KimiLinearConfig, s: str, a: str) -> WeightMap:
    """A KDA layer's weights: kiln's mixer `s` (q, k, v and their convs joined) from the checkpoint's `a`."""
    m: WeightMap = {f"{s}.in_proj_qkv.weight": [f"{a}.{x}_proj.weight" for x in "qkv"],
                    f"{s}.conv": WeightSpec(tuple(f"{a}.{x}_conv1d.weight" for x in "qkv"),   # [channels, 1, taps]
                                            lambda w: np.ascontiguousarray(w.reshape(-1, c.conv_taps))),  # (GGUF:
                                                                                  # [1, channels, 1, taps])
                    f"{s}.A_log": WeightSpec((f"{a}.A_log",), lambda w: np.ascontiguousarray(w.reshape(-1))),
                    f"{s}.norm": [f"{a}.o_norm.weight"], f"{s}.dt_bias": [f"{a}.dt_bias"]}
    gates = ("f_a_proj", "f_b_proj", "g_a_proj", "g_b_proj") if c.kda_low_rank else ("f_proj", "g_proj")
    for name in (*gates, "b_proj"):
        m[f"{s}.{name}.weight"] = [f"{a}.{name}.weight"]
    ling_saved = isinstance(c, BailingHybridConfig) and c.saved_by_transformers
    m[f"{s}.o_proj.weight"] = [f"{a}.{'dense' if ling_saved else 'o_proj'}.weight"]
    return m
