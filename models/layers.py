"""Shared building blocks for decoder-only transformers, in tvm.relax.frontend.nn.

Every family in models/ is assembled from these, switched by `Flags` (what differs between
Llama, Qwen, Gemma, Phi or GPT-2 is a handful of them). Attention runs through TVM's paged KV
cache (`PagedKVCache.attention_with_fused_qkv`), which applies RoPE to q/k inside the cache
(RopeMode.NORMAL, HF rotate-half convention), so the layers hold no position state; or through the
KV cache kiln owns (models/owned_kv.py), which answers the same call and also takes attention sinks.

Weights keep Hugging Face's layout (Linear weight [out, in]); q/k/v and gate/up projections
are stored fused, and each family's weight map says how the HF tensors concatenate into them.
With the default flags the graph is exactly Llama's (op.rms_norm, fused qkv, op.silu on the
split gate/up): the compiler's fusion passes match those ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvm import te, tirx, topi
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache

from .rope import apply_rope, position_temperature


def scalar(value: float) -> Tensor:
    """A float32 constant of the graph."""
    return nn.Tensor.from_const(np.array(value, np.float32))

# x/rms*w, x/rms*(1+w) (Gemma), LayerNorm with a bias, without one (Cohere), with a bias and 1+w (Nemotron),
# LayerNorm and RMSNorm without any parameter (OLMo 1, nanochat)
NORMS = ("rms", "rms_1p", "layer", "layer_nobias", "layer_1p", "layer_noparam", "rms_noparam",
         "rms_scaled")                  # x * w, then RMS-normed without a weight (Muse Spark's input-scaled norm,
                                        # its 1 + w stored)
BIASED_NORMS = ("layer", "layer_1p")
PARAMLESS_NORMS = ("layer_noparam", "rms_noparam")           # neither weight nor bias (OLMo 1, nanochat)
ACTIVATIONS = ("silu", "gelu_tanh", "gelu", "relu2", "relu", "xielu")  # relu2: relu(x)^2 (Nemotron, Arcee); xielu:
                                                                       # XIELU's (Apertus), with its own parameters


@dataclass(frozen=True)
class Flags:
    """How a family's decoder differs from Llama's; every default is Llama's choice."""

    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False                   # per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3)
    qk_norm_heads: bool = True              # False: qk_norm over all heads' dims at once (OLMo 2)
    qk_norm_head_weights: bool = False      # per head, each head with its own weight (Command-R+)
    qk_norm_kind: str | None = None         # the q/k norms' kind where it is not `norm`'s (Llama 4: rms_noparam)
    qk_norm_after_rope: bool = False        # qk_norm on the rotated q and k (Hunyuan; RoPE then in the graph)
    norm: str = "rms"                       # one of NORMS, for every norm of the model
    activation: str = "silu"                # one of ACTIVATIONS
    gated_mlp: bool = True                  # down(act(gate(x)) * up(x)); False: down(act(up(x))) (GPT-2)
    sandwich_norms: bool = False            # norms after attention and MLP too (Gemma 2/3)
    mlp_out_norm: bool = False              # a norm on the MLP's output alone, before its residual (A.X K1's
                                            # experts' post_mlp_layernorm; kiln's post_mlp_norm)
    pre_norms: bool = True                  # False: no norm before attention and MLP, only after (OLMo 2;
                                            # sandwich_norms must be on)
    input_norm: bool = True                 # False: no norm before attention alone (ModernBERT decoder's first
                                            # layer, whose input the embeddings' norm already normed)
    residual_scale: float | None = None     # attention and MLP outputs multiplied by this before the residual
                                            # add (Granite's residual_multiplier)
    parallel_residual: bool = False         # x + attn(n1(x)) + mlp(n2(x)) instead of one after the other
                                            # (GPT-NeoX, Phi-2)
    shared_norm: bool = False               # with parallel_residual: n2 is n1 (Phi-2: one norm a layer)
    head_bias: bool = False                 # the untied LM head has a bias (Phi-2)
    embed_scale: float | None = None        # embeddings multiplied by this (Gemma: sqrt(hidden))
    final_logit_softcap: float | None = None  # logits = tanh(logits / c) * c (Gemma 2)
    attn_logit_softcap: float | None = None   # scores = tanh(s / c) * c, in the target's attention kernels
                                              # (the compiler passes it on; targets without it refuse)
    query_pre_attn_scalar: float | None = None  # sm_scale = scalar ** -0.5 instead of head_dim ** -0.5
    attn_scale: float | None = None         # sm_scale itself (Granite's attention_multiplier)
    logit_divisor: float | None = None      # logits / this (Granite's logits_scaling)
    learned_positions: bool = False         # an absolute position table added to the embeddings, no RoPE (GPT-2)
    clip_qkv: float | None = None           # q, k and v clamped to [-c, c] after their projection (OLMo)
    embed_norm: bool = False                # the embeddings normed (the model's norm kind) before the first layer
    embed_norm_kind: str | None = None      # embed_norm's kind where it is not `norm`'s (Muse Glimmer: rms_noparam)
    final_norm_kind: str | None = None      # the final norm's kind where it is not `norm`'s (Muse Glimmer: rms)
    post_norm_eps: float | None = None      # sandwich_norms' post norms' epsilon where their own (Muse Glimmer)
    post_attn_norm_kind: str | None = None  # sandwich_norms' post norms' kinds where not `norm`'s (Muse Spark's:
    post_mlp_norm_kind: str | None = None   # rms_noparam after the attention, rms_scaled after the MLP)
    attn_out_norm: bool = False             # each head's attention output RMS-normed without a weight, before the
                                            # output gate and o_proj (Muse Spark's o_norm)
    attn_temperature: tuple | None = None   # (beta, original[, offset[, form]]): q *= 1 + beta * log(1 + floor((pos
                                            # + offset) / original)) after RoPE (Ministral 3; RoPE in the graph),
                                            # or form "power": (1 + (pos + offset) / original) ** beta (Beam)
    rope_in_graph: bool = False             # RoPE applied in the graph whatever the layers' (the cache's heads wider
                                            # than q's and k's: DiffLlama's)
    attn_output_gate: bool = False          # q_proj also writes a gate per head (a head's rows: its q, then its
                                            # gate); the attention output times sigmoid(gate) before o_proj
                                            # (MiniCPM5-MoE)
    attn_gate_bias: bool = False            # with attn_output_gate: a bias a head added to its gate (Beam)
    attn_head_gate: bool = False            # one gate a head, its rows after v's in qkv_proj (Laguna-XS.2's g_proj):
                                            # each head's output times act(gate)
    attn_gate_act: str = "sigmoid"          # the output gate's activation, or "softplus" (Laguna's, in float32)
    residual_mix: tuple[float, float, float, float] | None = None   # x = branch * a + x * r for the attention
                                            # then the MLP: (a, r, a, r) (Beam's depth-scaled residual adds)
    v_head_dim: int | None = None           # values narrower than keys (MiMo-V2-Flash): padded with zeros to head_dim
                                            # into attention, the output's padding dropped before o_proj
    residual_gates: bool = False            # x = branch * g + x * r, g and r a value a hidden dim, for the attention
                                            # (attn_gates [2, hidden]: g, r) and the MLP (mlp_gates) (Ergo's)
    attn_sinks: bool = False                # a learned logit per head in every softmax, taking a share of the
                                            # weight and giving no value (gpt-oss, Flint): `sinks` [heads] float32,
                                            # over the KV cache kiln owns (models/owned_kv.py)
    act_quant: bool = False                 # each decoder Linear's input rounded to 8 bits a token (BitNet:
                                            # x -> round(x * s) / s, s = 127 / max|x|; act_quant below)
    sub_norms: bool = False                 # a norm on the attention output before o_proj (attn_sub_norm) and on
                                            # the MLP's hidden before down_proj (ffn_sub_norm) (BitNet)
    alibi: bool = False                     # no RoPE: ALiBi's bias slope_h * (j - p) on each score (BLOOM, MPT;
                                            # the config's alibi_slopes), over the KV cache kiln owns
    clamped_glu: tuple[float, float] | None = None   # (alpha, limit): the MLPs' SwiGLU gpt-oss's clamped form
                                            # (moe.MoESpec.clamped_glu; MiniMax-M3's dense and shared MLPs)

    def sm_scale(self, head_dim: int) -> float:
        """The attention's softmax scale: attn_scale, else 1 / sqrt(query_pre_attn_scalar or head_dim)."""
        return float(self.attn_scale) if self.attn_scale else float(self.query_pre_attn_scalar or head_dim) ** -0.5

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(f"norm {self.norm!r} is not one of {', '.join(NORMS)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not one of {', '.join(ACTIVATIONS)}")
        if not (self.pre_norms or self.sandwich_norms):
            raise ValueError("a decoder without pre-norms needs sandwich_norms (its norms come after)")
        if self.parallel_residual and not self.pre_norms or self.shared_norm and not self.parallel_residual:
            raise ValueError("parallel_residual needs pre_norms, and shared_norm needs parallel_residual")
        if self.v_head_dim and self.attn_output_gate:
            raise ValueError("v_head_dim with attn_output_gate is not supported (a gate a value dim)")
        if self.attn_gate_bias and not self.attn_output_gate:
            raise ValueError("attn_gate_bias needs attn_output_gate (a gate to add the bias to)")
        if self.attn_head_gate and (self.attn_output_gate or self.v_head_dim):
            raise ValueError("attn_head_gate is a gate a head in place of attn_output_gate's, over values of head_dim")
        if self.attn_gate_act not in ("sigmoid", "softplus"):
            raise ValueError(f"attention gate activation {self.attn_gate_act!r} is not sigmoid or softplus")


class Norm(nn.Module):
    """The normalisation `kind` names (see NORMS), over the last axis; with `rows`, a weight (and bias) per
    row of the axis before it ([rows, hidden]: Command-R+'s q/k norms, one per head)."""

    def __init__(self, hidden_size: int, eps: float, kind: str = "rms", rows: int | None = None):
        self.kind, self.eps = kind, eps
        shape = (rows, hidden_size) if rows else (hidden_size,)
        if kind not in PARAMLESS_NORMS:
            self.weight = nn.Parameter(shape)
        if kind in BIASED_NORMS:
            self.bias = nn.Parameter(shape)

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "layer_noparam":
            return op.layer_norm(x, x.shape[-1], None, None, eps=self.eps)
        if self.kind == "rms_noparam":
            return op.rms_norm(x, op.ones((x.shape[-1],), x.dtype), axes=[-1], epsilon=self.eps)
        if self.kind == "rms_scaled":
            return Norm(int(x.shape[-1]), self.eps, "rms_noparam")(x * self.weight)
        weight = self.weight + 1.0 if self.kind.endswith("_1p") else self.weight
        if len(weight.shape) == 2:             # per row: normed without parameters, then each row's weight
            bare = "layer_noparam" if self.kind.startswith("layer") else "rms_noparam"
            y = Norm(int(x.shape[-1]), self.eps, bare)(x) * weight
            return y + self.bias if hasattr(self, "bias") else y
        if self.kind.startswith("layer"):
            return op.layer_norm(x, x.shape[-1], weight, getattr(self, "bias", None), eps=self.eps)
        return op.rms_norm(x, weight, axes=[-1], epsilon=self.eps)


def _activation(x: Tensor, kind: str) -> Tensor:
    if kind == "silu":
        return op.silu(x)
    if kind == "relu2":
        return op.square(op.relu(x))
    if kind == "relu":
        return op.relu(x)
    return op.gelu(x, approximate="tanh" if kind == "gelu_tanh" else "none")


class XIELU(nn.Module):
    """xIELU (Apertus): each layer's learned alpha_p, alpha_n (through softplus) and its beta and eps:
    x > 0: ap * x^2 + beta * x; else (expm1(min(x, eps)) - x) * an + beta * x, with ap = softplus(alpha_p),
    an = beta + softplus(alpha_n)."""

    def __init__(self):
        self.alpha_p, self.alpha_n = nn.Parameter((1,)), nn.Parameter((1,))
        self.beta, self.eps = nn.Parameter((1,)), nn.Parameter((1,))

    def forward(self, x: Tensor) -> Tensor:
        ap, an = op.softplus(self.alpha_p), self.beta + op.softplus(self.alpha_n)
        linear = self.beta * x
        negative = (op.exp(op.minimum(x, self.eps)) - 1.0 - x) * an + linear
        return op.where(x > 0.0, ap * x * x + linear, negative)


def act_quant(x: Tensor) -> Tensor:
    """BitNet's activation quantization (transformers' ActQuant / BitLinear), in float32 whatever x's dtype: each
    token's values on a symmetric 8-bit grid of its absolute maximum, s = 127 / max(max|x|, 1e-5), x ->
    clip(round(x * s), -128, 127) / s. Rounds half to even as torch does, written out so every target rounds
    alike (C's roundf, CUDA's, rounds halves away from zero)."""
    def quantize(t):
        f32 = t if t.dtype == "float32" else topi.cast(t, "float32")
        peak = topi.maximum(topi.max(topi.abs(f32), axis=-1, keepdims=True), tirx.const(1e-5, "float32"))
        scale = topi.divide(tirx.const(127.0, "float32"), peak)

        def at(*i):
            v = f32(*i) * scale(*i[:-1], 0)
            low = te.floor(v)
            frac = v - low
            odd = low - 2.0 * te.floor(low * 0.5)                  # 1 where floor(v) is odd
            r = tirx.Select(frac > 0.5, low + 1.0, tirx.Select(frac < 0.5, low, low + odd))
            return te.max(te.min(r, tirx.const(127.0, "float32")), tirx.const(-128.0, "float32")) / scale(*i[:-1], 0)
        out = te.compute(f32.shape, at, name="act_quant")
        return out if t.dtype == "float32" else topi.cast(out, t.dtype)
    return op.tensor_expr_op(quantize, "act_quant", [x])


def _quantized(x: Tensor, on: bool) -> Tensor:
    return act_quant(x) if on else x


class MLP(nn.Module):
    """Gated: down(act(gate(x)) * up(x)), gate and up fused into one Linear; else down(act(up(x))). BitNet's
    (Flags.act_quant, sub_norms): each Linear's input quantized, the hidden normed (ffn_sub_norm) before down."""

    def __init__(self, hidden_size: int, intermediate_size: int, flags: Flags = Flags(), eps: float = 1e-6,
                 limit: float = 0.0):
        self.gated, self.activation = flags.gated_mlp, flags.activation
        self.quant, self.limit = flags.act_quant, limit     # limit: glu_limited's clamp (0: none)
        self.clamped = flags.clamped_glu
        if flags.sub_norms:
            self.ffn_sub_norm = Norm(intermediate_size, eps, flags.norm)
        if self.gated:
            self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=flags.mlp_bias)
        else:
            self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=flags.mlp_bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=flags.mlp_bias)
        if self.activation == "xielu":
            self.act_fn = XIELU()

    def forward(self, x: Tensor) -> Tensor:
        act = self.act_fn if hasattr(self, "act_fn") else (lambda t: _activation(t, self.activation))
        x = _quantized(x, self.quant)
        if not self.gated:
            hidden = act(self.up_proj(x))
        else:
            gate, up = op.split(self.gate_up_proj(x), 2, axis=-1)    # [b, s, inter] each
            hidden = clamped_glu(gate, up, *self.clamped) if self.clamped else \
                glu_limited(act(gate), up, self.limit) if self.limit else act(gate) * up
        return self.down_proj(_quantized(_norm(self, "ffn_sub_norm", hidden), self.quant))


def clamped_glu(gate: Tensor, up: Tensor, alpha: float, limit: float) -> Tensor:
    """gpt-oss's SwiGLU: (clip(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)."""
    gate = op.minimum(gate, _const(limit, gate))
    return (_clip(up, limit) + 1.0) * (gate * op.sigmoid(gate * alpha))


def glu_limited(activated: Tensor, up: Tensor, limit: float) -> Tensor:
    """A SwiGLU clamped after its activation (Step 3.7's and Ling 3's swiglu limits): min(act(gate), limit) *
    clip(up, -limit, limit)."""
    return op.minimum(activated, _const(limit, activated)) * _clip(up, limit)


def _clip(x: Tensor, limit: float) -> Tensor:
    return op.maximum(op.minimum(x, _const(limit, x)), _const(-limit, x))


def _const(value: float, like: Tensor) -> Tensor:
    return op.full((1,), value, like.dtype)


class PagedAttention(nn.Module):
    """Multi-head attention with grouped KV heads over TVM's paged KV cache. With a KV cache of
    another dtype than the activations (`kv_dtype`, CausalLM.set_kv_dtype) q, k and v go into the
    cache's call in its dtype (TVM's cache takes one dtype) and its output comes back cast."""

    kv_dtype: str | None = None             # the KV cache's dtype where it is not the activations'

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 flags: Flags = Flags(), eps: float = 1e-6, rope: tuple | None = None):
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of "
                             f"num_key_value_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope = rope                    # (inverse frequencies, cos/sin factor) when RoPE is in the graph
        self.sm_scale = flags.sm_scale(head_dim)
        self.output_gate, self.head_gate = flags.attn_output_gate, flags.attn_head_gate
        self.gate_act = flags.attn_gate_act
        q_rows = (2 if self.output_gate else 1) * num_heads
        self.v_head_dim = v_dim = flags.v_head_dim or head_dim
        self.qkv_proj = nn.Linear(hidden_size, (q_rows + num_kv_heads) * head_dim + num_kv_heads * v_dim
                                  + (num_heads if self.head_gate else 0), bias=flags.qkv_bias)
        self.o_proj = nn.Linear(num_heads * v_dim, hidden_size, bias=flags.o_bias)
        self.qk_norm_heads, self.norm_after_rope = flags.qk_norm_heads, flags.qk_norm_after_rope
        self.clip_qkv, self.temperature = flags.clip_qkv, flags.attn_temperature
        self.quant = flags.act_quant
        if flags.attn_out_norm:
            self.out_norm = Norm(v_dim, eps, "rms_noparam")
        if flags.sub_norms:
            self.attn_sub_norm = Norm(num_heads * head_dim, eps, flags.norm)     # BitNet: before o_proj's input
        if flags.attn_gate_bias:
            self.gate_bias = nn.Parameter((num_heads,))
        if flags.attn_sinks:
            self.sinks = nn.Parameter((num_heads,), "float32")              # kept float32, as transformers does
        if flags.qk_norm:
            by_head = flags.qk_norm_head_weights
            kind = flags.qk_norm_kind or flags.norm
            self.q_norm = Norm(head_dim if flags.qk_norm_heads else num_heads * head_dim, eps, kind,
                               num_heads if by_head else None)
            self.k_norm = Norm(head_dim if flags.qk_norm_heads else num_kv_heads * head_dim, eps, kind,
                               num_kv_heads if by_head else None)

    def forward(self, x: Tensor, kv_cache: PagedKVCache, layer_id: int, positions: Tensor | None = None) -> Tensor:
        b, s, _ = x.shape
        h, h_kv = self.num_heads, self.num_kv_heads
        gate = None
        x = _quantized(x, self.quant)
        if self.output_gate:                # each head's q then its gate, then k and v: split off the gates
            qkv = op.reshape(self.qkv_proj(x), (b, s, 2 * h + 2 * h_kv, self.head_dim))
            q_gate, kv = op.split(qkv, [2 * h], axis=2)
            q, gate = op.split(op.reshape(q_gate, (b, s, h, 2 * self.head_dim)), 2, axis=3)
            qkv = op.concat([q, kv], dim=2)
        elif self.head_gate:                # q, k and v, then a gate a head
            qkv, gate = op.split(self.qkv_proj(x), [(h + 2 * h_kv) * self.head_dim], axis=2)
            qkv, gate = op.reshape(qkv, (b, s, h + 2 * h_kv, self.head_dim)), op.reshape(gate, (b, s, h, 1))
        elif self.v_head_dim < self.head_dim:   # values padded with zeros to the keys' dims
            d, vd = self.head_dim, self.v_head_dim
            qk, v = op.split(self.qkv_proj(x), [(h + h_kv) * d], axis=2)
            v = op.concat([op.reshape(v, (b, s, h_kv, vd)), op.zeros((b, s, h_kv, d - vd), v.dtype)], dim=3)
            qkv = op.concat([op.reshape(qk, (b, s, h + h_kv, d)), v], dim=2)
        else:
            qkv = op.reshape(self.qkv_proj(x), (b, s, h + 2 * h_kv, self.head_dim))   # [b, s, h + 2 h_kv, d]
        if self.clip_qkv:
            qkv = op.tensor_expr_op(lambda t: topi.clip(t, -self.clip_qkv, self.clip_qkv), "clip_qkv", [qkv])
        if hasattr(self, "q_norm") or self.rope or self.temperature:
            q, k, v = op.split(qkv, [h, h + h_kv], axis=2)
            if not self.norm_after_rope:
                q, k = self._qk_norm(q, k)
            if self.rope:
                q, k = (apply_rope(t, positions, *self.rope) for t in (q, k))
            if self.temperature:
                q = position_temperature(q, positions, *self.temperature)
            if self.norm_after_rope:
                q, k = self._qk_norm(q, k)
            qkv = op.concat([q, k, v], dim=2)
        out = cached_attention(kv_cache, layer_id, qkv, h, self.sm_scale, self.kv_dtype,
                               getattr(self, "sinks", None))                              # [b, s, h, d]
        if self.v_head_dim < self.head_dim:
            out = op.split(out, [self.v_head_dim], axis=3)[0]
        out = _norm(self, "out_norm", out)
        if gate is not None:
            if hasattr(self, "gate_bias"):
                gate = gate + op.reshape(self.gate_bias, (1, 1, h, 1))
            out = out * _gate(gate, self.gate_act)
        out = _norm(self, "attn_sub_norm", op.reshape(out, (b, s, h * self.v_head_dim)))
        return self.o_proj(_quantized(out, self.quant))


    def to(self, dtype: str | None = None) -> None:
        super().to(dtype)
        if hasattr(self, "sinks"):
            self.sinks.to("float32")

    def _qk_norm(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q and k through their norms, per head or over every head's dims at once; as they are without."""
        if not hasattr(self, "q_norm"):
            return q, k
        if self.qk_norm_heads:
            return self.q_norm(q), self.k_norm(k)
        b, s, h, d = q.shape
        h_kv = k.shape[2]
        return (op.reshape(self.q_norm(op.reshape(q, (b, s, h * d))), (b, s, h, d)),
                op.reshape(self.k_norm(op.reshape(k, (b, s, h_kv * d))), (b, s, h_kv, d)))


def _gate(gate: Tensor, act: str) -> Tensor:
    """The attention output's gate: sigmoid(gate), or softplus(gate) computed in float32 (transformers' Laguna)."""
    if act == "sigmoid":
        return op.sigmoid(gate)
    soft = op.softplus(gate if gate.dtype == "float32" else gate.astype("float32"))
    return soft if soft.dtype == gate.dtype else soft.astype(gate.dtype)


def cached_attention(kv_cache: PagedKVCache, layer_id: int, qkv: Tensor, heads: int, sm_scale: float,
                     kv_dtype: str | None, sinks: Tensor | None = None) -> Tensor:
    """Attention of the fused q/k/v [b, s, heads + 2 kv heads, d] over the layer's paged cache, which appends
    k and v: in the cache's dtype where it has its own (kv_dtype), the output back in qkv's. `sinks`: a
    sink logit per head (the cache kiln owns only: models/owned_kv.py)."""
    dtype = qkv.dtype
    extra = {} if sinks is None else {"sinks": sinks}
    out = kv_cache.attention_with_fused_qkv(layer_id, qkv if kv_dtype in (None, dtype) else qkv.astype(kv_dtype),
                                            heads, sm_scale=sm_scale, **extra)
    return out if out.dtype == dtype else out.astype(dtype)


class DecoderLayer(nn.Module):
    """Pre-norm residual block; with sandwich norms the attention and MLP outputs are normed too (without
    pre-norms, only they are)."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, eps: float, flags: Flags = Flags(), rope: tuple | None = None,
                 mlp: nn.Module | None = None, attention: nn.Module | None = None):
        if flags.pre_norms and flags.input_norm:
            self.input_layernorm = Norm(hidden_size, eps, flags.norm)
        self.self_attn = attention if attention is not None else \
            PagedAttention(hidden_size, num_heads, num_kv_heads, head_dim, flags, eps, rope)   # (MLA's, given)
        if flags.pre_norms and not flags.shared_norm:
            self.post_attention_layernorm = Norm(hidden_size, eps, flags.norm)   # before the MLP
        self.mlp = mlp if mlp is not None else MLP(hidden_size, intermediate_size, flags, eps)   # (a MoE's, given)
        post_eps = flags.post_norm_eps or eps
        if flags.sandwich_norms:                                                 # on the attention output
            self.post_attn_norm = Norm(hidden_size, post_eps, flags.post_attn_norm_kind or flags.norm)
        if flags.sandwich_norms or flags.mlp_out_norm:                           # on the MLP output
            self.post_mlp_norm = Norm(hidden_size, post_eps, flags.post_mlp_norm_kind or flags.norm)
        self.residual_scale, self.parallel = flags.residual_scale, flags.parallel_residual
        self.residual_mix = flags.residual_mix
        if flags.residual_gates:
            self.attn_gates, self.mlp_gates = nn.Parameter((2, hidden_size)), nn.Parameter((2, hidden_size))

    def forward(self, x: Tensor, kv_cache: PagedKVCache, layer_id: int, positions: Tensor | None = None) -> Tensor:
        normed = _norm(self, "input_layernorm", x)
        attn = self.self_attn(normed, kv_cache, layer_id, positions)
        if self.parallel:                          # both read x; one norm where the family shares it
            mlp = self.mlp(self.post_attention_layernorm(x) if hasattr(self, "post_attention_layernorm") else normed)
            return attn + mlp + x
        x = self._add(x, _norm(self, "post_attn_norm", attn), 0)
        mlp = self.mlp(_norm(self, "post_attention_layernorm", x))
        return self._add(x, _norm(self, "post_mlp_norm", mlp), 1)

    def _add(self, x: Tensor, branch: Tensor, which: int) -> Tensor:
        """The residual add after the attention (`which` 0) or the MLP (1)."""
        if self.residual_mix:
            a, r = self.residual_mix[2 * which:2 * which + 2]
            return branch * a + x * r
        if hasattr(self, "attn_gates"):
            g, r = op.split(self.mlp_gates if which else self.attn_gates, 2, axis=0)        # [1, hidden] each
            return branch * g + x * r
        return x + (branch * self.residual_scale if self.residual_scale else branch)


def _norm(layer: nn.Module, name: str, x: Tensor) -> Tensor:
    """x through the layer's norm `name`, or x where the layer has none by that name."""
    return getattr(layer, name)(x) if hasattr(layer, name) else x


def tied_logits(x: Tensor, embed: nn.Embedding) -> Tensor:
    """Tied output projection: logits = x @ E.T with the embedding table E [vocab, hidden]
    (a quantized table may dequantize to float32 under float16 compute: then summed in float32)."""
    table = embed.weight
    return op.matmul(x, op.permute_dims(table), out_dtype="float32" if table.dtype != x.dtype else None)
