"""Zyphra's ZAYA1 (zaya: ZAYA1-8B): compressed convolutional attention and top-1 MoE layers with a router MLP.

    layer   a = attention(rmsnorm(x));  x = (a + bh) * sh + (x + br) * sr       (learned residual scales and biases)
            m = moe(rmsnorm(x));        x = (m + bh') * sh' + (x + br') * sr'
    embed   (embedding + b) * s

Attention (CCA): q = Wq x, k = Wk x (the raw projections) are mixed over time by a depthwise conv (cca_time0 taps, a
bias) and then a grouped conv (cca_time1 taps, a dense head_dim x head_dim map a head and tap, a bias) over the
(q, k) channels, plus residual paths: q_res = (q + k of its KV head) / 2, k_res = the mean of q_res over a KV head's
queries. Half the value comes from the token (v_proj_current), half from the token before it (v_proj_delayed, the
projection of zeros before the first token); the value heads are those two concatenated, then split by head_dim. q
and k are L2-normed to length sqrt(head_dim), k times a learned scale per KV head, then rotated (partial RoPE, its
theta per layer type: "hybrid" full attention, "hybrid_sliding" sliding_window), and attend with scale
head_dim^-1/2.

The convs need each token's last cca_time0 + cca_time1 - 2 raw (q, k) projections and the value its previous token's
delayed projection: kiln keeps them as a recurrent state (a slot a sequence) in a second cache layer (L + i for
layer i, as Falcon-H1 keeps its Mamba state): one recurrent conv over the raw projections repeated once a tap of the
window, each copy's taps one-hot, gives each token its window of inputs (and the delayed value its previous token's),
and the graph applies the two convs to that window.

MoE: the router reads down_proj(x) (+ the previous layer's router input times a learned scale, from the second
layer on) through an MLP (RMSNorm, two GELU layers, num_experts + 1 logits: the last a skip expert), a softmax; the
expert is the best of the probabilities plus balancing_biases, weighted by its probability (a skip: no output).
The skip's bias is -1 whatever the checkpoint holds, as transformers sets it on every load.

transformers keeps the residual stream in float32 under bf16; kiln keeps it in the compute dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .causal_lm import (DECODER_FIELDS, DecoderConfig, LayerAttention, OwnedStackLM, WeightMap, WeightSpec,
                        head_weights)
from .config import ConfigField, fields_with
from .layers import Norm, _activation, cached_attention
from .moe import MoESpec, expert_matmul, expert_rows, identities, route
from .rope import apply_rope, inv_freq

TYPES = ("hybrid", "hybrid_sliding")
# transformers' ZayaConfig's RoPE where config.json gives none
DEFAULT_ROPE = {"hybrid": {"rope_theta": 5_000_000.0, "partial_rotary_factor": 0.5},
                "hybrid_sliding": {"rope_theta": 10_000.0, "partial_rotary_factor": 0.5}}
L2_EPS = float(np.finfo(np.float32).eps)        # transformers' clamp on q's and k's lengths (float32's eps)


@dataclass(frozen=True)
class ZayaConfig(DecoderConfig):
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    local_rope_theta: float = 10_000.0
    local_rotary_factor: float = 0.5
    attention_bias: bool = False
    cca_time0: int = 2
    cca_time1: int = 2
    num_experts: int = 16
    router_hidden_size: int = 256
    hidden_act: str = "silu"

    ARCH: ClassVar[str] = "zaya"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS,
        ConfigField("intermediate_size", ("moe_intermediate_size",)),
        ConfigField("norm_eps", ("rms_norm_eps",), default=1e-5),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("layer_types", ("layer_types",), default=None),
        ConfigField("sliding_window", ("sliding_window",), default=None),
        ConfigField("local_rope_theta", ("local_rope_theta",), default=10_000.0),
        ConfigField("local_rotary_factor", ("local_rotary_factor",), default=0.5),
        ConfigField("attention_bias", ("attention_bias",), default=False),
        ConfigField("cca_time0", ("cca_time0",), default=2),
        ConfigField("cca_time1", ("cca_time1",), default=2),
        ConfigField("num_experts", ("num_experts",), default=16),
        ConfigField("router_hidden_size", ("router_hidden_size",), default=256),
        ConfigField("hidden_act", ("hidden_act",), default="silu"))

    @classmethod
    def from_hf(cls, hf: dict) -> "ZayaConfig":
        """RoPE per layer type (rope_parameters.hybrid / .hybrid_sliding, transformers' defaults where absent) read
        as the full layers' flat fields and the sliding layers' local ones."""
        params = {k: v for k, v in (hf.get("rope_parameters") or DEFAULT_ROPE).items() if k in TYPES}
        full, local = ({**DEFAULT_ROPE[t], **(params.get(t) or {})} for t in TYPES)
        if local.get("rope_type", "default") != "default":
            raise ValueError(f"zaya with rope_parameters.hybrid_sliding type {local['rope_type']!r} is not supported "
                             "(kiln rotates sliding layers unscaled); fix config.json")
        flat = {k: v for k, v in hf.items() if k != "rope_parameters"}
        return super().from_hf({**flat, "rope_parameters": dict(full),
                                "local_rope_theta": local["rope_theta"],
                                "local_rotary_factor": local["partial_rotary_factor"]})

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        types = tuple(values["layer_types"] or ("hybrid",) * n)
        if len(types) != n or set(types) - set(TYPES):
            raise ValueError(f"zaya layer_types must give each of the {n} layers one of {', '.join(TYPES)}; got "
                             f"{list(types)}; fix config.json")
        if "hybrid_sliding" in types and not values["sliding_window"]:
            raise ValueError("zaya with hybrid_sliding layers needs sliding_window; fix config.json")
        if hf.get("num_experts_per_tok", 1) != 1:
            raise ValueError(f"zaya with num_experts_per_tok {hf['num_experts_per_tok']} is not supported (ZAYA routes "
                             "a token to 1 expert, as transformers' model requires)")
        if hf.get("lm_head_bias"):
            raise ValueError("zaya with lm_head_bias true is not supported (ZAYA1's head has no bias)")
        if values["hidden_act"] not in ("silu", "gelu", "relu"):
            raise ValueError(f"zaya with hidden_act {values['hidden_act']!r} is not supported (silu, gelu or relu)")
        if min(values["cca_time0"], values["cca_time1"]) < 1:
            raise ValueError(f"zaya's cca_time0 and cca_time1 must be at least 1; got {values['cca_time0']} and "
                             f"{values['cca_time1']}; fix config.json")
        rotary = values["head_dim"] * values["local_rotary_factor"]
        if not 0 < rotary <= values["head_dim"] or int(rotary) % 2:
            raise ValueError(f"rope_parameters.hybrid_sliding's partial_rotary_factor {values['local_rotary_factor']} "
                             f"gives {rotary} rotary dims of head_dim {values['head_dim']}; fix config.json")
        if (values["num_key_value_heads"] * values["head_dim"]) % 2:
            raise ValueError("zaya's value heads are halves of num_key_value_heads x head_dim, which must be even")
        MoESpec(values["num_experts"] + 1, 1, values["intermediate_size"], False)
        return dict(values, layer_types=types)

    @property
    def window_taps(self) -> int:
        """The raw (q, k) projections a token's convs read: itself and the cca_time0 + cca_time1 - 2 before it."""
        return self.cca_time0 + self.cca_time1 - 1

    @property
    def qk_channels(self) -> int:
        return (self.num_attention_heads + self.num_key_value_heads) * self.head_dim

    @property
    def half_value(self) -> int:
        return self.num_key_value_heads * self.head_dim // 2

    def state_taps(self) -> int:
        """The state conv's taps: the window, and at least the token before (the delayed value's)."""
        return max(self.window_taps, 2)

    def state_channels(self) -> int:
        return self.window_taps * self.qk_channels + self.half_value

    # The KV cache's layers: each layer's attention (0..L-1), then each layer's window of inputs (L..2L-1).
    def layer_attention(self) -> tuple[LayerAttention, ...]:
        attention = tuple(
            LayerAttention("sliding", self.sliding_window, self.local_rope_theta, None,
                           rotary_dim=int(self.head_dim * self.local_rotary_factor)) if t == "hybrid_sliding"
            else LayerAttention("full", None, self.rope_theta, self.rope_scaling, rotary_dim=self.rotary_dim)
            for t in self.layer_types)
        return attention + (LayerAttention("full", None, self.rope_theta, None, rope=False),) * self.num_hidden_layers

    def state_layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        return ((),) * self.num_hidden_layers + (((self.state_channels(), self.state_taps() - 1),),) * \
            self.num_hidden_layers


def window_weights(c: ZayaConfig) -> np.ndarray:
    """The state conv's one-hot taps [channels, taps]: copy m of the raw (q, k) projections gives the input m + 1 -
    window_taps tokens back (m = 0: the oldest), the delayed values the token before."""
    taps, window = c.state_taps(), c.window_taps
    w = np.zeros((c.state_channels(), taps), np.float32)
    for m in range(window):
        w[m * c.qk_channels:(m + 1) * c.qk_channels, taps - window + m] = 1.0
    w[window * c.qk_channels:, taps - 2] = 1.0
    return w


class CCAttention(nn.Module):
    """ZAYA's attention (the module docstring)."""

    kv_dtype: str | None = None             # the KV cache's dtype where not the activations' (CausalLM.set_kv_dtype)

    def __init__(self, c: ZayaConfig, layer: int):
        self.c, self.state_layer = c, c.num_hidden_layers + layer
        h, h_kv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        a = c.layer_attention()[layer]
        self.rope = inv_freq(a.rotary_dim, a.rope_theta, a.rope_scaling)
        # q, k, the current value half, the delayed one (its bias apart: it is added after the delay)
        self.qkv_proj = nn.Linear(c.hidden_size, c.qk_channels + 2 * c.half_value, bias=c.attention_bias)
        if c.attention_bias:
            self.delayed_bias = nn.Parameter((c.half_value,))
        self.conv_depthwise = nn.Parameter((c.cca_time0, c.qk_channels))           # [tap, channel]
        self.conv_depthwise_bias = nn.Parameter((c.qk_channels,))
        self.conv_grouped = nn.Parameter((h + h_kv, c.cca_time1 * d, d))           # [head, tap * in, out]
        self.conv_grouped_bias = nn.Parameter((c.qk_channels,))
        self.key_scale = nn.Parameter((h_kv,))
        self.o_proj = nn.Linear(h * d, c.hidden_size, bias=c.attention_bias)

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        c = self.c
        b, s, _ = x.shape
        h, h_kv, d, qk, half = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.qk_channels, c.half_value
        n, groups = b * s, h // h_kv
        raw, current, delayed = op.split(op.reshape(self.qkv_proj(x), (n, qk + 2 * half)), [qk, qk + half], axis=1)
        window = op.concat([raw] * c.window_taps + [delayed], dim=1)
        seen = op.reshape(kv.recurrent_conv(self.state_layer, op.reshape(window, (b, s, c.state_channels())),
                                            Tensor.from_const(window_weights(c))), (n, c.state_channels()))
        *inputs, delayed = op.split(seen, [qk * (m + 1) for m in range(c.window_taps)], axis=1)
        if c.attention_bias:
            delayed = delayed + self.delayed_bias
        depth = op.split(self.conv_depthwise, c.cca_time0, axis=0) if c.cca_time0 > 1 else [self.conv_depthwise]
        mixed = []                          # the depthwise conv's outputs the grouped one reads, oldest first
        for j in range(c.cca_time1):
            total = inputs[j] * depth[0]
            for i in range(1, c.cca_time0):
                total = total + inputs[j + i] * depth[i]
            mixed.append(op.reshape(total + self.conv_depthwise_bias, (n, h + h_kv, 1, d)))
        taps = op.concat(mixed, dim=2) if len(mixed) > 1 else mixed[0]
        heads = op.permute_dims(op.reshape(taps, (n, h + h_kv, c.cca_time1 * d)), [1, 0, 2])
        conv = op.reshape(op.permute_dims(op.matmul(heads, self.conv_grouped), [1, 0, 2]), (n, qk))
        conv = conv + self.conv_grouped_bias
        q_raw, k_raw = op.split(raw, [h * d], axis=1)
        k_heads = op.broadcast_to(op.reshape(k_raw, (n, h_kv, 1, d)), (n, h_kv, groups, d))
        q_res = (op.reshape(q_raw, (n, h_kv, groups, d)) + k_heads) * 0.5
        k_res = op.sum(q_res, axis=2) * (1.0 / groups)
        q_conv, k_conv = op.split(conv, [h * d], axis=1)
        q = op.reshape(q_conv, (n, h, d)) + op.reshape(q_res, (n, h, d))
        k = op.reshape(k_conv, (n, h_kv, d)) + k_res
        q, k = _to_length(q, d), _to_length(k, d) * op.reshape(self.key_scale, (1, h_kv, 1))
        v = op.reshape(op.concat([current, delayed], dim=1), (b, s, h_kv, d))
        q, k = (apply_rope(op.reshape(t, (b, s, t.shape[1], d)), positions, *self.rope) for t in (q, k))
        out = cached_attention(kv, layer_id, op.concat([q, k, v], dim=2), h, d ** -0.5, self.kv_dtype)
        return self.o_proj(op.reshape(out, (b, s, h * d)))


def _to_length(t: Tensor, d: int) -> Tensor:
    """Each head of t [n, heads, d] scaled to length sqrt(d) (its length clamped below at L2_EPS)."""
    length = op.sqrt(op.sum(t * t, axis=-1, keepdims=True))
    return t / op.maximum(length, op.full((1,), L2_EPS, t.dtype)) * float(np.sqrt(d))


class ZayaMoE(nn.Module):
    """The router MLP over the router input (and the previous layer's), and top-1 experts (a skip among them)."""

    def __init__(self, c: ZayaConfig, layer: int):
        self.c, r, e = c, c.router_hidden_size, c.num_experts
        self.spec = MoESpec(e + 1, 1, c.intermediate_size, False, choice_bias=True)
        # the router kept float32 (not nn.Linear: the quantizer leaves it whole)
        self.down, self.down_bias = nn.Parameter((r, c.hidden_size), "float32"), nn.Parameter((r,), "float32")
        if layer:
            self.states_scale = nn.Parameter((r,), "float32")
        self.router_norm = nn.Parameter((r,), "float32")
        self.fc1, self.fc1_bias = nn.Parameter((r, r), "float32"), nn.Parameter((r,), "float32")
        self.fc2, self.fc2_bias = nn.Parameter((r, r), "float32"), nn.Parameter((r,), "float32")
        self.out = nn.Parameter((e + 1, r), "float32")
        self.balancing = nn.Parameter((e + 1,), "float32")
        self.experts_gate_up = nn.Linear(c.hidden_size, e * 2 * c.intermediate_size, bias=False)
        self.experts_down = nn.Linear(c.intermediate_size, e * c.hidden_size, bias=False)

    def to(self, dtype: str | None = None) -> None:
        super().to(dtype)
        for name in ("down", "down_bias", "states_scale", "router_norm", "fc1", "fc1_bias", "fc2", "fc2_bias", "out",
                     "balancing"):
            if hasattr(self, name):
                getattr(self, name).to("float32")

    def forward(self, x: Tensor, before: Tensor | None) -> tuple[Tensor, Tensor]:
        """x [b, s, hidden] and the previous layer's router input [T, r] (None on the first) -> (the output, this
        layer's router input)."""
        c = self.c
        b, s, hidden = x.shape
        flat = op.reshape(x, (b * s, hidden))
        wide = flat if flat.dtype == "float32" else flat.astype("float32")
        routed = op.matmul(wide, op.permute_dims(self.down)) + self.down_bias
        if before is not None:
            routed = routed + before * self.states_scale
        y = op.rms_norm(routed, self.router_norm, axes=[-1], epsilon=c.norm_eps)
        y = op.gelu(op.matmul(y, op.permute_dims(self.fc1)) + self.fc1_bias)
        y = op.gelu(op.matmul(y, op.permute_dims(self.fc2)) + self.fc2_bias)
        weights, experts = route(self.spec, op.matmul(y, op.permute_dims(self.out)), self.balancing)   # [T, 1]
        weights, experts, _ = identities(weights, experts, c.num_experts)      # the skip: no output
        gate, up = op.split(expert_matmul(flat, self.experts_gate_up, experts, 2 * c.intermediate_size), 2, axis=-1)
        out = expert_matmul(_activation(gate, c.hidden_act) * up, self.experts_down, experts, hidden)    # [T, 1, h]
        w = weights if weights.dtype == out.dtype else weights.astype(out.dtype)
        return op.reshape(op.sum(out * op.reshape(w, (b * s, 1, 1)), axis=1), (b, s, hidden)), routed


class ResidualScales(nn.Module):
    """ZAYA's residual: (branch + bh) * sh + (residual + br) * sr, as branch * sh + residual * sr + (bh sh + br sr)
    (the constant computed at load)."""

    def __init__(self, hidden: int):
        self.branch, self.residual, self.constant = (nn.Parameter((hidden,)) for _ in range(3))

    def forward(self, branch: Tensor, residual: Tensor) -> Tensor:
        return (branch * self.branch + self.constant) + residual * self.residual


class ZayaLayer(nn.Module):
    def __init__(self, c: ZayaConfig, layer: int):
        self.input_layernorm = Norm(c.hidden_size, c.norm_eps)
        self.self_attn = CCAttention(c, layer)
        self.post_attention_layernorm = Norm(c.hidden_size, c.norm_eps)
        self.mlp = ZayaMoE(c, layer)
        self.attn_residual, self.mlp_residual = ResidualScales(c.hidden_size), ResidualScales(c.hidden_size)

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor, before: Tensor | None):
        x = self.attn_residual(self.self_attn(self.input_layernorm(x), kv, layer_id, positions), x)
        y, routed = self.mlp(self.post_attention_layernorm(x), before)
        return self.mlp_residual(y, x), routed


class ZayaStack(nn.Module):
    def __init__(self, c: ZayaConfig):
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.input_scale, self.input_shift = nn.Parameter((c.hidden_size,)), nn.Parameter((c.hidden_size,))
        self.layers = nn.ModuleList([ZayaLayer(c, i) for i in range(c.num_hidden_layers)])
        self.norm = Norm(c.hidden_size, c.norm_eps)

    def forward(self, x: Tensor, kv) -> Tensor:
        b, s, _ = x.shape
        positions = kv.get_query_positions(b * s)
        x, routed = x * self.input_scale + self.input_shift, None      # (e + b) * s as e * s + b * s
        for i, layer in enumerate(self.layers):
            x, routed = layer(x, kv, i, positions, routed)
        return self.norm(x)


class ZayaForCausalLM(OwnedStackLM):
    """CausalLM's entry functions over ZayaStack; its KV cache always the one kiln owns."""

    STACK: ClassVar[type] = ZayaStack
    OWNED_ONLY: ClassVar[str] = "ZAYA's attention layers keep a window of their last inputs beside their keys and " \
        "values"


def _product_sum(parts: list[np.ndarray]) -> np.ndarray:
    """a1 b1 + a2 b2 + ... of the tensors (a1, b1, a2, b2, ...): a residual's or the input's constant term."""
    return sum(np.asarray(a, np.float32) * np.asarray(b, np.float32) for a, b in zip(parts[::2], parts[1::2]))


def _fused_bias(c: ZayaConfig):
    """q, k, current and delayed value biases as the fused projection's, the delayed one zero (added after the
    delay)."""
    def apply(b: np.ndarray) -> np.ndarray:
        b = np.array(b)
        b[c.qk_channels + c.half_value:] = 0
        return b
    return apply


def _skip_at_minus_one(b: np.ndarray) -> np.ndarray:
    """balancing_biases with the skip expert's at -1, whatever the file holds (transformers sets it so on every
    load)."""
    b = np.array(b, np.float32)
    b[-1] = -1.0
    return b


def _grouped(c: ZayaConfig):
    """conv_qk_grouped.weight [heads * out, in, taps] as [heads, tap * in, out]."""
    g, d, t = c.num_attention_heads + c.num_key_value_heads, c.head_dim, c.cca_time1
    return lambda w: np.ascontiguousarray(w.reshape(g, d, d, t).transpose(0, 3, 2, 1).reshape(g, t * d, d))


def weight_map(c: ZayaConfig) -> WeightMap:
    m = head_weights(c)
    m["model.input_scale"] = ["model.input_hidden_states_scale"]
    m["model.input_shift"] = WeightSpec(("model.input_hidden_states_bias", "model.input_hidden_states_scale"),
                                        _product_sum, apart=True)
    for i in range(c.num_hidden_layers):
        k = f"model.layers.{i}"
        a, p, g = f"{k}.self_attn", f"{k}.self_attn.qkv_proj", f"{k}.mlp.gate"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            m[f"{k}.{norm}.weight"] = [f"{k}.{norm}.weight"]
        for mine, theirs in (("attn_residual", "post_attention_residual_scale"),
                             ("mlp_residual", "post_mlp_residual_scale")):
            m[f"{k}.{mine}.branch"] = [f"{k}.{theirs}.hidden_states_scale"]
            m[f"{k}.{mine}.residual"] = [f"{k}.{theirs}.residual_scale"]
            m[f"{k}.{mine}.constant"] = WeightSpec(tuple(f"{k}.{theirs}.{n}" for n in (
                "hidden_states_bias", "hidden_states_scale", "residual_bias", "residual_scale")), _product_sum,
                apart=True)
        projections = tuple(f"{p}.{n}_proj{x}" for n, x in (("q", ""), ("k", ""), ("v", "_current"),
                                                             ("v", "_delayed")))
        m[f"{a}.qkv_proj.weight"] = [f"{n}.weight" for n in projections]
        if c.attention_bias:
            m[f"{a}.qkv_proj.bias"] = WeightSpec(tuple(f"{n}.bias" for n in projections), _fused_bias(c))
            m[f"{a}.delayed_bias"] = [f"{p}.v_proj_delayed.bias"]
            m[f"{a}.o_proj.bias"] = [f"{a}.o_proj.bias"]
        m[f"{a}.o_proj.weight"] = [f"{a}.o_proj.weight"]
        m[f"{a}.conv_depthwise"] = WeightSpec((f"{p}.conv_qk_depthwise.weight",),
                                              lambda w: np.ascontiguousarray(w[:, 0, :].T))
        m[f"{a}.conv_depthwise_bias"] = [f"{p}.conv_qk_depthwise.bias"]
        m[f"{a}.conv_grouped"] = WeightSpec((f"{p}.conv_qk_grouped.weight",), _grouped(c))
        m[f"{a}.conv_grouped_bias"] = [f"{p}.conv_qk_grouped.bias"]
        m[f"{a}.key_scale"] = [f"{a}.qk_norm.temp"]
        moe = f"{k}.mlp"
        m[f"{moe}.down"], m[f"{moe}.down_bias"] = [f"{g}.down_proj.weight"], [f"{g}.down_proj.bias"]
        if i:
            m[f"{moe}.states_scale"] = [f"{g}.router_states_scale"]
        m[f"{moe}.router_norm"] = [f"{g}.router_mlp.norm.weight"]
        for fc in ("fc1", "fc2"):
            m[f"{moe}.{fc}"], m[f"{moe}.{fc}_bias"] = [f"{g}.router_mlp.{fc}.weight"], [f"{g}.router_mlp.{fc}.bias"]
        m[f"{moe}.out"] = [f"{g}.router_mlp.out_proj.weight"]
        m[f"{moe}.balancing"] = WeightSpec((f"{g}.balancing_biases",), _skip_at_minus_one)
        m[f"{moe}.experts_gate_up.weight"] = WeightSpec((f"{moe}.experts.gate_up_proj",), expert_rows)
        m[f"{moe}.experts_down.weight"] = WeightSpec((f"{moe}.experts.down_proj",), expert_rows)
    return m
