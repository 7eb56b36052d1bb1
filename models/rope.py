"""Rotary position embedding applied in the model graph, for RoPE the KV cache cannot apply.

TVM's paged KV cache rotates q and k itself, with one theta and one scaling for every layer,
and knows the `default`, `llama3`, `longrope` and `yarn` scalings. Models whose layers differ
(Gemma 3: a local base for sliding layers, a global base with linear scaling for the others)
or whose scaling kiln's kernels lack (`linear`, `longrope`, `yarn`) rotate q and k here instead, and create the cache
with RopeMode.NONE. The inverse frequencies are computed in float32 numpy the way transformers
computes them (modeling_rope_utils), so the angles agree to float32 rounding.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import te, tirx
from tvm.relax.frontend.nn import Tensor, op

CACHE_SCALINGS = ("llama3",)         # scalings kiln leaves to the KV cache's fused RoPE kernel
GRAPH_SCALINGS = ("linear", "longrope", "yarn")


def inv_freq(head_dim: int, theta: float, scaling: dict | None) -> tuple[np.ndarray, float]:
    """(inverse frequencies [head_dim / 2] float32, factor on cos and sin), as transformers computes them.
    A longrope scaling carries its `factor` (families fill it in from the position counts). With
    partial rotary, `head_dim` is the rotated dims' count (transformers' `dim`)."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    base = np.float32(theta) ** exponent
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":
        return (np.float32(1.0) / base).astype(np.float32), 1.0
    if kind == "linear":
        return ((np.float32(1.0) / base) / np.float32(scaling["factor"])).astype(np.float32), 1.0
    if kind == "longrope":
        # Short factors: kiln caps the context at original_max_position_embeddings (see models/phi3.py),
        # where transformers uses them too.
        original = scaling["original_max_position_embeddings"]
        factor = scaling["factor"]
        attention = scaling.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        short = np.asarray(scaling["short_factor"], dtype=np.float32)
        return (np.float32(1.0) / (short * base)).astype(np.float32), float(attention)
    if kind == "yarn":
        return _yarn(head_dim, theta, scaling, base)
    if kind == "llama3":
        return _llama3((np.float32(1.0) / base).astype(np.float32), scaling), 1.0
    raise ValueError(f"RoPE scaling {kind!r} cannot be applied in the graph "
                     f"(supported: default, {', '.join(GRAPH_SCALINGS)})")


def proportional(head_dim: int, theta: float, partial: float, factor: float = 1.0) -> tuple[np.ndarray, float]:
    """transformers' "proportional" RoPE (Gemma 4's and LFM3's global layers): frequencies over the whole head
    size (theta ** (-2i / head_dim)) for the first partial * head_dim / 2 pairs, 0 for the rest (unrotated),
    all divided by `factor`: ([head_dim / 2], 1.0) for apply_rope over the whole head."""
    rotated = int(partial * head_dim // 2)              # transformers' rope_angles
    freqs, scale = inv_freq(head_dim, theta, None)
    freqs = np.concatenate([freqs[:rotated], np.zeros(head_dim // 2 - rotated, np.float32)]) / np.float32(factor)
    return freqs.astype(np.float32), scale


def _llama3(inv: np.ndarray, scaling: dict) -> np.ndarray:
    """Llama 3's scaling (where the graph rotates: a model with NoPE layers, Llama 4): frequencies whose
    wavelength passes original / low_freq_factor divided by `factor`, those below original /
    high_freq_factor kept, and the ones between blended (transformers' _compute_llama3_parameters)."""
    factor, low, high = (float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    original = float(scaling["original_max_position_embeddings"])
    wavelen = np.float32(2 * math.pi) / inv
    scaled = np.where(wavelen > original / low, inv / np.float32(factor), inv)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return np.where(medium, blended, scaled).astype(np.float32)


def _yarn(dim: int, theta: float, scaling: dict, base: np.ndarray) -> tuple[np.ndarray, float]:
    """YaRN (Qwen2.5/3 long context, DeepSeek-style mscale): each frequency blended between the original
    (fast-rotating dims, extrapolated) and the original divided by `factor` (slow dims, interpolated) along
    a linear ramp between the dims that turn beta_fast and beta_slow times in the original context; cos
    and sin scaled by the attention factor (0.1 ln(factor) + 1, or the mscale ratio)."""
    factor, original = float(scaling["factor"]), scaling["original_max_position_embeddings"]
    attention = scaling.get("attention_factor")
    if attention is None:
        mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all) if mscale and mscale_all
                     else _yarn_mscale(factor))

    def turning(rotations: float) -> float:          # the dim that turns `rotations` times in `original` positions
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = turning(scaling.get("beta_fast") or 32), turning(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolated = (np.float32(1) - ramp).astype(np.float32)
    inv = np.float32(1.0) / base
    interpolated = np.float32(1.0) / (np.float32(factor) * base)
    return (interpolated * (np.float32(1) - extrapolated) + inv * extrapolated).astype(np.float32), float(attention)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def query_temperature(scaling: dict | None) -> tuple[float, int] | None:
    """Llama 4's query temperature from a rope scaling's llama_4_scaling_beta: (beta, the pretraining
    context), None without one (position_temperature applies it)."""
    scaling = scaling or {}
    beta, original = scaling.get("llama_4_scaling_beta"), scaling.get("original_max_position_embeddings")
    if beta and not original:
        raise ValueError("llama_4_scaling_beta without original_max_position_embeddings in rope_parameters; "
                         "fix config.json")
    return (float(beta), int(original)) if beta else None


def position_temperature(q: Tensor, positions: Tensor, beta: float, original: int, offset: int = 0,
                         form: str = "log_floor") -> Tensor:
    """q [batch, seq, heads, head_dim] times a scale that follows its position p: with `form` "log_floor",
    1 + beta * log(1 + floor((p + offset) / original)) (Llama 4's, offset 1, and Ministral 3's attention
    temperature: 1 within the pretraining context, rising slowly past it); with "power", (1 + (p + offset) /
    original) ** beta (Beam's scalable softmax on its layers without RoPE: beta 0.1, original 2048, offset 1)."""
    if form not in ("log_floor", "power"):
        raise ValueError(f"attention temperature form {form!r} is not one of log_floor, power")

    def compute(x: te.Tensor, pos: te.Tensor):
        _, s, _, _ = x.shape

        def scaled(b, t, h, i):
            at = (pos[b * s + t] + offset).astype("float32") / np.float32(original)
            if form == "power":                # log(1 + at), not log1p: every target's codegen has log
                scale = tirx.exp(np.float32(beta) * tirx.log(np.float32(1.0) + at))
            else:
                scale = np.float32(1.0) + np.float32(beta) * tirx.log(np.float32(1.0) + tirx.floor(at))
            return (x[b, t, h, i].astype("float32") * scale).astype(x.dtype)
        return te.compute(x.shape, scaled, name="position_temperature")
    return op.tensor_expr_op(compute, "position_temperature", [q, positions])


def pair_halves(r: int) -> np.ndarray:
    """The r rotated dims of a checkpoint whose RoPE pairs (2i, 2i+1), in the order kiln's RoPE pairs them
    ((i, i + r/2)): the evens, then the odds. Pair i keeps its frequency."""
    return np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2)])


def apply_rope(x: Tensor, positions: Tensor, freqs: np.ndarray, factor: float) -> Tensor:
    """Rotate x [batch, seq, heads, head_dim] by its positions [batch * seq] (transformers' rotate-half
    convention: the first half of the rotated dims pairs with the second half). The rotated dims are
    the first 2 * len(freqs) (partial rotary); the rest pass through.

    cos and sin are computed once per (position, frequency), in a table of their own that every head
    and both halves read: computed per element (a libm call each on CPUs), they were heads x 2 times as
    many (Gemma 3 270M's q: 8x; its RoPE took 4% of a 1,000-token prefill). The same float32 values."""
    table = Tensor.from_const(freqs)
    half = len(freqs)

    def compute(x: te.Tensor, pos: te.Tensor, inv: te.Tensor):
        _, s, _, d = x.shape

        def angle(p, f):
            return pos[p].astype("float32") * inv[f]
        cos = te.compute((pos.shape[0], half), lambda p, f: tirx.cos(angle(p, f)) * np.float32(factor), name="rope_cos")
        sin = te.compute((pos.shape[0], half), lambda p, f: tirx.sin(angle(p, f)) * np.float32(factor), name="rope_sin")

        def rotated(b, t, h, i):
            f = tirx.floormod(i, half)
            partner = tirx.if_then_else(i < half, -x[b, t, h, i + half].astype("float32"),
                                        x[b, t, h, tirx.max(i - half, 0)].astype("float32"))
            out = x[b, t, h, i].astype("float32") * cos[b * s + t, f] + partner * sin[b * s + t, f]
            return out.astype(x.dtype) if half * 2 == int(d) else tirx.if_then_else(i < 2 * half, out.astype(x.dtype),
                                                                                      x[b, t, h, i])
        return te.compute(x.shape, rotated, name="rope")
    return op.tensor_expr_op(compute, "rope", [x, positions, table])
