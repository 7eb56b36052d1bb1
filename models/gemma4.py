"""Gemma 4 (text; the E2B / E4B and dense checkpoints, text-only or under Gemma4ForConditionalGeneration; Gemma 4
unified's language model, gemma4_unified_text: the same layers without PLE or experts).

Gemma 3's decoder (sandwich norms, tanh-GELU gating, sliding layers among global ones, a tied head,
soft-capped final logits) with what Gemma 4 changed:
- Global (full) layers have a head size of their own (`global_head_dim`, or transformers' saved
  `per_layer_config`), and with `attention_k_eq_v` their own KV head count and no v_proj: the values are
  k_proj's output before the key's norm. Layers then differ in KV shape: the KV cache kiln owns holds each
  layer's pages at its own size (models/owned_kv.py, KVCacheLayout.layer_kv).
- q and k normed per head (RMSNorm, x * w), v normed per head without a weight, and scores unscaled
  (softmax(q.k), the norms fix their size).
- RoPE per layer type, in the graph: sliding layers the default RoPE; global ones "proportional" RoPE (the
  first partial_rotary_factor of each half of the head rotated at frequencies over the whole head size, the
  rest at frequency 0: models/rope.inv_freq on the head's pairs, zeros appended).
- Shared KV: the last `num_kv_shared_layers` layers compute no keys or values; each attends over those of
  the last earlier layer of its type (KVCacheLayout.layer_sources), and with `use_double_wide_mlp` has an
  MLP twice as wide.
- Per-layer embeddings (PLE, `hidden_size_per_layer_input` P): a second table [vocab, layers x P] read by
  token id, and a projection of the embeddings, normed, summed and scaled by 1/sqrt(2), give each layer a
  [P] input: after its MLP, x += norm(proj(gelu(gate(x)) * input)). The token's id is not an input of the
  forward functions (they take embeddings), so `embed` returns the embedding and the id's PLE row side by
  side ([hidden + layers x P]) and the stack splits them.
- Every layer's output times its `layer_scalar`.
- 26B-A4B (`enable_moe_block`): beside each layer's MLP a mixture of experts (models/moe.py) reads the
  same input normed apart; the router picks from its unweighted norm times `router.scale` / sqrt(hidden)
  (folded into the router's weight at load), softmax top-k renormalised, each chosen expert's weight times
  its `per_expert_scale`; MLP and experts are normed apart and summed before the MLP's post-norm.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .causal_lm import LayerAttention, OwnedStackLM, WeightMap, WeightSpec, attention_by_type, head_weights
from .config import ConfigField, text_model, window_of
from .gemma import _GEMMA_FIELDS, Gemma2Config
from .layers import MLP, Flags, Norm, cached_attention
from .moe import MoESpec, SparseMoE
from .rope import apply_rope, inv_freq, proportional

_FIELDS = (
    *_GEMMA_FIELDS,
    ConfigField("ple_dim", ("hidden_size_per_layer_input",), default=0),
    ConfigField("ple_vocab", ("vocab_size_per_layer_input",), default=0),
    ConfigField("kv_shared_layers", ("num_kv_shared_layers",), default=0),
    ConfigField("k_eq_v", ("attention_k_eq_v",), default=False),
    ConfigField("double_wide_mlp", ("use_double_wide_mlp",), default=False),
    ConfigField("moe", ("enable_moe_block",), default=False),
    ConfigField("num_experts", ("num_experts",), default=0),
    ConfigField("top_k", ("top_k_experts",), default=0),
    ConfigField("moe_intermediate_size", ("moe_intermediate_size",), default=0),
)


@dataclass(frozen=True)
class Gemma4Config(Gemma2Config):
    ple_dim: int = 0                        # hidden_size_per_layer_input: each layer's PLE width (0: none)
    ple_vocab: int = 0                      # vocab_size_per_layer_input: the PLE table's rows
    kv_shared_layers: int = 0               # the last this many layers share earlier layers' keys and values
    k_eq_v: bool = False                    # global layers: values from k_proj (no v_proj)
    double_wide_mlp: bool = False           # the shared layers' MLPs twice intermediate_size
    moe: bool = False                       # enable_moe_block: experts beside every layer's MLP (26B-A4B)
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    local_rope_theta: float = 10000.0
    global_rope: tuple = (1e6, 1.0, 1.0)    # full layers' (theta, partial_rotary_factor, factor): proportional RoPE
    global_kv: tuple = ()                   # per layer (kv heads, head dim): the global layers' own
    weight_prefix: str = "model"

    ARCH: ClassVar[str] = "gemma4"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = _FIELDS
    PATTERN: ClassVar[int] = 6
    LAST_FULL: ClassVar[bool] = True        # the last layer is made full attention, as transformers does

    @classmethod
    def layer_kv_of(cls, hf: dict, c: "Gemma4Config", types: list[str]) -> tuple[tuple[int, int], ...]:
        return _layer_kv(hf, c, types)

    @classmethod
    def from_hf(cls, hf: dict) -> "Gemma4Config":
        hf, prefix = text_model(hf)
        if hf.get("use_bidirectional_attention") == "all":
            raise ValueError("Gemma 4 with use_bidirectional_attention 'all' (an encoder) is not a causal LM; load "
                             "a causal checkpoint")
        params = hf.get("rope_parameters") or {}
        local = params.get("sliding_attention") or {"rope_type": "default", "rope_theta": 10000.0}
        full = params.get("full_attention") or {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                 "rope_theta": 1e6}
        if local.get("rope_type", "default") != "default":
            raise ValueError(f"rope_parameters.sliding_attention type {local['rope_type']!r} is not supported for "
                             "gemma4 (sliding layers rotate unscaled); fix config.json")
        if full.get("rope_type", "default") not in ("default", "proportional"):
            raise ValueError(f"rope_parameters.full_attention type {full['rope_type']!r} is not supported for gemma4 "
                             "yet (supported: default, proportional)")
        flat = {k: v for k, v in hf.items() if k != "rope_parameters"}
        c = super().from_hf({**flat, "rope_theta": float(full.get("rope_theta", 1e6))})
        n = c.num_hidden_layers
        types = list(c.layer_types)
        notes = list(c.notes)
        if types[-1] != "full_attention" and cls.LAST_FULL:     # transformers forces it (Gemma 4)
            types[-1] = "full_attention"
            notes.append("the last layer made full attention (transformers' Gemma 4 does the same)")
        partial = float(full.get("partial_rotary_factor", 1.0)) if full.get("rope_type") == "proportional" else 1.0
        c = dataclasses.replace(
            c, layer_types=tuple(types), local_rope_theta=float(local.get("rope_theta", 10000.0)),
            global_rope=(float(full.get("rope_theta", 1e6)), partial, float(full.get("factor", 1.0))),
            global_kv=cls.layer_kv_of(hf, c, types), weight_prefix=prefix, notes=tuple(notes))
        if not 0 <= c.kv_shared_layers < n:
            raise ValueError(f"num_kv_shared_layers {c.kv_shared_layers} must leave at least one of the {n} layers "
                             "computing keys and values; fix config.json")
        c.kv_layers()                               # a source for every shared layer's type, or a ValueError
        c.moe_spec()                                # counts that make a router, or a ValueError
        return c

    def moe_spec(self) -> MoESpec | None:
        """Every layer's experts (enable_moe_block), None without."""
        if not self.moe:
            return None
        if not (self.num_experts and self.top_k and self.moe_intermediate_size):
            raise ValueError("Gemma 4 with enable_moe_block needs num_experts, top_k_experts and "
                             "moe_intermediate_size; fix config.json")
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, normalize=True, expert_scale=True)

    def flags(self) -> Flags:
        return Flags(norm="rms", activation=self.activation, sandwich_norms=True, embed_scale=self.hidden_size ** 0.5,
                     qk_norm=True, final_logit_softcap=self.final_logit_softcapping, attn_scale=1.0)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        window = window_of(vars(self))
        return attention_by_type(self.layer_types, window, lambda t: (self.rope_theta, None))

    def kv_of(self, layer: int) -> tuple[int, int]:
        """Layer `layer`'s (kv heads, head dim)."""
        return self.global_kv[layer]

    def kv_layers(self) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
        first_shared = self.num_hidden_layers - self.kv_shared_layers
        sources = []
        for i, kind in enumerate(self.layer_types):
            if i < first_shared:
                sources.append(i)
                continue
            earlier = [j for j in range(first_shared) if self.layer_types[j] == kind]
            if not earlier:
                raise ValueError(f"layer {i} ({kind}) shares keys and values, but no earlier layer of its kind "
                                 "computes them (num_kv_shared_layers too large); fix config.json")
            sources.append(earlier[-1])
        return tuple(self.global_kv), tuple(sources)

    def rope_of(self, layer: int) -> tuple[np.ndarray, float]:
        """Layer `layer`'s inverse frequencies over its head's pairs ([head dim / 2]) and cos/sin factor."""
        d = self.kv_of(layer)[1]
        if self.layer_types[layer] == "sliding_attention":
            return inv_freq(d, self.local_rope_theta, None)
        return proportional(d, *self.global_rope)


def _layer_kv(hf: dict, c: Gemma4Config, types: list[str]) -> tuple[tuple[int, int], ...]:
    """Per layer (kv heads, head dim): transformers' saved per_layer_config where it has one, else Google's
    global_head_dim (default 512) and, with attention_k_eq_v, num_global_key_value_heads for the full layers."""
    per_layer = hf.get("per_layer_config")
    if isinstance(per_layer, dict):
        out = []
        for i in range(c.num_hidden_layers):
            over = per_layer.get(str(i), per_layer.get(i)) or {}
            unknown = set(over) - {"head_dim", "num_key_value_heads"}
            if unknown:
                raise ValueError(f"per_layer_config of layer {i} sets {sorted(unknown)}, which kiln does not read "
                                 "for gemma4 (it reads head_dim and num_key_value_heads)")
            out.append((int(over.get("num_key_value_heads", c.num_key_value_heads)),
                        int(over.get("head_dim", c.head_dim))))
        return tuple(out)
    global_dim = int(hf.get("global_head_dim") or 512)
    global_heads = hf.get("num_global_key_value_heads") if c.k_eq_v else None
    return tuple((int(global_heads or c.num_key_value_heads), global_dim) if t == "full_attention"
                 else (c.num_key_value_heads, c.head_dim) for t in types)


class Gemma4Attention(nn.Module):
    """One layer's attention: q (and, unless shared, k and v) projected in one Linear, normed per head,
    rotated, over the KV cache kiln owns."""

    kv_dtype: str | None = None

    def __init__(self, c: Gemma4Config, layer: int, shared: bool):
        (h_kv, d), h = c.kv_of(layer), c.num_attention_heads
        self.num_heads, self.num_kv_heads, self.head_dim, self.shared = h, h_kv, d, shared
        self.values_from_keys = c.k_eq_v and c.layer_types[layer] == "full_attention"
        kv_rows = 0 if shared else (1 if self.values_from_keys else 2) * h_kv
        self.qkv_proj = nn.Linear(c.hidden_size, (h + kv_rows) * d, bias=False)
        self.o_proj = nn.Linear(h * d, c.hidden_size, bias=False)
        self.q_norm = Norm(d, c.norm_eps, "rms")
        if not shared:
            self.k_norm = Norm(d, c.norm_eps, "rms")
        self.v_norm = Norm(d, c.norm_eps, "rms_noparam")
        self.rope = c.rope_of(layer)

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor) -> Tensor:
        b, s, _ = x.shape
        h, h_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = op.reshape(self.qkv_proj(x), (b, s, -1, d))
        if self.shared:
            q = apply_rope(self.q_norm(qkv), positions, *self.rope)
            out = kv.attention_shared(layer_id, q if self.kv_dtype in (None, q.dtype) else q.astype(self.kv_dtype),
                                      sm_scale=1.0)
        else:
            if self.values_from_keys:
                q, k = op.split(qkv, [h], axis=2)
                v = k
            else:
                q, k, v = op.split(qkv, [h, h + h_kv], axis=2)
            q, k = (apply_rope(t, positions, *self.rope) for t in (self.q_norm(q), self.k_norm(k)))
            out = cached_attention(kv, layer_id, op.concat([q, k, self.v_norm(v)], dim=2), h, 1.0, self.kv_dtype)
        out = out if out.dtype == x.dtype else out.astype(x.dtype)
        return self.o_proj(op.reshape(out, (b, s, h * d)))


class Gemma4Layer(nn.Module):
    def __init__(self, c: Gemma4Config, layer: int, shared: bool):
        eps, hidden, flags = c.norm_eps, c.hidden_size, c.flags()
        self.input_layernorm = Norm(hidden, eps)
        self.self_attn = Gemma4Attention(c, layer, shared)
        self.post_attn_norm = Norm(hidden, eps)
        self.post_attention_layernorm = Norm(hidden, eps)          # before the MLP (kiln's name)
        wide = 2 if shared and c.double_wide_mlp else 1
        self.mlp = MLP(hidden, wide * c.intermediate_size, flags)
        self.post_mlp_norm = Norm(hidden, eps)
        if (spec := c.moe_spec()) is not None:            # the experts, normed apart beside the MLP
            self.post_mlp_norm_1, self.pre_moe_norm, self.post_moe_norm = (Norm(hidden, eps) for _ in range(3))
            self.moe = SparseMoE(hidden, spec, flags)
            self.eps = eps
        if c.ple_dim:
            self.per_layer_input_gate = nn.Linear(hidden, c.ple_dim, bias=False)
            self.per_layer_projection = nn.Linear(c.ple_dim, hidden, bias=False)
            self.post_per_layer_input_norm = Norm(hidden, eps)
        self.layer_scalar = nn.Parameter((1,))
        self.activation = flags.activation

    def forward(self, x: Tensor, kv, layer_id: int, positions: Tensor, ple: Tensor | None) -> Tensor:
        x = x + self.post_attn_norm(self.self_attn(self.input_layernorm(x), kv, layer_id, positions))
        ffn = self.mlp(self.post_attention_layernorm(x))
        if hasattr(self, "moe"):
            route = Norm(int(x.shape[-1]), self.eps, "rms_noparam")(x)
            ffn = self.post_mlp_norm_1(ffn) + self.post_moe_norm(self.moe(self.pre_moe_norm(x), route))
        x = x + self.post_mlp_norm(ffn)
        if ple is not None:
            gate = op.gelu(self.per_layer_input_gate(x), approximate="tanh" if self.activation == "gelu_tanh"
                           else "none")
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(gate * ple))
        return x * self.layer_scalar


class Gemma4Stack(nn.Module):
    def __init__(self, c: Gemma4Config):
        self.hidden, self.ple_dim, self.num_layers = c.hidden_size, c.ple_dim, c.num_hidden_layers
        self.eps = c.norm_eps
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        first_shared = c.num_hidden_layers - c.kv_shared_layers
        self.layers = nn.ModuleList([Gemma4Layer(c, i, i >= first_shared) for i in range(c.num_hidden_layers)])
        self.norm = Norm(c.hidden_size, c.norm_eps)
        if c.ple_dim:
            width = c.num_hidden_layers * c.ple_dim
            self.embed_tokens_per_layer = nn.Embedding(c.ple_vocab, width)
            self.per_layer_model_projection = nn.Linear(c.hidden_size, width, bias=False)
            self.per_layer_projection_norm = Norm(c.ple_dim, c.norm_eps)

    def forward(self, packed: Tensor, kv) -> Tensor:
        b, s, _ = packed.shape
        positions = kv.get_query_positions(b * s)
        inputs = self._per_layer_inputs(packed)
        x = op.split(packed, [self.hidden], axis=2)[0] if inputs else packed
        for i, layer in enumerate(self.layers):
            x = layer(x, kv, i, positions, inputs[i] if inputs else None)
        return self.norm(x)

    def _per_layer_inputs(self, packed: Tensor) -> list[Tensor]:
        """Each layer's PLE input [b, s, P]: (norm(proj(x) / sqrt(hidden)) + the token's row) / sqrt(2)."""
        if not self.ple_dim:
            return []
        b, s, _ = packed.shape
        x, rows = op.split(packed, [self.hidden], axis=2)
        proj = self.per_layer_model_projection(x) * (self.hidden ** -0.5)
        proj = self.per_layer_projection_norm(op.reshape(proj, (b, s, self.num_layers, self.ple_dim)))
        both = (proj + op.reshape(rows, (b, s, self.num_layers, self.ple_dim))) * (2.0 ** -0.5)
        return [op.reshape(t, (b, s, self.ple_dim)) for t in op.split(both, self.num_layers, axis=2)]


class Gemma4ForCausalLM(OwnedStackLM):
    """CausalLM's entry functions over Gemma4Stack; its KV cache always the one kiln owns."""

    STACK: ClassVar[type] = Gemma4Stack
    OWNED_ONLY: ClassVar[str] = "Gemma 4's layers differ in KV shape and share KV"

    def __init__(self, config: Gemma4Config):
        super().__init__(config)
        self.embed_width = config.hidden_size + config.num_hidden_layers * config.ple_dim

    def embed(self, input_ids: Tensor) -> Tensor:
        """[seq] -> [seq, hidden (+ layers x P)]: the scaled embedding, then the token's PLE row, scaled."""
        m = self.model
        x = m.embed_tokens(input_ids) * self.flags.embed_scale
        if not self.config.ple_dim:
            return x
        ids, table = input_ids, self.config.ple_vocab
        if table < self.config.vocab_size:         # ids past the PLE table (Gemma 3n's audio / vision ones) read row 0,
            inside = op.less(ids, op.full(ids.shape, table, "int32"))          # as transformers' Gemma 3n reads them
            ids = op.where(inside, ids, op.zeros(ids.shape, "int32"))
        rows = m.embed_tokens_per_layer(ids)
        rows = rows * (self.config.ple_dim ** 0.5)
        return op.concat([x, rows.astype(x.dtype) if rows.dtype != x.dtype else rows], dim=-1)


def weight_map(c: Gemma4Config) -> WeightMap:
    p = c.weight_prefix
    m: WeightMap = head_weights(c, p)
    if c.ple_dim:
        for name in ("embed_tokens_per_layer", "per_layer_model_projection", "per_layer_projection_norm"):
            m[f"model.{name}.weight"] = [f"{p}.{name}.weight"]
    first_shared = c.num_hidden_layers - c.kv_shared_layers
    for i in range(c.num_hidden_layers):
        k, h = f"model.layers.{i}", f"{p}.layers.{i}"
        shared = i >= first_shared
        values_from_keys = c.k_eq_v and c.layer_types[i] == "full_attention"
        projs = ("q_proj",) if shared else ("q_proj", "k_proj") if values_from_keys else ("q_proj", "k_proj", "v_proj")
        m[f"{k}.self_attn.qkv_proj.weight"] = [f"{h}.self_attn.{x}.weight" for x in projs]
        m[f"{k}.self_attn.o_proj.weight"] = [f"{h}.self_attn.o_proj.weight"]
        m[f"{k}.self_attn.q_norm.weight"] = [f"{h}.self_attn.q_norm.weight"]
        if not shared:
            m[f"{k}.self_attn.k_norm.weight"] = [f"{h}.self_attn.k_norm.weight"]
        for ours, theirs in (("input_layernorm", "input_layernorm"), ("post_attn_norm", "post_attention_layernorm"),
                             ("post_attention_layernorm", "pre_feedforward_layernorm"),
                             ("post_mlp_norm", "post_feedforward_layernorm")):
            m[f"{k}.{ours}.weight"] = [f"{h}.{theirs}.weight"]
        m[f"{k}.mlp.gate_up_proj.weight"] = [f"{h}.mlp.gate_proj.weight", f"{h}.mlp.up_proj.weight"]
        m[f"{k}.mlp.down_proj.weight"] = [f"{h}.mlp.down_proj.weight"]
        if c.ple_dim:
            for name in ("per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm"):
                m[f"{k}.{name}.weight"] = [f"{h}.{name}.weight"]
        m[f"{k}.layer_scalar"] = [f"{h}.layer_scalar"]
        if c.moe:
            m.update(_moe_weights(c, k, h))
    return m


def _moe_weights(c: Gemma4Config, k: str, h: str) -> WeightMap:
    """A layer's experts: the router's weight with its input scale (router.scale / sqrt(hidden)) folded into
    its columns, per_expert_scale, transformers' 3-D gate_up_proj [experts, 2 x ffn, hidden] (gate rows first)
    and down_proj [experts, hidden, ffn] as kiln's expert Linears ([experts x rows, cols])."""
    root = np.float32(c.hidden_size ** -0.5)
    rows = lambda w: np.ascontiguousarray(w).reshape(-1, w.shape[-1])   # noqa: E731
    return {
        f"{k}.post_mlp_norm_1.weight": [f"{h}.post_feedforward_layernorm_1.weight"],
        f"{k}.pre_moe_norm.weight": [f"{h}.pre_feedforward_layernorm_2.weight"],
        f"{k}.post_moe_norm.weight": [f"{h}.post_feedforward_layernorm_2.weight"],
        f"{k}.moe.router": WeightSpec((f"{h}.router.proj.weight", f"{h}.router.scale"),
                                      lambda parts: (parts[0] * (parts[1] * root)[None, :]).astype(np.float32),
                                      apart=True),
        f"{k}.moe.expert_scale": [f"{h}.router.per_expert_scale"],
        f"{k}.moe.experts_gate_up.weight": WeightSpec((f"{h}.experts.gate_up_proj",), rows),
        f"{k}.moe.experts_down.weight": WeightSpec((f"{h}.experts.down_proj",), rows),
    }
