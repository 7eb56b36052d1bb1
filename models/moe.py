"""Sparse mixture-of-experts MLPs (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, Granite MoE, GLM-4.5, dots.llm1,
ERNIE 4.5 MoE, Hunyuan MoE, ...): a router picks `top_k` of `num_experts` gated MLPs per token and sums their
outputs weighted by the router's scores.

    probs   = softmax(x @ router.T)             float32, over every expert (sigmoid instead: DeepSeek-V3's
                                                router, GLM-4.5's, dots.llm1's)
    choice  = probs + bias                      where the family adds a per-expert bias to choose experts
                                                (e_score_correction_bias); in `groups` groups of experts, only
                                                the `top_groups` whose two best choice scores sum highest
    w, e    = top_k(choice) -> probs[e]         the k best experts, weighted by their unbiased scores;
                                                w / sum(w) where the family normalises (Mixtral,
                                                norm_topk_prob), times `routed_scale`; Phi-3.5-MoE's
                                                sparsemixer picks and weighs its two otherwise (_sparsemixer)
    y       = sum_j w_j * down[e_j](act(gate[e_j] x) * up[e_j] x)      (act(up[e_j] x) where the experts
                                                have no gate: Nemotron-H's squared ReLU)
            (+ sigmoid(shared_gate . x) * shared_mlp(x): Qwen2-MoE's shared expert;
             + shared_mlp(x): Granite MoE Shared's, GLM-4.5's, ungated)

The router (and the choice bias) stay float32 under any compute dtype, as transformers keeps them: the
scores choose discrete experts, and a float16 rounding could choose another one.

Each token's k experts are computed by gathered matmuls (TE reductions reading the expert's rows
through the router's indices): a token reads only its k experts' weights, and no expert weight
is copied. All experts' gate/up (and down) rows are one Linear of experts x rows, so --quant
stores them as any weight (planes of [experts * rows, cols]) and the matmul dequantizes the rows
it reads; the router and the shared expert's gate stay float, as llama.cpp keeps its ffn_gate_inp.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .config import ConfigField
from .layers import MLP, Flags, Norm, _activation, clamped_glu, glu_limited

# The expert count and experts a token takes, as every MoE family's config.json names them.
EXPERT_FIELDS = (ConfigField("num_experts", ("num_experts", "num_local_experts")),
                 ConfigField("top_k", ("num_experts_per_tok",)))


@dataclass(frozen=True)
class MoESpec:
    """One MoE layer's shape and routing."""

    num_experts: int
    top_k: int
    intermediate_size: int                  # each expert's
    normalize: bool                         # top-k weights divided by their sum
    shared_intermediate_size: int = 0       # a shared expert behind a sigmoid gate (Qwen2-MoE); 0: none
    shared_gated: bool = True               # False: the shared expert's output is added as it is (Granite)
    scoring: str = "softmax"                # or "sigmoid" (DeepSeek-V3's router: GLM-4.5, dots.llm1), or
                                            # "sparsemixer" (Phi-3.5-MoE)
    choice_bias: bool = False               # a per-expert bias added to the scores to choose experts only
    choice_from: str = "scores"             # or "logits": the bias added to the router's logits instead of its
                                            # sigmoid scores to choose (Kolibri 1)
    groups: int = 1                         # experts in this many groups (n_group), of which only the
    top_groups: int = 1                     # `top_groups` (topk_group) best are chosen from, a group
    group_score: str = "top2"               # scoring the sum of its two best choices, or its best ("max":
                                            # DeepSeek-V2's group_limited_greedy)
    routed_scale: float = 1.0               # the chosen experts' weights times this (routed_scaling_factor)
    norm_min: float = 0.0                   # normalise by max(sum(w), norm_min) (ERNIE 4.5's moe_norm_min)
    norm_eps: float = 0.0                   # normalise by sum(w) + norm_eps (LFM2-MoE's 1e-6)
    jitter_eps: float = 0.0                 # scoring "sparsemixer" (Phi-3.5-MoE): router_jitter_noise
    scale_input: bool = False               # each expert reads x times its weight and the outputs add unweighted
                                            # (Llama 4)
    router_bias: bool = False               # a per-expert bias added to the router's logits (gpt-oss)
    router_softcap: float = 0.0             # > 0: the router's logits capped, c * tanh(logits / c) (Laguna's
                                            # moe_router_logit_softcapping)
    expert_bias: bool = False               # each expert's gate/up and down projections have biases (gpt-oss)
    clamped_glu: tuple[float, float] | None = None   # (alpha, limit): gpt-oss's expert activation, (clip(up,
                                            # -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)
    glu_limit: float = 0.0                  # experts' SwiGLU clamped after the activation (layers.glu_limited;
    shared_glu_limit: float = 0.0           # Ling 3's): the routed experts' limit, the shared expert's (0: none)
    expert_scale: bool = False              # each chosen expert's weight times a learned scale of its own, after
                                            # the normalisation (Gemma 4's per_expert_scale)
    gated: bool = True                      # False: experts down(act(up x)), no gate rows (Nemotron-H)
    expert_norm_eps: float = 0.0            # > 0: each chosen expert's output RMS-normed (this epsilon) with a
                                            # weight of its own, then weighted (Ergo's post_expert_norm)
    expert_norm_shared: bool = False        # with expert_norm_eps: one weight w [width] for every expert, the output
                                            # times w then normed (Muse Spark's input-scaled post_expert_norm: its
                                            # 1 + w stored)
    shared_norm_eps: float = 0.0            # > 0: the shared expert's output RMS-normed with its weight (Ergo)
    zero_experts: int = 0                   # the last this-many of num_experts are identities: a token that picks
                                            # one adds x times its weight (LongCat-Flash's zero-computation experts)

    def __post_init__(self) -> None:
        if not 0 <= self.zero_experts < self.num_experts:
            raise ValueError(f"zero_expert_num ({self.zero_experts}) must leave routed experts of the "
                             f"{self.num_experts}; fix config.json")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok ({self.top_k}) must be from 1 to the number of experts "
                             f"({self.num_experts}); fix config.json")
        if self.group_score not in ("top2", "max"):
            raise ValueError(f"expert group score {self.group_score!r} is not supported (top2 or max)")
        if self.choice_from not in ("scores", "logits"):
            raise ValueError(f"expert choice from {self.choice_from!r} is not supported (scores or logits)")
        if self.scoring not in ("softmax", "sigmoid", "sparsemixer"):
            raise ValueError(f"router scoring {self.scoring!r} is not supported (softmax, sigmoid or sparsemixer)")
        if self.scoring == "sparsemixer" and self.top_k != 2:
            raise ValueError(f"sparsemixer routing takes 2 experts a token, not {self.top_k}; fix config.json")
        if self.groups < 1 or self.num_experts % self.groups or not 1 <= self.top_groups <= self.groups:
            raise ValueError(f"n_group ({self.groups}) must divide the {self.num_experts} experts and topk_group "
                             f"({self.top_groups}) be from 1 to n_group; fix config.json")
        if self.top_k > self.top_groups * (self.num_experts // self.groups):
            raise ValueError(f"num_experts_per_tok ({self.top_k}) exceeds the experts of topk_group "
                             f"({self.top_groups}) groups of {self.num_experts // self.groups}; fix config.json")


class SparseMoE(nn.Module):
    def __init__(self, hidden_size: int, spec: MoESpec, flags: Flags, router_size: int | None = None):
        """`router_size`: the width of what the router reads where it is not the experts' (forward's `route`)."""
        self.spec, self.activation = spec, flags.activation
        e, i = spec.num_experts, spec.intermediate_size
        self.router = nn.Parameter((e, router_size or hidden_size), "float32")     # kept float: not an nn.Linear
        if spec.choice_bias:
            self.choice_bias = nn.Parameter((e,), "float32")
        if spec.router_bias:
            self.router_bias = nn.Parameter((e,), "float32")
        if spec.expert_scale:
            self.expert_scale = nn.Parameter((e,), "float32")
        e -= spec.zero_experts              # the experts with weights (the router's last columns: identities)
        rows = (2 if spec.gated else 1) * i
        if spec.expert_bias:                # every expert's biases, in its rows' order (gate's, then up's)
            self.experts_gate_up_bias = nn.Parameter((e, rows))
            self.experts_down_bias = nn.Parameter((e, hidden_size))
        # Every expert's rows in one Linear (expert 0's gate and up rows, then expert 1's, ...; up rows only where
        # the experts have no gate), never called as a Linear: the quantizer stores it as any other (planes of
        # [experts * rows, cols]) and the expert matmul reads the rows of the experts each token picked.
        self.experts_gate_up = nn.Linear(hidden_size, e * rows, bias=False)
        self.experts_down = nn.Linear(i, e * hidden_size, bias=False)
        if spec.shared_intermediate_size:
            self.shared = MLP(hidden_size, spec.shared_intermediate_size, flags, limit=spec.shared_glu_limit)
            if spec.shared_gated:
                self.shared_gate = nn.Parameter((1, hidden_size))
            if spec.shared_norm_eps:
                self.shared_norm = Norm(hidden_size, spec.shared_norm_eps)
        if spec.expert_norm_eps:
            self.expert_norm = nn.Parameter((hidden_size,) if spec.expert_norm_shared else (e, hidden_size), "float32")

    def to(self, dtype: str | None = None) -> None:
        super().to(dtype)
        self.router.to("float32")
        for name in ("choice_bias", "router_bias", "expert_scale", "expert_norm"):
            if hasattr(self, name):
                getattr(self, name).to("float32")

    def forward(self, x: Tensor, route: Tensor | None = None) -> Tensor:
        """x [b, s, h] through the experts the router picks from `route` (x itself unless given: Gemma 4
        routes from the unweighted norm of what its experts read normed with a weight)."""
        b, s, h = x.shape
        spec, k, i = self.spec, self.spec.top_k, self.spec.intermediate_size
        flat = op.reshape(x, (b * s, h))                                # [T, h]
        by = flat if route is None else op.reshape(route, (b * s, route.shape[-1]))
        logits = op.matmul(by if by.dtype == "float32" else by.astype("float32"), op.permute_dims(self.router))
        if spec.router_bias:
            logits = logits + self.router_bias
        if spec.router_softcap:
            logits = op.tanh(logits / spec.router_softcap) * spec.router_softcap
        if spec.scoring == "sparsemixer":
            weights, experts = _sparsemixer(logits, spec.jitter_eps)
        else:
            weights, experts = self._route(logits)
        if spec.expert_scale:
            weights = weights * op.take(self.expert_scale, experts, axis=0)
        if spec.zero_experts:
            weights, experts, identity = identities(weights, experts, spec.num_experts - spec.zero_experts)
        weights = weights if weights.dtype == flat.dtype else weights.astype(flat.dtype)
        slots = op.reshape(weights, (b * s, k, 1))
        x_in = op.reshape(flat, (b * s, 1, h)) * slots if spec.scale_input else flat               # [T, (k,) h]
        gate_up = expert_matmul(x_in, self.experts_gate_up, experts, (2 if spec.gated else 1) * i)   # [T, k, 2i]
        if spec.expert_bias:
            gate_up = gate_up + op.take(self.experts_gate_up_bias, experts, axis=0)
        out = expert_matmul(self._activated(gate_up), self.experts_down, experts, h)            # [T, k, h]
        if spec.expert_bias:
            out = out + op.take(self.experts_down_bias, experts, axis=0)
        if spec.expert_norm_eps and spec.expert_norm_shared:        # in float32: scaled by w, then normed
            wide = out if out.dtype == "float32" else out.astype("float32")
            out = Norm(h, spec.expert_norm_eps, "rms_noparam")(wide * self.expert_norm).astype(out.dtype)
        elif spec.expert_norm_eps:          # in float32, each route by its expert's weight
            wide = out if out.dtype == "float32" else out.astype("float32")
            bare = Norm(h, spec.expert_norm_eps, "rms_noparam")(wide)
            out = (bare * op.take(self.expert_norm, experts, axis=0)).astype(out.dtype)
        y = op.sum(out if spec.scale_input else out * slots, axis=1)                              # [T, h]
        if spec.zero_experts:
            y = y + flat * (identity if identity.dtype == flat.dtype else identity.astype(flat.dtype))
        if hasattr(self, "shared_gate"):
            gate_logit = op.matmul(flat, op.permute_dims(self.shared_gate))                  # [T, 1]
            y = y + op.sigmoid(gate_logit) * self.shared(flat)
        elif hasattr(self, "shared"):
            y = y + (self.shared_norm(self.shared(flat)) if hasattr(self, "shared_norm") else self.shared(flat))
        return op.reshape(y, (b, s, h))

    def _activated(self, gate_up: Tensor) -> Tensor:
        """The chosen experts' hidden values [T, k, i] from their gate and up rows (or up rows only)."""
        spec = self.spec
        if not spec.gated:
            return _activation(gate_up, self.activation)
        gate, up = op.split(gate_up, 2, axis=-1)                                                  # [T, k, i]
        if spec.clamped_glu:
            return clamped_glu(gate, up, *spec.clamped_glu)
        if spec.glu_limit:
            return glu_limited(_activation(gate, self.activation), up, spec.glu_limit)
        return _activation(gate, self.activation) * up

    def _route(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        return route(self.spec, logits, getattr(self, "choice_bias", None))


def route(spec: MoESpec, logits: Tensor, choice_bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(weights [T, k] float32, experts [T, k] int32) from a router's logits (the module docstring; `choice_bias`
    where spec.choice_bias)."""
    probs = op.softmax(logits, axis=-1) if spec.scoring == "softmax" else op.sigmoid(logits)
    base = logits if spec.choice_from == "logits" else probs
    choice = base + choice_bias if spec.choice_bias else base
    if spec.top_groups < spec.groups:
        choice = _best_groups(choice, spec.groups, spec.top_groups, spec.group_score == "top2")
    weights, experts = _top_k(probs, spec.top_k, choice)
    if spec.normalize:
        total = op.sum(weights, axis=-1, keepdims=True)
        if spec.norm_eps:
            total = total + spec.norm_eps
        weights = weights / (op.maximum(total, op.full((1,), spec.norm_min, "float32")) if spec.norm_min else total)
    return weights * spec.routed_scale if spec.routed_scale != 1.0 else weights, experts


def identities(weights: Tensor, experts: Tensor, real: int) -> tuple[Tensor, Tensor, Tensor]:
    """The chosen experts past the `real` ones are no experts of the matmul (LongCat-Flash's identities, ZAYA's skip):
    taken out of it (weight 0 on expert 0), and their weights summed a token ([T, 1], what x is multiplied by where
    they are identities)."""
    identity = op.greater_equal(experts, op.full((1,), real, "int32"))
    zero = op.zeros((1,), "float32")
    taken = op.sum(op.where(identity, weights, zero), axis=-1, keepdims=True)
    return op.where(identity, zero, weights), op.where(identity, op.zeros((1,), "int32"), experts), taken


def _top_k(probs: Tensor, k: int, choice: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(probs [T, E] at the k largest of each row of `choice` (probs itself by default), float32; their
    columns, int32), largest first, the lower column first among equal values (torch.topk's order).
    By rank: a column's rank is the count of columns ahead of it, and slot j takes the column ranked j
    (E x E compares a token; relax's topk has no lowering in TVM 0.27)."""
    def ranks(p: te.Tensor):
        tokens, experts = p.shape
        other = te.reduce_axis((0, experts), name="other")
        ahead = lambda t, e: tirx.Select(tirx.any(p[t, other] > p[t, e], tirx.all(p[t, other] == p[t, e], other < e)),  # noqa: E731
                                         1, 0)
        return te.compute((tokens, experts), lambda t, e: te.sum(ahead(t, e), axis=other), name="expert_rank")

    def pick(p: te.Tensor, rank: te.Tensor, columns: bool):
        tokens, experts = p.shape
        e = te.reduce_axis((0, experts), name="e")
        value = (lambda t, j: tirx.Select(rank[t, e] == j, e.var.astype("int32"), 0)) if columns else \
            (lambda t, j: tirx.Select(rank[t, e] == j, p[t, e], tirx.const(0.0, "float32")))
        return te.compute((tokens, k), lambda t, j: te.sum(value(t, j), axis=e), name="top_k")

    rank = op.tensor_expr_op(ranks, "expert_rank", [probs if choice is None else choice])
    weights = op.tensor_expr_op(lambda p, r: pick(p, r, False), "top_k_weights", [probs, rank])
    experts = op.tensor_expr_op(lambda p, r: pick(p, r, True), "top_k_experts", [probs, rank])
    return weights, experts


def _sparsemixer(logits: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Phi-3.5-MoE's router at inference (transformers' sparsemixer, not training): the best expert, then the
    best of the others; each weighs the softmax of the logits within 2 * eps of its own, relatively
    ((m - s) / max(|s|, m) <= 2 eps, m its logit), at itself; the second's softmax leaves the first out.
    (weights [T, 2] float32, experts [T, 2] int32, the lower index first among equal logits)."""
    def pick(s: te.Tensor):
        tokens, experts = s.shape
        lowest, none = tirx.min_value("float32"), tirx.const(int(experts), "int32")
        e1, e2, e3, e4 = (te.reduce_axis((0, experts), name=n) for n in ("e1", "e2", "e3", "e4"))
        m1 = te.compute((tokens,), lambda t: te.max(s[t, e1], axis=e1), name="mixer_best")
        i1 = te.compute((tokens,), lambda t: te.min(tirx.Select(s[t, e2] == m1[t], e2.var.astype("int32"), none),
                                                      axis=e2), name="mixer_best_at")
        m2 = te.compute((tokens,), lambda t: te.max(tirx.Select(e3.var.astype("int32") == i1[t], lowest, s[t, e3]),
                                                      axis=e3), name="mixer_second")
        i2 = te.compute((tokens,), lambda t: te.min(tirx.Select(tirx.all(
            s[t, e4] == m2[t], e4.var.astype("int32") != i1[t]), e4.var.astype("int32"), none), axis=e4),
            name="mixer_second_at")
        return te.compute((tokens, 2), lambda t, j: tirx.Select(j == 0, i1[t], i2[t]), name="mixer_experts")

    def weigh(s: te.Tensor, chosen: te.Tensor):
        tokens, experts = s.shape
        e = te.reduce_axis((0, experts), name="e")

        def term(t, j):
            m = s[t, chosen[t, j]]
            near = (m - s[t, e]) / tirx.max(tirx.abs(s[t, e]), m) <= np.float32(2 * eps)
            kept = tirx.all(near, tirx.any(j == 0, e.var.astype("int32") != chosen[t, 0]))
            return tirx.Select(kept, tirx.exp(s[t, e] - m), tirx.const(0.0, "float32"))
        total = te.compute((tokens, 2), lambda t, j: te.sum(term(t, j), axis=e), name="mixer_total")
        return te.compute((tokens, 2), lambda t, j: tirx.const(1.0, "float32") / total[t, j], name="mixer_weights")

    experts = op.tensor_expr_op(pick, "sparsemixer_experts", [logits])
    return op.tensor_expr_op(weigh, "sparsemixer_weights", [logits, experts]), experts


def _best_groups(choice: Tensor, groups: int, top_groups: int, two: bool) -> Tensor:
    """`choice` [T, E] with every expert outside its token's `top_groups` best groups set to -inf: the
    experts are `groups` runs of E / groups, a group scores the sum of its two best choices (`two`, in
    groups of two or more) or its best, and the best groups are those with fewer than `top_groups` groups
    ahead (a higher score, or an equal one and a lower index)."""
    def mask(c: te.Tensor):
        tokens, experts = c.shape
        size = experts // groups
        lowest = tirx.min_value("float32")
        m, m2, m3 = (te.reduce_axis((0, size), name=n) for n in ("m", "m2", "m3"))
        top1 = te.compute((tokens, groups), lambda t, g: te.max(c[t, g * size + m], axis=m), name="group_top1")
        # the second best: the best of the others once the first best (its lowest index) is set aside
        # (int32 indices: WebGPU has no 64-bit integers)
        top1_at = te.compute((tokens, groups), lambda t, g: te.min(tirx.Select(
            c[t, g * size + m2] == top1[t, g], m2.var.astype("int32"), tirx.const(int(size), "int32")), axis=m2),
            name="group_top1_at")
        top2 = te.compute((tokens, groups), lambda t, g: te.max(tirx.Select(
            m3.var.astype("int32") == top1_at[t, g], lowest, c[t, g * size + m3]), axis=m3), name="group_top2")
        both = two and int(size) >= 2
        score = te.compute((tokens, groups), lambda t, g: top1[t, g] + top2[t, g] if both else top1[t, g],
                           name="group_score")
        o = te.reduce_axis((0, groups), name="o")
        ahead = te.compute((tokens, groups), lambda t, g: te.sum(tirx.Select(tirx.any(
            score[t, o] > score[t, g], tirx.all(score[t, o] == score[t, g], o < g)), 1, 0), axis=o), name="group_rank")
        return te.compute((tokens, experts), lambda t, e: tirx.Select(ahead[t, e // size] < top_groups, c[t, e],
                                                                      lowest), name="group_choice")

    return op.tensor_expr_op(mask, "best_groups", [choice])


def expert_matmul(x: Tensor, linear: nn.Module, experts: Tensor, rows: int) -> Tensor:
    """expert_matmul_te over nn Tensors: `linear` holds every expert's `rows` rows, float (an nn.Linear)
    or quantized (compiler/quant_modules.QuantizedLinear: its `element` reads its planes)."""
    element = getattr(linear, "element", None)
    planes = linear.planes() if element is not None else [linear.weight]
    weight = element if element is not None else (lambda planes, n, r: planes[0][n, r])
    return op.tensor_expr_op(lambda x, experts, *planes: expert_matmul_te(
        x, lambda n, r: weight(planes, n, r), experts, rows), "expert_matmul", [x, experts, *planes])


def expert_matmul_te(x: te.Tensor, weight, experts: te.Tensor, rows: int) -> te.Tensor:
    """out[t, j, c] = sum_r x[t(, j), r] * W[experts[t, j] * rows + c, r]: each token's row times its
    j-th expert's weight rows (x [T, depth] shared by the token's experts, or [T, k, depth] one row per
    expert; `weight(n, r)`: W[n, r], every expert's `rows` rows one after another), summed in float32,
    returned in x's dtype."""
    tokens, k = experts.shape
    depth = x.shape[-1]
    r = te.reduce_axis((0, depth), name="r")

    def row(t, j):
        return (lambda c: x[t, c]) if len(x.shape) == 2 else (lambda c: x[t, j, c])

    def product(t, j, c):
        n = experts[t, j].astype("int64") * tirx.const(rows, "int64") + c
        return row(t, j)(r).astype("float32") * weight(n, r).astype("float32")
    total = te.compute((tokens, k, tirx.const(rows, "int64")), lambda t, j, c: te.sum(product(t, j, c), axis=r),
                       name="expert_matmul")
    if x.dtype == "float32":
        return total
    return te.compute(total.shape, lambda t, j, c: total[t, j, c].astype(x.dtype), name="expert_matmul_cast")


def expert_columns(stacked):
    """A 3-D [experts, in, out] tensor (x @ W[e]: Aria's, Ergo's experts) as the 2-D [experts * out, in] rows kiln's
    expert Linear holds."""
    return stacked.transpose(0, 2, 1).reshape(-1, stacked.shape[1])


def expert_rows(stacked):
    """A 3-D [experts, rows, cols] tensor as the 2-D [experts * rows, cols] kiln's expert Linear holds."""
    return stacked.reshape(-1, stacked.shape[-1])


def stacked_rows(experts: int):
    """The released gate and up [experts, rows, cols] each, concatenated ([2 x experts, rows, cols]), as kiln's
    expert rows: each expert's gate rows, then its up rows (Step 3.5's moe.gate_proj / moe.up_proj)."""
    def transform(both):
        return expert_rows(both.reshape(2, experts, *both.shape[1:]).swapaxes(0, 1))
    return transform


def moe_weight_map(c, names: dict[str, str], decoder_names: dict[str, str] | None = None) -> dict:
    """The decoder's weight map (causal_lm.decoder_weight_map with `decoder_names`, Llama's HF names by
    default) with each MoE layer's dense MLP entries replaced by its experts': `names` are the HF names
    under a layer of router, expert, gate, up, down, shared, shared_gate, choice_bias (the whole tensor name;
    expert: a format string with {j}), or `fused` in place of expert, gate, up and down: the module holding
    transformers 5's 3-D gate_up_proj [experts, gate rows + up rows, cols] and down_proj, or `stacked` in place of
    expert: the module holding the gate, up and down names as [experts, rows, cols] each; `shared_proj`: the shared
    expert's gate, up and down names where they are not the experts' (Mixtral-named experts beside a Llama-named
    shared expert: Kimi Linear, MiniMax-M3)."""
    from .causal_lm import LLAMA_NAMES, WeightSpec, decoder_weight_map
    decoder_names = decoder_names or LLAMA_NAMES
    m = decoder_weight_map(c, decoder_names)
    for layer in range(c.num_hidden_layers):
        spec = c.layer_moe(layer)
        if spec is None:
            continue
        k, hf_layer = f"model.layers.{layer}.mlp", decoder_names["layer"].format(i=layer)
        for key in [key for key in m if key.startswith(f"{k}.")]:
            del m[key]
        m[f"{k}.router"] = [f"{hf_layer}.{names['router']}.weight"]
        if "fused" in names:                # transformers 5's own layout: [experts, rows, cols] tensors
            fused = f"{hf_layer}.{names['fused']}"
            m[f"{k}.experts_gate_up.weight"] = WeightSpec((f"{fused}.gate_up_proj",), expert_rows)
            m[f"{k}.experts_down.weight"] = WeightSpec((f"{fused}.down_proj",), expert_rows)
        elif "stacked" in names:            # gate, up and down, each [experts, rows, cols] (Step 3.5's as released)
            stacked = f"{hf_layer}.{names['stacked']}"
            m[f"{k}.experts_gate_up.weight"] = WeightSpec(
                tuple(f"{stacked}.{names[p]}.weight" for p in ("gate", "up")), stacked_rows(spec.num_experts))
            m[f"{k}.experts_down.weight"] = WeightSpec((f"{stacked}.{names['down']}.weight",), expert_rows)
        else:
            expert = [f"{hf_layer}.{names['expert'].format(j=j)}" for j in range(spec.num_experts)]
            m[f"{k}.experts_gate_up.weight"] = [f"{x}.{names[p]}.weight" for x in expert for p in ("gate", "up")]
            m[f"{k}.experts_down.weight"] = [f"{x}.{names['down']}.weight" for x in expert]
        if spec.shared_intermediate_size:
            shared = f"{hf_layer}.{names['shared']}"
            gate, up, down = names.get("shared_proj", (names["gate"], names["up"], names["down"]))
            m[f"{k}.shared.gate_up_proj.weight"] = [f"{shared}.{gate}.weight", f"{shared}.{up}.weight"]
            m[f"{k}.shared.down_proj.weight"] = [f"{shared}.{down}.weight"]
            if c.flags().mlp_bias:
                m[f"{k}.shared.gate_up_proj.bias"] = [f"{shared}.{gate}.bias", f"{shared}.{up}.bias"]
                m[f"{k}.shared.down_proj.bias"] = [f"{shared}.{down}.bias"]
            if spec.shared_gated:
                m[f"{k}.shared_gate"] = [f"{hf_layer}.{names['shared_gate']}.weight"]
        if spec.choice_bias:
            m[f"{k}.choice_bias"] = [f"{hf_layer}.{names['choice_bias']}"]
    return m
