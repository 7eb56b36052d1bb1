"""Mamba-2 layers among attention layers: IBM's Granite 4.0 hybrids (granitemoehybrid's -h- models: Mamba-2 and
attention layers with Granite's multipliers, a MoE beside a shared MLP or the shared MLP alone), Bamba (Mamba-2 and
attention layers with Llama MLPs, RoPE on half of each head), NVIDIA's Nemotron-H and Nemotron-H MoE (a block a
layer: Mamba-2, attention without positions, a squared-ReLU MLP or experts, each behind its own norm and residual),
and Mamba-2 alone (Nemotron-H's blocks, every one Mamba-2). Falcon-H1's layers (models/falcon_h1.py) use the mixer
too.

    Mamba-2 layer   z, xBC, dt = in_proj(x)                 (inner, inner + 2 groups state, heads)
                    x, B, C = silu(conv(xBC) + conv_bias)   (a causal depthwise conv of d_conv taps)
                    dt = clamp(softplus(dt + dt_bias), time_step_limit);  A = -exp(A_log)
                    S <- S e^(dt A) + B (dt x)^T;  y = S^T C + D x      (a head's S [state, head_dim]; heads
                                                                       grouped over the groups' B and C)
                    out_proj(rmsnorm_g(y * silu(z)) * w)     (RMS over each group's inner / groups channels)

A Mamba-2 layer's state (the conv's last inputs, the scan's S) is a fixed size a sequence, kept in a state slot
of the KV cache kiln owns: the conv is Qwen3.5's (models/owned_kv.py recurrent_conv), the scan its delta rule
without the delta (gated_delta(..., delta=False), targets/recurrent.py). Attention layers' keys and values sit
in its pages as usual (RoPE, where the family has it, in the graph). As for Qwen3.5 a state holds every token
before it, so such a model shares no prefixes and speculates on none.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .causal_lm import (DECODER_FIELDS, LLAMA_NAMES, DecoderConfig, OwnedStackLM, PositionalStack, WeightMap,
                        WeightSpec, decoder_weight_map, head_weights)
from .config import ConfigField, fields_with
from .layers import MLP, DecoderLayer, Flags, Norm, PagedAttention, scalar
from .llama import LlamaConfig
from .moe import MoESpec, SparseMoE
from .rope import inv_freq

MAMBA_FIELDS = (
    ConfigField("mamba_heads", ("mamba_n_heads", "mamba_num_heads"), default=128),
    ConfigField("mamba_head_dim", ("mamba_d_head", "mamba_head_dim"), default=None),      # None / "auto": inner /
    ConfigField("mamba_groups", ("mamba_n_groups", "n_groups"), default=1),               # heads
    ConfigField("mamba_state", ("mamba_d_state", "ssm_state_size"), default=256),
    ConfigField("mamba_taps", ("mamba_d_conv", "conv_kernel"), default=4),
    ConfigField("mamba_expand", ("mamba_expand", "expand"), default=2),
    ConfigField("mamba_conv_bias", ("mamba_conv_bias", "use_conv_bias"), default=True),
    ConfigField("mamba_proj_bias", ("mamba_proj_bias",), default=False),
    ConfigField("dt_limit", ("time_step_limit", "mamba_dt_limit"), default=None),
    ConfigField("mamba_activation", ("mamba_hidden_act",), default="silu"),
)


@dataclass(frozen=True)
class Mamba2Fields:
    """A hybrid's Mamba-2 geometry and which layers are Mamba-2 ones (a mixin before the config it extends)."""

    mamba_heads: int = 128
    mamba_head_dim: int = 64
    mamba_groups: int = 1
    mamba_state: int = 256
    mamba_taps: int = 4
    mamba_expand: int = 2
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    dt_limit: tuple[float, float] = (0.0, float("inf"))
    mamba_activation: str = "silu"
    mamba_layers: tuple[int, ...] = ()
    mamba_norm: str = "gated"           # rmsnorm(y * silu(z)) * w; "before_gate": rmsnorm(y) * w * silu(z);
                                        # "none": y * silu(z) (Falcon-H1's mamba_rms_norm false)
    mamba_out_bias: bool | None = None  # out_proj's bias where it is not in_proj's (Falcon-H1's projectors_bias)

    @classmethod
    def mamba_values(cls, values: dict, mamba_layers, inner: int | None = None) -> dict:
        """values with the Mamba-2 fields checked and completed (the head size from `inner`, else expand x hidden,
        where "auto")."""
        heads, groups = values["mamba_heads"], values["mamba_groups"]
        if values["mamba_head_dim"] in (None, "auto"):
            inner = inner or values["mamba_expand"] * values["hidden_size"]
            if inner % heads:
                raise ValueError(f"mamba_n_heads ({heads}) must divide mamba_expand * hidden_size ({inner}); fix "
                                 "config.json")
            values = dict(values, mamba_head_dim=inner // heads)
        elif inner is not None:
            cls.check_inner(values, inner, "mamba_d_ssm")
        if heads % groups:
            raise ValueError(f"mamba_n_groups ({groups}) must divide the {heads} Mamba heads; fix config.json")
        if values["mamba_activation"] != "silu":
            raise ValueError(f"Mamba-2 layers with activation {values['mamba_activation']!r} are not supported (the "
                             "released ones use silu)")
        if values["mamba_taps"] < 2:
            raise ValueError(f"the Mamba conv needs at least 2 taps (got {values['mamba_taps']})")
        limit = tuple(_float(x) for x in (values["dt_limit"] or (0.0, float("inf"))))
        if len(limit) != 2 or not limit[0] <= limit[1]:
            raise ValueError(f"time_step_limit must be (min, max); got {values['dt_limit']}")
        return dict(values, dt_limit=limit, mamba_layers=tuple(mamba_layers))

    @staticmethod
    def check_inner(values: dict, inner: int, name: str) -> None:
        """The Mamba heads x head size must be the inner width the config names (`name`)."""
        if values["mamba_heads"] * values["mamba_head_dim"] != inner:
            raise ValueError(f"the Mamba heads x head size ({values['mamba_heads']} x {values['mamba_head_dim']}) "
                             f"must be {name} ({inner}); fix config.json")

    @property
    def mamba_inner(self) -> int:
        return self.mamba_heads * self.mamba_head_dim

    def conv_channels(self) -> int:
        return self.mamba_inner + 2 * self.mamba_groups * self.mamba_state

    def mamba_states(self) -> tuple[tuple[int, ...], ...]:
        """A Mamba-2 layer's states: the conv's last inputs [channels, taps - 1] and S [heads, state, head_dim]."""
        return ((self.conv_channels(), self.mamba_taps - 1), (self.mamba_heads, self.mamba_state, self.mamba_head_dim))

    def state_layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        if not self.mamba_layers:
            return ()
        return tuple(self.mamba_states() if i in self.mamba_layers else () for i in range(self.num_hidden_layers))


class Mamba2Mixer(nn.Module):
    """A Mamba-2 layer over its state slot (see the module's docstring)."""

    kv_dtype: str | None = None             # unused: the states are float32

    def __init__(self, c: Mamba2Fields):
        self.heads, self.head_dim, self.groups, self.state = c.mamba_heads, c.mamba_head_dim, c.mamba_groups, \
            c.mamba_state
        self.inner, self.eps, self.dt_limit, self.norm_kind = c.mamba_inner, c.norm_eps, c.dt_limit, c.mamba_norm
        channels = c.conv_channels()
        self.in_proj = nn.Linear(c.hidden_size, self.inner + channels + self.heads, bias=c.mamba_proj_bias)
        self.conv = nn.Parameter((channels, c.mamba_taps))
        if c.mamba_conv_bias:
            self.conv_bias = nn.Parameter((channels,))
        self.dt_bias = nn.Parameter((self.heads,))
        self.A_log = nn.Parameter((self.heads,))
        self.D = nn.Parameter((self.heads,))
        if c.mamba_norm != "none":
            self.norm = nn.Parameter((self.inner,))
        out_bias = c.mamba_proj_bias if c.mamba_out_bias is None else c.mamba_out_bias
        self.out_proj = nn.Linear(self.inner, c.hidden_size, bias=out_bias)

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor | None = None) -> Tensor:
        b, s, _ = x.shape
        heads, p, groups, n, inner = self.heads, self.head_dim, self.groups, self.state, self.inner
        z, xbc, dt = op.split(self.in_proj(x), [inner, inner + inner + 2 * groups * n], axis=-1)
        xbc = kv.recurrent_conv(layer_id, xbc, self.conv)
        if hasattr(self, "conv_bias"):
            xbc = xbc + self.conv_bias
        xs, B, C = op.split(op.silu(xbc).astype("float32"), [inner, inner + groups * n], axis=-1)
        dt = op.softplus(dt.astype("float32") + self.dt_bias.astype("float32"))          # [b, s, heads]
        low, high = self.dt_limit
        if low > 0.0:
            dt = op.maximum(dt, scalar(low))
        if high != float("inf"):            # (no infinite bound in the graph: WGSL has no literal for it)
            dt = op.minimum(dt, scalar(high))
        g = dt * op.negative(op.exp(self.A_log.astype("float32")))
        xs = op.reshape(xs, (b, s, heads, p))
        B, C = (op.reshape(t, (b, s, groups, n)) for t in (B, C))
        y = kv.gated_delta(layer_id, C, B, xs, g, dt, delta=False)                       # [b, s, heads, p] f32
        y = op.reshape(y + xs * op.reshape(self.D.astype("float32"), (heads, 1)), (b, s, inner))
        gate = op.silu(z.astype("float32"))
        if self.norm_kind == "none":
            return self.out_proj((y * gate).astype(x.dtype))
        y = self._normed(y * gate if self.norm_kind == "gated" else y)
        return self.out_proj((y if self.norm_kind == "gated" else y * gate).astype(x.dtype))

    def _normed(self, y: Tensor) -> Tensor:
        """RMSNorm over each group's inner / groups channels, times the norm's weight."""
        b, s, inner = y.shape
        width = inner // self.groups
        y = op.rms_norm(op.reshape(y, (b, s, self.groups, width)), op.ones((width,), "float32"), axes=[-1],
                        epsilon=self.eps)
        return op.reshape(y, (b, s, inner)) * self.norm.astype("float32")


def _float(x) -> float:
    """A config number, transformers 5's {"__float__": "Infinity"} (how it writes an infinity) too."""
    return float(x["__float__"] if isinstance(x, dict) and "__float__" in x else x)


def mamba_weights(c: Mamba2Fields, kiln: str, hf: str) -> WeightMap:
    """A Mamba-2 layer's weights: kiln's mixer `kiln` from the checkpoint's mixer `hf` (their shared names)."""
    m: WeightMap = {f"{kiln}.{x}.weight": [f"{hf}.{x}.weight"] for x in ("in_proj", "out_proj")}
    if c.mamba_proj_bias:
        m[f"{kiln}.in_proj.bias"] = [f"{hf}.in_proj.bias"]
    if c.mamba_proj_bias if c.mamba_out_bias is None else c.mamba_out_bias:
        m[f"{kiln}.out_proj.bias"] = [f"{hf}.out_proj.bias"]
    m[f"{kiln}.conv"] = WeightSpec((f"{hf}.conv1d.weight",), lambda w: np.ascontiguousarray(w.reshape(w.shape[0], -1)))
    if c.mamba_conv_bias:
        m[f"{kiln}.conv_bias"] = [f"{hf}.conv1d.bias"]
    for x in ("dt_bias", "A_log", "D"):
        m[f"{kiln}.{x}"] = [f"{hf}.{x}"]
    if c.mamba_norm != "none":
        m[f"{kiln}.norm"] = [f"{hf}.norm.weight"]
    return m


class HybridStack(PositionalStack):
    """Decoder layers (norm, mixer, norm, MLP or experts) whose mixer is MIXER's (Mamba-2) in `mamba_layers` and
    attention elsewhere (RoPE, where a layer has it, in the graph)."""

    MIXER: ClassVar[Callable] = Mamba2Mixer        # config -> a recurrent mixer

    def __init__(self, c):
        flags = c.flags()

        def layer(i: int, a) -> DecoderLayer:
            mamba = self.MIXER(c) if i in c.mamba_layers else None
            rope = inv_freq(c.rotary_dim, a.rope_theta, a.rope_scaling) if a.rope and mamba is None else None
            moe = c.layer_moe(i)
            return DecoderLayer(c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                                c.head_dim, c.norm_eps, c.layer_flags(i), rope,
                                SparseMoE(c.hidden_size, moe, flags) if moe else None, mamba)
        super().__init__(c, [layer(i, a) for i, a in enumerate(c.layer_attention())], flags.norm)


class HybridLM(OwnedStackLM):
    """CausalLM's entry functions over HybridStack; its KV cache always the one kiln owns."""

    STACK: ClassVar[type] = HybridStack
    OWNED_ONLY: ClassVar[str] = "its Mamba layers keep a recurrent state a sequence"


def hybrid_weight_map(c, m: WeightMap, mamba: str, mixer: Callable[..., WeightMap] | None = None,
                      replaced: tuple[str, ...] = ("self_attn",)) -> WeightMap:
    """A decoder weight map `m` with each recurrent layer's weights under its `replaced` modules (its attention's)
    swapped for its mixer's, `mixer(c, kiln's prefix, the checkpoint's)` (Mamba-2's by default), the checkpoint's
    under the layer's `mamba` module."""
    for i in c.mamba_layers:
        k = f"model.layers.{i}"
        for key in [key for key in m if key.startswith(tuple(f"{k}.{r}." for r in replaced))]:
            del m[key]
        m.update((mixer or mamba_weights)(c, f"{k}.self_attn", f"{k}.{mamba}"))
    return m


# -- Bamba -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BambaConfig(Mamba2Fields, LlamaConfig):
    """Bamba: Mamba-2 layers but at `attn_layer_indices`, Llama MLPs (`feed_forward`), RoPE on half of each head."""

    ARCH: ClassVar[str] = "bamba"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*LlamaConfig.FIELDS, *MAMBA_FIELDS,
                                                 ConfigField("attention_layers", ("attn_layer_indices",), default=()))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        attention = set(values.pop("attention_layers") or ())
        values = cls.mamba_values(dict(values, partial_rotary_factor=0.5), [i for i in range(n) if i not in attention])
        return super().adapt(values, hf, notes)


def bamba_weight_map(c: BambaConfig) -> WeightMap:
    names = {"norm": "model.final_layernorm", "post_attention_layernorm": "pre_ff_layernorm",
             "gate_proj": "feed_forward.gate_proj", "up_proj": "feed_forward.up_proj",
             "down_proj": "feed_forward.down_proj"}
    m = decoder_weight_map(c, {**LLAMA_NAMES, **names})
    return hybrid_weight_map(c, m, "mamba")


# -- Nemotron-H --------------------------------------------------------------------------------------------------

MAMBA2_CONTEXT = 1 << 20          # a Mamba-2 model's context where its config names none (llama.cpp's choice)
NEMOTRON_H_KINDS = {"linear_attention": "mamba", "mamba": "mamba", "M": "mamba", "full_attention": "attention",
                    "attention": "attention", "*": "attention", "mlp": "mlp", "-": "mlp", "moe": "moe", "E": "moe"}


@dataclass(frozen=True)
class NemotronHConfig(Mamba2Fields, DecoderConfig):
    """Nemotron-H: a block a layer, its kind from `layers_block_type` (or `hybrid_override_pattern`: M Mamba-2,
    * attention, - MLP, E experts); MLPs relu(x)^2 without a gate; attention without RoPE; weights under `backbone`.
    Nemotron-H MoE's (Nemotron 3 Nano) expert blocks: `n_routed_experts` such MLPs routed as DeepSeek-V3 routes
    (sigmoid scores, a choice bias, `n_group` groups), beside a shared one of moe_shared_expert_intermediate_size."""

    block_kinds: tuple[str, ...] = ()
    mlp_bias: bool = False
    num_experts: int = 0
    top_k: int = 1
    moe_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    groups: int = 1
    top_groups: int = 1
    routed_scale: float = 1.0
    norm_topk_prob: bool = True

    ARCH: ClassVar[str] = "nemotron_h"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, *MAMBA_FIELDS,
        ConfigField("norm_eps", ("layer_norm_epsilon", "rms_norm_eps"), default=1e-5),
        ConfigField("num_hidden_layers", ("num_hidden_layers",), default=None),
        ConfigField("mamba_heads", ("mamba_num_heads", "mamba_n_heads"), default=128),
        ConfigField("mamba_head_dim", ("mamba_head_dim", "mamba_d_head"), default=64),
        ConfigField("mamba_groups", ("n_groups", "mamba_n_groups"), default=8),
        ConfigField("mamba_state", ("ssm_state_size", "mamba_d_state"), default=128),
        ConfigField("mamba_conv_bias", ("use_conv_bias", "mamba_conv_bias"), default=True),
        ConfigField("block_kinds", ("layers_block_type", "layer_types", "hybrid_override_pattern")),
        ConfigField("activation", ("mlp_hidden_act",), default="relu2"),
        ConfigField("mlp_bias", ("mlp_bias",), default=False),
        ConfigField("num_experts", ("n_routed_experts", "num_local_experts"), default=0),
        ConfigField("top_k", ("num_experts_per_tok",), default=1),
        ConfigField("moe_intermediate_size", ("moe_intermediate_size",), default=0),
        ConfigField("shared_intermediate_size", ("moe_shared_expert_intermediate_size",), default=0),
        ConfigField("shared_experts", ("n_shared_experts",), default=1),
        ConfigField("groups", ("n_group",), default=1), ConfigField("top_groups", ("topk_group",), default=1),
        ConfigField("routed_scale", ("routed_scaling_factor",), default=1.0),
        ConfigField("norm_topk_prob", ("norm_topk_prob",), default=True),
        ConfigField("latent_size", ("moe_latent_size",), default=None))

    @classmethod
    def from_hf(cls, hf: dict) -> "NemotronHConfig":
        blocks = hf.get("layers_block_type") or hf.get("layer_types") or hf.get("hybrid_override_pattern") or ""
        if not hf.get("num_hidden_layers"):
            hf = dict(hf, num_hidden_layers=len(blocks))
        return super().from_hf(hf)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        kinds = []
        for block in values.pop("block_kinds"):
            if block not in NEMOTRON_H_KINDS:
                raise ValueError(f"Nemotron-H block {block!r} is not supported (supported: Mamba-2 'M', attention "
                                 "'*', MLP '-', experts 'E')")
            kinds.append(NEMOTRON_H_KINDS[block])
        if values.pop("latent_size") is not None and "moe" in kinds:
            raise ValueError("Nemotron-H experts in a latent space (moe_latent_size: Nemotron 3 Super) are not "
                             "supported yet")
        if values.pop("shared_experts") != 1 and "moe" in kinds:
            raise ValueError("Nemotron-H with n_shared_experts other than 1 is not supported (its shared MLP is one "
                             "MLP of moe_shared_expert_intermediate_size)")
        if "moe" not in kinds:
            values["num_experts"] = 0
        if len(kinds) != values["num_hidden_layers"]:
            raise ValueError(f"layers_block_type lists {len(kinds)} blocks for {values['num_hidden_layers']} layers; "
                             "fix config.json")
        if values.pop("activation") != "relu2":
            raise ValueError("Nemotron-H with an MLP activation other than relu2 is not supported")
        values = cls.mamba_values(values, [i for i, k in enumerate(kinds) if k == "mamba"])
        return dict(values, block_kinds=tuple(kinds))

    def flags(self) -> Flags:
        return Flags(activation="relu2", gated_mlp=False, mlp_bias=self.mlp_bias)

    def layer_attention(self):
        return tuple(dataclasses.replace(a, rope=False) for a in super().layer_attention())

    def layer_moe(self, layer: int) -> MoESpec | None:
        if self.block_kinds[layer] != "moe":
            return None
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, normalize=self.norm_topk_prob,
                       shared_intermediate_size=self.shared_intermediate_size, shared_gated=False, scoring="sigmoid",
                       choice_bias=True, groups=self.groups, top_groups=self.top_groups, routed_scale=self.routed_scale,
                       norm_eps=1e-20, gated=False)


@dataclass(frozen=True)
class Mamba2Config(NemotronHConfig):
    """Mamba-2 alone (Mamba2ForCausalLM: Mamba-Codestral, the state-spaces models): Nemotron-H's blocks, every one
    Mamba-2, its sizes under Mamba2Config's names (num_heads, head_dim, state_size, expand, use_bias); no attention
    and no context limit of its own (a state a sequence: `context` caps what the artifact takes)."""

    ARCH: ClassVar[str] = "mamba2"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        NemotronHConfig.FIELDS, ConfigField("intermediate_size", ("intermediate_size",), default=0),
        ConfigField("num_attention_heads", ("num_attention_heads",), default=1),
        ConfigField("head_dim", ("attention_head_dim",), default=None),
        ConfigField("context_window_size", ("max_position_embeddings",), default=MAMBA2_CONTEXT),
        ConfigField("mamba_heads", ("num_heads", "mamba_num_heads"), default=128),
        ConfigField("mamba_head_dim", ("head_dim", "mamba_head_dim"), default=64),
        ConfigField("mamba_state", ("state_size", "ssm_state_size"), default=128),
        ConfigField("mamba_proj_bias", ("use_bias", "mamba_proj_bias"), default=False),
        ConfigField("mamba_activation", ("hidden_act",), default="silu"),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True))

    @classmethod
    def from_hf(cls, hf: dict) -> "Mamba2Config":
        if not (hf.get("layers_block_type") or hf.get("layer_types")):
            hf = dict(hf, layers_block_type=["mamba"] * hf["num_hidden_layers"])
        return super().from_hf(hf)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        values = super().adapt(values, hf, notes)
        if set(values["block_kinds"]) != {"mamba"}:
            raise ValueError(f"a mamba2 model's layers are all Mamba-2 ones; layer_types lists "
                             f"{sorted(set(values['block_kinds']))}; fix config.json")
        cls.check_inner(values, values["mamba_expand"] * values["hidden_size"], "expand x hidden_size")
        return values


class NemotronHBlock(nn.Module):
    def __init__(self, c: NemotronHConfig, layer: int):
        kind = self.kind = c.block_kinds[layer]
        self.norm = Norm(c.hidden_size, c.norm_eps)
        if kind == "mamba":
            self.mixer = Mamba2Mixer(c)
        elif kind == "attention":
            self.mixer = PagedAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                        c.flags(), c.norm_eps)
        elif kind == "moe":
            self.mixer = SparseMoE(c.hidden_size, c.layer_moe(layer), c.flags())
        else:
            self.mixer = MLP(c.hidden_size, c.intermediate_size, c.flags())

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        h = self.norm(x)
        return x + (self.mixer(h) if self.kind in ("mlp", "moe") else self.mixer(h, kv, layer_id, positions))


class NemotronHStack(PositionalStack):
    def __init__(self, c: NemotronHConfig):
        super().__init__(c, [NemotronHBlock(c, i) for i in range(c.num_hidden_layers)])


class NemotronHForCausalLM(OwnedStackLM):
    """CausalLM's entry functions over NemotronHStack (Nemotron-H, Mamba-2 alone); its KV cache always the one kiln
    owns."""

    STACK: ClassVar[type] = NemotronHStack
    OWNED_ONLY: ClassVar[str] = "its Mamba-2 layers keep a recurrent state a sequence"


def nemotron_h_weight_map(c: NemotronHConfig) -> WeightMap:
    m: WeightMap = head_weights(c, "backbone", "embeddings", "norm_f")
    for i, kind in enumerate(c.block_kinds):
        k, h = f"model.layers.{i}", f"backbone.layers.{i}"
        m[f"{k}.norm.weight"] = [f"{h}.norm.weight"]
        if kind == "mamba":
            m.update(mamba_weights(c, f"{k}.mixer", f"{h}.mixer"))
        elif kind == "attention":
            m[f"{k}.mixer.qkv_proj.weight"] = [f"{h}.mixer.{x}_proj.weight" for x in "qkv"]
            m[f"{k}.mixer.o_proj.weight"] = [f"{h}.mixer.o_proj.weight"]
        elif kind == "moe":
            experts = [f"{h}.mixer.experts.{j}" for j in range(c.num_experts)]
            m[f"{k}.mixer.router"] = [f"{h}.mixer.gate.weight"]
            m[f"{k}.mixer.choice_bias"] = [f"{h}.mixer.gate.e_score_correction_bias"]
            m[f"{k}.mixer.experts_gate_up.weight"] = [f"{e}.up_proj.weight" for e in experts]
            m[f"{k}.mixer.experts_down.weight"] = [f"{e}.down_proj.weight" for e in experts]
            m.update(_mlp_weights(c, f"{k}.mixer.shared", f"{h}.mixer.shared_experts"))
        else:
            m.update(_mlp_weights(c, f"{k}.mixer", f"{h}.mixer"))
    return m


def _mlp_weights(c: NemotronHConfig, kiln: str, hf: str) -> WeightMap:
    """A squared-ReLU MLP's up and down projections (and biases where mlp_bias)."""
    return {f"{kiln}.{x}.{p}": [f"{hf}.{x}.{p}"] for x in ("up_proj", "down_proj")
            for p in (("weight", "bias") if c.mlp_bias else ("weight",))}

