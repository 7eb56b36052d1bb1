"""The Llama family: Llama 2/3, SmolLM2, TinyLlama, Mistral (without sliding window).

A frozen config dataclass (`LlamaConfig.from_hf` maps Hugging Face field names),
the nn.Module built from models/layers.py, and the weight map from Hugging Face
tensor names to this module's parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import relax, te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, RopeMode, TIRPagedKVCache
from tvm.target import Target

from .config import ConfigField, read_fields
from .layers import GatedMLP, PagedAttention, RMSNorm, tied_logits


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    context_window_size: int
    tie_word_embeddings: bool
    rope_scaling: dict | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)

    FIELDS = (
        ConfigField("vocab_size", ("vocab_size",)),
        ConfigField("hidden_size", ("hidden_size", "n_embd", "d_model")),
        ConfigField("intermediate_size", ("intermediate_size", "ffn_dim", "n_inner")),
        ConfigField("num_hidden_layers", ("num_hidden_layers", "n_layer", "num_layers")),
        ConfigField("num_attention_heads", ("num_attention_heads", "n_head", "num_heads")),
        ConfigField("num_key_value_heads", ("num_key_value_heads", "num_kv_heads"), default="num_attention_heads"),
        ConfigField("head_dim", ("head_dim",), default=None),
        ConfigField("rms_norm_eps", ("rms_norm_eps", "layer_norm_eps", "norm_eps"), default=1e-6),
        ConfigField("rope_theta", ("rope_theta",), default=10000.0),
        ConfigField("context_window_size", ("max_position_embeddings", "max_sequence_length",
                                            "n_positions", "seq_length")),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=False),
        ConfigField("rope_scaling", ("rope_scaling",), default=None),
        ConfigField("attention_bias", ("attention_bias",), default=False),
        ConfigField("mlp_bias", ("mlp_bias",), default=False),
        ConfigField("bos_token_id", ("bos_token_id",), default=None),
        ConfigField("eos_token_ids", ("eos_token_id",), default=()),
    )

    @classmethod
    def from_hf(cls, hf: dict) -> "LlamaConfig":
        """Map a Hugging Face config.json dict; a ValueError names every field tried when one is missing."""
        values = read_fields(hf, cls.FIELDS, arch="llama")
        notes = []
        if values["head_dim"] is None:
            values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
        eos = values["eos_token_ids"]
        values["eos_token_ids"] = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        window = hf.get("sliding_window")
        if window and window < values["context_window_size"]:
            # Mistral's sliding window is not implemented: within the window attention is exact,
            # so the context is capped at the window instead of silently diverging past it.
            notes.append(f"context window capped at the sliding window ({window} tokens)")
            values["context_window_size"] = int(window)
        scaling = values["rope_scaling"]
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in ("default", "llama3", None):
                raise ValueError(f"rope_scaling type {kind!r} is not supported for llama yet "
                                 "(supported: default, llama3)")
            values["rope_scaling"] = None if kind in ("default", None) else dict(scaling, rope_type=kind)
        return cls(**values, notes=tuple(notes))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, c: LlamaConfig):
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = PagedAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                                        c.head_dim, qkv_bias=c.attention_bias)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)

    def forward(self, x: Tensor, kv_cache: PagedKVCache, layer_id: int) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), kv_cache, layer_id)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, c: LlamaConfig):
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([LlamaDecoderLayer(c) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x: Tensor, kv_cache: PagedKVCache) -> Tensor:
        for layer_id, layer in enumerate(self.layers):
            x = layer(x, kv_cache, layer_id)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    """Entry functions (see compiler/spec.py): embed, prefill, decode, batch_prefill,
    batch_decode, batch_verify, create_paged_kv_cache. Logits are always float32."""

    def __init__(self, config: LlamaConfig):
        self.config = config
        self.model = LlamaModel(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.dtype = "float32"

    def to(self, dtype: str | None = None) -> None:
        super().to(dtype=dtype)
        if dtype is not None:
            self.dtype = dtype

    def _logits(self, hidden: Tensor) -> Tensor:
        if self.config.tie_word_embeddings:
            logits = tied_logits(hidden, self.model.embed_tokens)
        else:
            logits = self.lm_head(hidden)
        return logits if logits.dtype == "float32" else logits.astype("float32")

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.model.embed_tokens(input_ids)                # [seq, hidden]

    def prefill(self, input_embed: Tensor, paged_kv_cache: PagedKVCache):
        hidden = self.model(input_embed, paged_kv_cache)         # [1, seq, hidden]
        return self._logits(_last_token(hidden)), paged_kv_cache  # [1, 1, vocab]

    def decode(self, input_embed: Tensor, paged_kv_cache: PagedKVCache):
        return self._logits(self.model(input_embed, paged_kv_cache)), paged_kv_cache

    def batch_prefill(self, input_embeds: Tensor, logit_positions: Tensor, paged_kv_cache: PagedKVCache):
        hidden = self.model(input_embeds, paged_kv_cache)        # [1, total_seq, hidden]
        hidden = op.take(hidden, logit_positions, axis=1)        # [1, batch, hidden]
        return self._logits(hidden), paged_kv_cache              # [1, batch, vocab]

    def batch_decode(self, input_embeds: Tensor, paged_kv_cache: PagedKVCache):
        return self._logits(self.model(input_embeds, paged_kv_cache)), paged_kv_cache  # [batch, 1, vocab]

    def batch_verify(self, input_embeds: Tensor, paged_kv_cache: PagedKVCache):
        return self._logits(self.model(input_embeds, paged_kv_cache)), paged_kv_cache  # [1, seq, vocab]

    def create_paged_kv_cache(self, max_batch_size: tirx.Var, max_total_seq_len: tirx.Var,
                              prefill_chunk_size: tirx.Var, page_size: tirx.Var,
                              support_sliding_window: tirx.Var) -> PagedKVCache:
        c = self.config
        return TIRPagedKVCache(
            attn_kind="mha",
            max_batch_size=max_batch_size,
            max_total_seq_len=max_total_seq_len,
            prefill_chunk_size=prefill_chunk_size,
            page_size=page_size,
            support_sliding_window=support_sliding_window,
            layer_partition=relax.ShapeExpr([0, c.num_hidden_layers]),
            num_hidden_layers=c.num_hidden_layers,
            num_attention_heads=c.num_attention_heads,
            num_key_value_heads=c.num_key_value_heads,
            qk_head_dim=c.head_dim,
            v_head_dim=c.head_dim,
            mla_original_qk_head_dim=0,
            mla_original_v_head_dim=0,
            rope_mode=RopeMode.NORMAL,
            rope_scale=1,
            rope_theta=c.rope_theta,
            rope_scaling=c.rope_scaling or {},
            rope_ext_factors=relax.prim_value(0),  # only longrope uses it
            rotary_dim=c.head_dim,
            enable_disaggregation=False,
            dtype=self.dtype,
            target=Target.current(),
        )


def _last_token(hidden: Tensor) -> Tensor:
    """hidden[:, -1:, :] as a TE op (the sequence length is symbolic)."""
    def compute(x: te.Tensor):
        b, s, d = x.shape
        return te.compute((b, 1, d), lambda i, _, k: x[i, s - 1, k], name="last_token")
    return op.tensor_expr_op(compute, "last_token", [hidden])


def weight_map(c: LlamaConfig) -> dict[str, list[str]]:
    """kiln parameter name -> the HF tensor names concatenated (axis 0) to make it."""
    m: dict[str, list[str]] = {"model.embed_tokens.weight": ["model.embed_tokens.weight"],
                               "model.norm.weight": ["model.norm.weight"]}
    if not c.tie_word_embeddings:
        m["lm_head.weight"] = ["lm_head.weight"]
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        m[f"{p}.input_layernorm.weight"] = [f"{p}.input_layernorm.weight"]
        m[f"{p}.post_attention_layernorm.weight"] = [f"{p}.post_attention_layernorm.weight"]
        m[f"{p}.self_attn.qkv_proj.weight"] = [f"{p}.self_attn.{x}_proj.weight" for x in "qkv"]
        if c.attention_bias:
            m[f"{p}.self_attn.qkv_proj.bias"] = [f"{p}.self_attn.{x}_proj.bias" for x in "qkv"]
        m[f"{p}.self_attn.o_proj.weight"] = [f"{p}.self_attn.o_proj.weight"]
        m[f"{p}.mlp.gate_up_proj.weight"] = [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"]
        m[f"{p}.mlp.down_proj.weight"] = [f"{p}.mlp.down_proj.weight"]
        if c.mlp_bias:
            m[f"{p}.mlp.gate_up_proj.bias"] = [f"{p}.mlp.gate_proj.bias", f"{p}.mlp.up_proj.bias"]
            m[f"{p}.mlp.down_proj.bias"] = [f"{p}.mlp.down_proj.bias"]
    return m
