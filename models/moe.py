"""Sparse mixture-of-experts MLPs (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): a router picks `top_k` of
`num_experts` gated MLPs per token and sums their outputs weighted by the router's probabilities.

    probs   = softmax(x @ router.T)             float32, over every expert
    w, e    = top_k(probs)                      the k largest, their experts; w / sum(w) where the
                                                family normalises (Mixtral, norm_topk_prob)
    y       = sum_j w_j * down[e_j](act(gate[e_j] x) * up[e_j] x)
            (+ sigmoid(shared_gate . x) * shared_mlp(x): Qwen2-MoE's shared expert)

Each token's k experts are computed by gathered matmuls (TE reductions reading the expert's rows
through the router's indices): a token reads only its k experts' weights, and no expert weight
is copied. The experts' weights stay in the compute dtype under every --quant (the quantized
kernels take 2-D weights only; the router and the shared expert's gate stay float, as llama.cpp
keeps its ffn_gate_inp); a compile notes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from .layers import MLP, Flags, _activation


@dataclass(frozen=True)
class MoESpec:
    """One MoE layer's shape and routing."""

    num_experts: int
    top_k: int
    intermediate_size: int                  # each expert's
    normalize: bool                         # top-k weights divided by their sum
    shared_intermediate_size: int = 0       # a shared expert behind a sigmoid gate (Qwen2-MoE); 0: none

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok ({self.top_k}) must be from 1 to the number of experts "
                             f"({self.num_experts}); fix config.json")


NOTE = ("MoE expert weights stay in the compute dtype under every --quant (kiln's quantized kernels do not take "
        "expert weights yet): the artifact is larger than the quantization alone implies")


class SparseMoE(nn.Module):
    def __init__(self, hidden_size: int, spec: MoESpec, flags: Flags):
        self.spec, self.activation = spec, flags.activation
        e, i = spec.num_experts, spec.intermediate_size
        self.router = nn.Parameter((e, hidden_size))                    # kept float: not an nn.Linear
        self.experts_gate_up = nn.Parameter((e, 2 * i, hidden_size))    # gate rows, then up rows
        self.experts_down = nn.Parameter((e, hidden_size, i))
        if spec.shared_intermediate_size:
            self.shared = MLP(hidden_size, spec.shared_intermediate_size, flags)
            self.shared_gate = nn.Parameter((1, hidden_size))

    def forward(self, x: Tensor) -> Tensor:
        b, s, h = x.shape
        flat = op.reshape(x, (b * s, h))                                # [T, h]
        logits = op.matmul(flat, op.permute_dims(self.router))
        probs = op.softmax(logits if logits.dtype == "float32" else logits.astype("float32"), axis=-1)
        weights, experts = _top_k(probs, self.spec.top_k)
        if self.spec.normalize:
            weights = weights / op.sum(weights, axis=-1, keepdims=True)
        gate, up = op.split(_expert_matmul(flat, self.experts_gate_up, experts), 2, axis=-1)   # [T, k, i] each
        out = _expert_matmul(_activation(gate, self.activation) * up, self.experts_down, experts)  # [T, k, h]
        weights = weights if weights.dtype == out.dtype else weights.astype(out.dtype)
        y = op.sum(out * op.reshape(weights, (b * s, self.spec.top_k, 1)), axis=1)            # [T, h]
        if hasattr(self, "shared"):
            gate_logit = op.matmul(flat, op.permute_dims(self.shared_gate))                  # [T, 1]
            y = y + op.sigmoid(gate_logit) * self.shared(flat)
        return op.reshape(y, (b, s, h))


def _top_k(probs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(the k largest of each row of probs [T, E], float32; their columns, int32), largest first, the
    lower column first among equal values (torch.topk's order). By rank: a column's rank is the
    count of columns ahead of it, and slot j takes the column ranked j (E x E compares a token;
    relax's topk has no lowering in TVM 0.27)."""
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

    rank = op.tensor_expr_op(ranks, "expert_rank", [probs])
    weights = op.tensor_expr_op(lambda p, r: pick(p, r, False), "top_k_weights", [probs, rank])
    experts = op.tensor_expr_op(lambda p, r: pick(p, r, True), "top_k_experts", [probs, rank])
    return weights, experts


def _expert_matmul(x: Tensor, w: Tensor, experts: Tensor) -> Tensor:
    """expert_matmul_te over nn Tensors."""
    return op.tensor_expr_op(expert_matmul_te, "expert_matmul", [x, w, experts])


def expert_matmul_te(x: te.Tensor, w: te.Tensor, experts: te.Tensor) -> te.Tensor:
    """out[t, j, n] = sum_r x[t(, j), r] * w[experts[t, j], n, r]: each token's row times its j-th
    expert's weight rows (x [T, r] shared by the token's experts, or [T, k, r] one row per expert),
    summed in float32, returned in x's dtype."""
    tokens, k = experts.shape
    _, n, depth = w.shape
    r = te.reduce_axis((0, depth), name="r")

    def row(t, j):
        return (lambda c: x[t, c]) if len(x.shape) == 2 else (lambda c: x[t, j, c])
    total = te.compute((tokens, k, n), lambda t, j, c: te.sum(
        row(t, j)(r).astype("float32") * w[experts[t, j], c, r].astype("float32"), axis=r), name="expert_matmul")
    if x.dtype == "float32":
        return total
    return te.compute(total.shape, lambda t, j, c: total[t, j, c].astype(x.dtype), name="expert_matmul_cast")


def stacked(experts: int, rows: int):
    """The transform stacking `experts` experts' HF weights (concatenated along axis 0, each `rows`
    rows) into kiln's [experts, rows, cols]."""
    def stack(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a.reshape(experts, rows, a.shape[-1]))
    return stack


def moe_weight_map(m: dict, layer: int, spec: MoESpec, hf_layer: str, names: dict[str, str]) -> None:
    """Replace layer `layer`'s dense MLP entries of weight map `m` with its MoE's. `hf_layer`: the HF
    layer prefix; `names`: the HF names under it of router, expert, gate, up, down, shared, shared_gate
    (expert: a format string with {j})."""
    from .causal_lm import WeightSpec
    k = f"model.layers.{layer}.mlp"
    for key in [key for key in m if key.startswith(f"{k}.")]:
        del m[key]
    e, i = spec.num_experts, spec.intermediate_size
    expert = [f"{hf_layer}.{names['expert'].format(j=j)}" for j in range(e)]
    m[f"{k}.router"] = [f"{hf_layer}.{names['router']}.weight"]
    m[f"{k}.experts_gate_up"] = WeightSpec(tuple(f"{x}.{names[p]}.weight" for x in expert for p in ("gate", "up")),
                                           stacked(e, 2 * i))
    m[f"{k}.experts_down"] = WeightSpec(tuple(f"{x}.{names['down']}.weight" for x in expert), stacked(e, -1))
    if spec.shared_intermediate_size:
        shared = f"{hf_layer}.{names['shared']}"
        m[f"{k}.shared.gate_up_proj.weight"] = [f"{shared}.{names['gate']}.weight", f"{shared}.{names['up']}.weight"]
        m[f"{k}.shared.down_proj.weight"] = [f"{shared}.{names['down']}.weight"]
        m[f"{k}.shared_gate"] = [f"{hf_layer}.{names['shared_gate']}.weight"]
