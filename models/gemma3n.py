"""Gemma 3n (text: E2B / E4B, text-only or under Gemma3nForConditionalGeneration).

Gemma 4's E models came from it, so its attention is Gemma 4's (models/gemma4.py: q/k/v normed per head,
unscaled scores, RoPE per layer type in the graph, the last `num_kv_shared_layers` layers attending over
earlier layers' keys and values, per-layer embeddings), every layer one head size. What is its own:

- AltUp: the residual stream is `altup_num_inputs` (N) streams. The embedding is stream 0; streams 1..N-1 are
  altup_projections of it, each rescaled to stream 0's root mean square. A layer first predicts every stream
  from all of them (p_i = x_i + sum_j c_ij x_j, the N x N coefficients a linear map of tanh(router(norm(x_a)
  / hidden)), x_a the active stream), runs attention and MLP on the active prediction, then corrects every
  stream by the innovation (y - p_a) times 1 + a linear map of the router on y. The corrected active stream,
  times `correct_output_scale`, gates the layer's per-layer input, which is added to streams 1..N-1. After the
  last layer, streams 1..N-1 go through altup_unembed_projections (rescaled to stream 0 again) and the N are
  averaged.
- LAuReL: beside attention, x + norm(right(left(x))) of the normed input; the attention's residual sum and
  it are averaged over sqrt(2).
- Activation sparsity: on the layers `activation_sparsity_pattern` gives a fraction, the MLP's gate keeps only
  what is above mean + std * Phi^-1(fraction) of its row (relu(gate - cutoff)) before the GELU.
- A per-layer MLP width (`intermediate_size` a list), no layer scalar, and token ids past the per-layer
  embedding table (its audio and vision tokens) read its row 0 there, as transformers reads them.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .causal_lm import WeightMap
from .config import ConfigField
from .gemma4 import _FIELDS as _GEMMA4_FIELDS
from .gemma4 import Gemma4Attention, Gemma4Config, Gemma4ForCausalLM, Gemma4Stack
from .layers import Norm

_FIELDS = (
    *(f for f in _GEMMA4_FIELDS if f.name != "intermediate_size"),
    ConfigField("intermediate_size", ("intermediate_size",)),          # one, or a list: a width each layer
    ConfigField("altup_inputs", ("altup_num_inputs",), default=4),
    ConfigField("altup_active", ("altup_active_idx",), default=0),
    ConfigField("altup_correct_scale", ("altup_correct_scale",), default=True),
    ConfigField("laurel_rank", ("laurel_rank",), default=64),
    ConfigField("sparsity", ("activation_sparsity_pattern",), default=None),
)


@dataclass(frozen=True)
class Gemma3nConfig(Gemma4Config):
    altup_inputs: int = 4
    altup_active: int = 0
    altup_correct_scale: bool = True
    laurel_rank: int = 64
    sparsity: tuple[float, ...] = ()        # per layer: the gate's kept fraction's quantile (0: dense)
    layer_ffn: tuple[int, ...] = ()         # per layer: the MLP's width

    ARCH: ClassVar[str] = "gemma3n"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = _FIELDS
    PATTERN: ClassVar[int] = 5
    LAST_FULL: ClassVar[bool] = False

    @classmethod
    def from_hf(cls, hf: dict) -> "Gemma3nConfig":
        from .config import text_model
        text, _ = text_model(hf)
        widths = text.get("intermediate_size")
        n = text.get("num_hidden_layers")
        if isinstance(widths, list) and len(widths) != n:
            raise ValueError(f"intermediate_size lists {len(widths)} widths for {n} layers; fix config.json")
        if text.get("altup_correct_scale") is not None and not isinstance(text.get("altup_correct_scale"), bool):
            raise ValueError("altup_correct_scale must be true or false; fix config.json")
        first = widths[0] if isinstance(widths, list) else widths
        outer = hf if text is hf else {**hf, "text_config": {**text, "intermediate_size": first}}
        c = super().from_hf({**outer, "intermediate_size": first} if text is hf else outer)
        n = c.num_hidden_layers
        layer_ffn = tuple(int(w) for w in widths) if isinstance(widths, list) else (c.intermediate_size,) * n
        sparsity = c.sparsity if c.sparsity is not None else [0.95] * (10 if n > 10 else 0) + [0.0] * (n - 10 if n > 10
                                                                                                     else n)
        if len(sparsity) != n or not all(0.0 <= s < 1.0 for s in sparsity):
            raise ValueError(f"activation_sparsity_pattern must give each of the {n} layers a fraction in [0, 1); "
                             "fix config.json")
        if not 0 <= c.altup_active < c.altup_inputs or c.altup_inputs < 2:
            raise ValueError(f"altup_active_idx {c.altup_active} must name one of altup_num_inputs "
                             f"({c.altup_inputs}, at least 2) streams; fix config.json")
        return dataclasses.replace(c, layer_ffn=layer_ffn, sparsity=tuple(float(s) for s in sparsity))

    @classmethod
    def layer_kv_of(cls, hf: dict, c: Gemma4Config, types: list[str]) -> tuple[tuple[int, int], ...]:
        return ((c.num_key_value_heads, c.head_dim),) * c.num_hidden_layers      # one head size for every layer


class SparseGatedMLP(nn.Module):
    """down(gelu(sparse(gate(x))) * up(x)): sparse keeps what lies above the row's mean + std * z (z the
    normal quantile of `sparsity`), relu(gate - cutoff); dense where sparsity is 0."""

    def __init__(self, hidden: int, width: int, sparsity: float):
        self.gate_up_proj = nn.Linear(hidden, 2 * width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)
        self.z = float(np.float32(statistics.NormalDist().inv_cdf(sparsity))) if sparsity > 0 else None

    def forward(self, x: Tensor) -> Tensor:
        gate, up = op.split(self.gate_up_proj(x), 2, axis=-1)
        if self.z is not None:
            mean = _mean(gate)
            std = op.sqrt(_mean(op.square(gate - mean)))
            gate = op.relu(gate - (mean + std * self.z))
        return self.down_proj(op.gelu(gate, approximate="tanh") * up)


class AltUp(nn.Module):
    """A layer's stream predictor and corrector (kept float: small maps whose output scales every stream)."""

    def __init__(self, hidden: int, inputs: int, eps: float):
        self.inputs, self.hidden = inputs, hidden
        self.correct_output_scale = nn.Parameter((hidden,))
        self.correction_coefs = nn.Parameter((inputs, inputs))
        self.prediction_coefs = nn.Parameter((inputs * inputs, inputs))
        self.modality_router = nn.Parameter((inputs, hidden))
        self.router_norm = Norm(hidden, eps)

    def modalities(self, x: Tensor) -> Tensor:
        """tanh(router(norm(x) / hidden)): [b, s, N]."""
        return op.tanh(op.matmul(self.router_norm(x) * (1.0 / self.hidden), op.permute_dims(self.modality_router)))

    def predict(self, streams: list[Tensor], active: int) -> list[Tensor]:
        n = self.inputs
        coefs = op.matmul(self.modalities(streams[active]), op.permute_dims(self.prediction_coefs))   # [b, s, N*N]
        parts = op.split(coefs, n * n, axis=-1)                                                     # c_ij at i*N + j
        return [streams[i] + _sum(parts[i * n + j] * streams[j] for j in range(n)) for i in range(n)]

    def correct(self, predictions: list[Tensor], activated: Tensor, active: int) -> list[Tensor]:
        coefs = op.matmul(self.modalities(activated), op.permute_dims(self.correction_coefs)) + 1.0      # [b, s, N]
        innovation = activated - predictions[active]
        parts = op.split(coefs, self.inputs, axis=-1)
        return [innovation * parts[i] + predictions[i] for i in range(self.inputs)]


def _mean(x: Tensor) -> Tensor:
    """The mean over the last axis, kept: [..., 1]."""
    return op.sum(x, axis=-1, keepdims=True) * (1.0 / int(x.shape[-1]))


def _sum(terms) -> Tensor:
    terms = list(terms)
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def _to_magnitude(x: Tensor, target: Tensor) -> Tensor:
    """x rescaled to `target` root mean square ([b, s, 1]), its own floored at sqrt(1e-5)."""
    own = op.sqrt(op.maximum(_mean(op.square(x)), op.full((1,), 1e-5, x.dtype)))
    return x * target / own


class Gemma3nLayer(nn.Module):
    def __init__(self, c: Gemma3nConfig, layer: int, shared: bool):
        eps, hidden = c.norm_eps, c.hidden_size
        self.active, self.correct_scale = c.altup_active, c.altup_correct_scale
        self.altup = AltUp(hidden, c.altup_inputs, eps)
        self.input_layernorm = Norm(hidden, eps)
        self.self_attn = Gemma4Attention(c, layer, shared)
        self.post_attn_norm = Norm(hidden, eps)
        self.post_attention_layernorm = Norm(hidden, eps)          # before the MLP (kiln's name)
        self.mlp = SparseGatedMLP(hidden, c.layer_ffn[layer], c.sparsity[layer])
        self.post_mlp_norm = Norm(hidden, eps)
        self.laurel_left = nn.Linear(hidden, c.laurel_rank, bias=False)
        self.laurel_right = nn.Linear(c.laurel_rank, hidden, bias=False)
        self.post_laurel_norm = Norm(hidden, eps)
        self.per_layer_input_gate = nn.Linear(hidden, c.ple_dim, bias=False)
        self.per_layer_projection = nn.Linear(c.ple_dim, hidden, bias=False)
        self.post_per_layer_input_norm = Norm(hidden, eps)

    def forward(self, streams: list[Tensor], kv, layer_id: int, positions: Tensor, ple: Tensor) -> list[Tensor]:
        predictions = self.altup.predict(streams, self.active)
        active = predictions[self.active]
        normed = self.input_layernorm(active)
        laurel = normed + self.post_laurel_norm(self.laurel_right(self.laurel_left(normed)))
        attended = active + self.post_attn_norm(self.self_attn(normed, kv, layer_id, positions))
        x = (attended + laurel) * (2.0 ** -0.5)
        x = x + self.post_mlp_norm(self.mlp(self.post_attention_layernorm(x)))
        corrected = self.altup.correct(predictions, x, self.active)
        first = corrected[self.active]
        if self.correct_scale:
            first = first * self.altup.correct_output_scale
        gate = op.gelu(self.per_layer_input_gate(first), approximate="tanh") * ple
        added = self.post_per_layer_input_norm(self.per_layer_projection(gate))
        return [corrected[0], *(s + added for s in corrected[1:])]


class Gemma3nStack(Gemma4Stack):
    def __init__(self, c: Gemma3nConfig):
        if not c.ple_dim:
            raise ValueError("Gemma 3n without per-layer inputs (hidden_size_per_layer_input 0) is not one kiln "
                             "knows; fix config.json")
        self.hidden, self.ple_dim, self.num_layers, self.eps = c.hidden_size, c.ple_dim, c.num_hidden_layers, c.norm_eps
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        first_shared = c.num_hidden_layers - c.kv_shared_layers
        self.layers = nn.ModuleList([Gemma3nLayer(c, i, i >= first_shared) for i in range(c.num_hidden_layers)])
        self.norm = Norm(c.hidden_size, c.norm_eps)
        width = c.num_hidden_layers * c.ple_dim
        self.embed_tokens_per_layer = nn.Embedding(c.ple_vocab, width)
        self.per_layer_model_projection = nn.Linear(c.hidden_size, width, bias=False)
        self.per_layer_projection_norm = Norm(c.ple_dim, c.norm_eps)
        self.altup_projections = nn.ModuleList([nn.Linear(c.hidden_size, c.hidden_size, bias=False)
                                                for _ in range(c.altup_inputs - 1)])
        self.altup_unembed_projections = nn.ModuleList([nn.Linear(c.hidden_size, c.hidden_size, bias=False)
                                                        for _ in range(c.altup_inputs - 1)])

    def forward(self, packed: Tensor, kv) -> Tensor:
        b, s, _ = packed.shape
        positions = kv.get_query_positions(b * s)
        inputs = self._per_layer_inputs(packed)
        x = op.split(packed, [self.hidden], axis=2)[0]
        target = op.sqrt(_mean(op.square(x)))
        streams = [x, *(_to_magnitude(p(x), target) for p in self.altup_projections)]
        for i, layer in enumerate(self.layers):
            streams = layer(streams, kv, i, positions, inputs[i])
        target = op.sqrt(_mean(op.square(streams[0])))
        out = [streams[0], *(_to_magnitude(p(t), target) for p, t in zip(self.altup_unembed_projections, streams[1:]))]
        return self.norm(_sum(out) * (1.0 / len(out)))


class Gemma3nForCausalLM(Gemma4ForCausalLM):
    STACK: ClassVar[type] = Gemma3nStack


def weight_map(c: Gemma3nConfig) -> WeightMap:
    p = c.weight_prefix
    m: WeightMap = {f"model.{n}.weight": [f"{p}.{n}.weight"] for n in (
        "embed_tokens", "norm", "embed_tokens_per_layer", "per_layer_model_projection", "per_layer_projection_norm")}
    if not c.tie_word_embeddings:
        m["lm_head.weight"] = ["lm_head.weight"]
    for kind in ("altup_projections", "altup_unembed_projections"):
        for j in range(c.altup_inputs - 1):
            m[f"model.{kind}.{j}.weight"] = [f"{p}.{kind}.{j}.weight"]
    first_shared = c.num_hidden_layers - c.kv_shared_layers
    for i in range(c.num_hidden_layers):
        k, h = f"model.layers.{i}", f"{p}.layers.{i}"
        shared = i >= first_shared
        projs = ("q_proj",) if shared else ("q_proj", "k_proj", "v_proj")
        m[f"{k}.self_attn.qkv_proj.weight"] = [f"{h}.self_attn.{x}.weight" for x in projs]
        for x in ("o_proj", "q_norm", *(() if shared else ("k_norm",))):
            m[f"{k}.self_attn.{x}.weight"] = [f"{h}.self_attn.{x}.weight"]
        for ours, theirs in (("input_layernorm", "input_layernorm"), ("post_attn_norm", "post_attention_layernorm"),
                             ("post_attention_layernorm", "pre_feedforward_layernorm"),
                             ("post_mlp_norm", "post_feedforward_layernorm"),
                             ("laurel_left", "laurel.linear_left"), ("laurel_right", "laurel.linear_right"),
                             ("post_laurel_norm", "laurel.post_laurel_norm"),
                             ("per_layer_input_gate", "per_layer_input_gate"),
                             ("per_layer_projection", "per_layer_projection"),
                             ("post_per_layer_input_norm", "post_per_layer_input_norm"),
                             ("altup.router_norm", "altup.router_norm")):
            m[f"{k}.{ours}.weight"] = [f"{h}.{theirs}.weight"]
        m[f"{k}.mlp.gate_up_proj.weight"] = [f"{h}.mlp.gate_proj.weight", f"{h}.mlp.up_proj.weight"]
        m[f"{k}.mlp.down_proj.weight"] = [f"{h}.mlp.down_proj.weight"]
        m[f"{k}.altup.correct_output_scale"] = [f"{h}.altup.correct_output_scale"]
        for x in ("correction_coefs", "prediction_coefs", "modality_router"):
            m[f"{k}.altup.{x}"] = [f"{h}.altup.{x}.weight"]
    return m
