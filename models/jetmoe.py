"""JetMoE (jetmoe: JetMoE-8B): a Llama whose attention and MLP are both mixtures of experts.

Attention (a mixture of attention heads): keys and values are one shared projection (kv_proj: num_key_value_heads
heads of kv_channels dims, k's rows then v's), a router picks num_experts_per_tok of num_local_experts experts a token
(a softmax over the k best logits), each chosen expert projects x to its own queries (num_key_value_heads heads), and
its head h attends over the shared head h; each expert's output goes through its own output projection, weighted by
the router, summed, plus a bias. kiln runs a token's k experts' queries as k x num_key_value_heads heads grouped over
the shared KV heads (query head h * k + j is expert slot j's head h, reading KV head h), so the KV cache is a grouped
one of num_key_value_heads heads; the experts' projections are gathered matmuls over the chosen experts' rows
(models/moe.py expert matmul: a token reads its k experts' weights alone).

MLP: a sparse MoE of gated experts (input_linear: each expert's gate rows, then its up rows) routed the same way,
plus a bias. transformers builds the layers' norms with epsilon 1e-6 whatever rms_norm_eps says, and the last norm
with rms_norm_eps: kiln does the same. The head is tied unless the config says otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache

from .causal_lm import DECODER_FIELDS, CausalLM, DecoderConfig, DecoderStack, WeightMap, WeightSpec, head_weights
from .config import ConfigField, fields_with
from .layers import DecoderLayer, Flags, cached_attention
from .moe import MoESpec, SparseMoE, expert_matmul, expert_rows, route
from .rope import apply_rope

LAYER_EPS = 1e-6            # transformers' JetMoeRMSNorm default, which its decoder layers take


@dataclass(frozen=True)
class JetMoeConfig(DecoderConfig):
    num_experts: int = 8
    top_k: int = 2
    hidden_act: str = "silu"

    ARCH: ClassVar[str] = "jetmoe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS,
        ConfigField("num_attention_heads", ("num_attention_heads",), default=None),   # k x num_key_value_heads
        ConfigField("head_dim", ("kv_channels", "head_dim")),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("num_experts", ("num_local_experts", "moe_num_experts")),
        ConfigField("top_k", ("num_experts_per_tok", "moe_top_k")),
        ConfigField("hidden_act", ("activation_function", "hidden_act"), default="silu"))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if values["hidden_act"] not in ("silu", "gelu", "relu"):
            raise ValueError(f"JetMoE with activation_function {values['hidden_act']!r} is not supported (silu, gelu "
                             "or relu)")
        MoESpec(values["num_experts"], values["top_k"], values["intermediate_size"], True)     # refuses a bad k
        # every expert slot's heads are query heads (transformers sets it so, whatever config.json holds)
        return dict(values, num_attention_heads=values["top_k"] * values["num_key_value_heads"])

    def flags(self) -> Flags:
        return Flags(activation=self.hidden_act)

    def moe(self, rows: int) -> MoESpec:
        """The routing both mixtures share (softmax over the k best logits), their experts `rows` wide."""
        return MoESpec(self.num_experts, self.top_k, rows, normalize=True)


class BiasedMoE(SparseMoE):
    """JetMoE's MLP: the sparse MoE's output plus a bias."""

    def __init__(self, c: JetMoeConfig, flags: Flags):
        super().__init__(c.hidden_size, c.moe(c.intermediate_size), flags)
        self.bias = nn.Parameter((c.hidden_size,))

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) + self.bias


class MixtureOfHeads(nn.Module):
    """JetMoE's attention (the module docstring): experts' query and output projections around shared keys and
    values."""

    kv_dtype: str | None = None             # the KV cache's dtype where not the activations' (CausalLM.set_kv_dtype)

    def __init__(self, c: JetMoeConfig, rope: tuple | None):
        self.h_kv, self.d, self.k, self.rope = c.num_key_value_heads, c.head_dim, c.top_k, rope
        self.sm_scale = c.head_dim ** -0.5
        width = self.h_kv * self.d
        self.router = nn.Parameter((c.num_experts, c.hidden_size), "float32")
        self.experts_q = nn.Linear(c.hidden_size, c.num_experts * width, bias=False)      # expert e's rows e * width
        self.experts_o = nn.Linear(width, c.num_experts * c.hidden_size, bias=False)
        self.kv_proj = nn.Linear(c.hidden_size, 2 * width, bias=False)
        self.bias = nn.Parameter((c.hidden_size,))
        self.spec = c.moe(width)

    def to(self, dtype: str | None = None) -> None:
        super().to(dtype)
        self.router.to("float32")

    def forward(self, x: Tensor, kv_cache: PagedKVCache, layer_id: int, positions: Tensor | None = None) -> Tensor:
        b, s, hidden = x.shape
        h_kv, d, k = self.h_kv, self.d, self.k
        flat = op.reshape(x, (b * s, hidden))
        logits = op.matmul(flat if flat.dtype == "float32" else flat.astype("float32"), op.permute_dims(self.router))
        weights, experts = route(self.spec, logits)                      # [T, k] each
        q = expert_matmul(flat, self.experts_q, experts, h_kv * d)                      # [T, k, h_kv d]
        # slot j's head h -> query head h * k + j: the k slots' heads grouped over KV head h
        q = op.reshape(op.permute_dims(op.reshape(q, (b, s, k, h_kv, d)), [0, 1, 3, 2, 4]), (b, s, h_kv * k, d))
        kv = op.reshape(self.kv_proj(x), (b, s, 2 * h_kv, d))
        if self.rope:
            key, value = op.split(kv, 2, axis=2)
            q, key = (apply_rope(t, positions, *self.rope) for t in (q, key))
            kv = op.concat([key, value], dim=2)
        out = cached_attention(kv_cache, layer_id, op.concat([q, kv], dim=2), h_kv * k, self.sm_scale,
                               self.kv_dtype)                                            # [b, s, h_kv k, d]
        out = op.reshape(op.permute_dims(op.reshape(out, (b, s, h_kv, k, d)), [0, 1, 3, 2, 4]), (b * s, k, h_kv * d))
        y = expert_matmul(out, self.experts_o, experts, hidden)                         # [T, k, hidden]
        w = op.reshape(weights if weights.dtype == y.dtype else weights.astype(y.dtype), (b * s, k, 1))
        return op.reshape(op.sum(y * w, axis=1), (b, s, hidden)) + self.bias


class JetMoeStack(DecoderStack):
    def decoder_layer(self, c: JetMoeConfig, i: int, flags: Flags, rope: tuple | None) -> nn.Module:
        return DecoderLayer(c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                            c.head_dim, LAYER_EPS, flags, rope, BiasedMoE(c, flags), MixtureOfHeads(c, rope))


class JetMoeForCausalLM(CausalLM):
    def stack(self, config: JetMoeConfig) -> nn.Module:
        return JetMoeStack(config, self.flags, self.attention)


def weight_map(c: JetMoeConfig) -> WeightMap:
    m = head_weights(c)
    for i in range(c.num_hidden_layers):
        k = f"model.layers.{i}"
        attn, hf, mlp = f"{k}.self_attn", f"{k}.self_attention", f"{k}.mlp"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            m[f"{k}.{norm}.weight"] = [f"{k}.{norm}.weight"]
        m[f"{attn}.router"] = [f"{hf}.experts.router.layer.weight"]
        m[f"{attn}.experts_q.weight"] = WeightSpec((f"{hf}.experts.input_linear.weight",), expert_rows)
        m[f"{attn}.experts_o.weight"] = WeightSpec((f"{hf}.experts.output_linear.weight",), expert_rows)
        m[f"{attn}.kv_proj.weight"] = [f"{hf}.kv_proj.weight"]
        m[f"{attn}.bias"] = [f"{hf}.experts.bias"]
        m[f"{mlp}.router"] = [f"{mlp}.router.layer.weight"]
        m[f"{mlp}.experts_gate_up.weight"] = WeightSpec((f"{mlp}.input_linear.weight",), expert_rows)
        m[f"{mlp}.experts_down.weight"] = WeightSpec((f"{mlp}.output_linear.weight",), expert_rows)
        m[f"{mlp}.bias"] = [f"{mlp}.bias"]
    return m
