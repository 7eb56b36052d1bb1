"""The one causal-LM base every family builds on: config fields, entry functions, KV-cache spec.

A family file (llama.py, qwen2.py, ...) holds only what differs: its config mapping (a
`DecoderConfig` subclass: extra HF fields, `flags()`, per-layer attention), and its weight map
(usually `decoder_weight_map` with a few names changed). Everything else is here:

    CausalLM(config)   embed, prefill, decode, batch_prefill, batch_decode, batch_verify,
                       create_paged_kv_cache (the names the runtime calls; compiler/spec.py exports
                       them), over `DecoderLayer`s built from models/layers.py with the family's Flags.

The KV cache gets one attention kind per layer (full, or sliding window with its size). TVM's
paged KV cache applies RoPE itself with a single theta/scaling; a model whose layers differ in
RoPE, or whose scaling the cache lacks, rotates q and k in the graph instead (models/rope.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar

import numpy as np
from tvm import relax, te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, RopeMode, TIRPagedKVCache
from tvm.target import Target

from .config import ConfigField, read_fields
from .layers import BIASED_NORMS, PARAMLESS_NORMS, DecoderLayer, Flags, Norm, tied_logits
from .mla import LatentAttention, MLASpec
from .moe import MoESpec, SparseMoE
from .owned_kv import OwnedKVCache, OwnedLayout
from .rope import GRAPH_SCALINGS, inv_freq, pair_halves
from .sampling import lanes_for, sample_kernel

# HF field names shared by the decoder families (a family adds its own or overrides these).
DECODER_FIELDS = (
    ConfigField("vocab_size", ("vocab_size",)),
    ConfigField("hidden_size", ("hidden_size", "n_embd", "d_model")),
    ConfigField("intermediate_size", ("intermediate_size", "ffn_dim", "n_inner")),
    ConfigField("num_hidden_layers", ("num_hidden_layers", "n_layer", "num_layers")),
    ConfigField("num_attention_heads", ("num_attention_heads", "n_head", "num_heads")),
    ConfigField("num_key_value_heads", ("num_key_value_heads", "num_kv_heads"), default="num_attention_heads"),
    ConfigField("head_dim", ("head_dim",), default=None),
    ConfigField("norm_eps", ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps"), default=1e-6),
    ConfigField("rope_theta", ("rope_theta",), default=10000.0),
    ConfigField("context_window_size", ("max_position_embeddings", "max_sequence_length", "n_positions",
                                        "seq_length")),
    ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=False),
    ConfigField("rope_scaling", ("rope_scaling",), default=None),
    ConfigField("bos_token_id", ("bos_token_id",), default=None),
    ConfigField("eos_token_ids", ("eos_token_id",), default=()),
    ConfigField("partial_rotary_factor", ("partial_rotary_factor",), default=1.0),
)


@dataclass(frozen=True)
class LayerAttention:
    """One layer's attention: its kind and RoPE (what TIRPagedKVCache needs per layer)."""

    kind: str = "full"                      # "full" | "sliding"
    window: int | None = None               # tokens, for "sliding"
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rope: bool = True                       # False: no positional rotation at all (SmolLM3's NoPE layers)
    rotary_dim: int | None = None           # the dims of each head RoPE rotates where the layer's own (Laguna's
                                            # kinds; RoPE then in the graph); None: the config's rotary_dim


@dataclass(frozen=True)
class DecoderConfig:
    """Fields every decoder family has; `from_hf` maps a config.json dict through `FIELDS`."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    norm_eps: float
    rope_theta: float
    context_window_size: int
    tie_word_embeddings: bool
    rope_scaling: dict | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    partial_rotary_factor: float = 1.0      # RoPE rotates the first head_dim * this dims of each head
    notes: tuple[str, ...] = field(default=(), compare=False)

    ARCH: ClassVar[str] = "decoder"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = DECODER_FIELDS
    ROPE_TYPES: ClassVar[tuple[str, ...]] = ("default", "llama3", "yarn")    # rope_scaling types the family takes
    ADJACENT_ROPE: ClassVar[bool] = False   # the checkpoint's RoPE pairs dims (2i, 2i+1), not (i, i + rotary/2)

    @classmethod
    def from_hf(cls, hf: dict) -> "DecoderConfig":
        """Map a Hugging Face config.json dict; a ValueError names every field tried when one is missing."""
        values = read_fields(_flat_rope(hf), cls.FIELDS, arch=cls.ARCH)
        if values["head_dim"] is None:
            values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
        eos = values["eos_token_ids"]
        values["eos_token_ids"] = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        scaling = values["rope_scaling"]
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in (*cls.ROPE_TYPES, None):
                raise ValueError(f"rope_scaling type {kind!r} is not supported for {cls.ARCH} yet "
                                 f"(supported: {', '.join(cls.ROPE_TYPES)})")
            values["rope_scaling"] = None if kind in ("default", None) else dict(scaling, rope_type=kind)
            if kind == "yarn":
                _check_yarn(values, hf)
        rotary = values["head_dim"] * values["partial_rotary_factor"]
        if not 0 < rotary <= values["head_dim"] or int(rotary) % 2:
            raise ValueError(f"partial_rotary_factor {values['partial_rotary_factor']} gives {rotary} rotary dims of "
                             f"head_dim {values['head_dim']}; it must be an even count from 2 to head_dim")
        notes: list[str] = []
        values = cls.adapt(values, hf, notes)
        return cls(**values, notes=tuple(notes))

    @property
    def rotary_dim(self) -> int:
        """The dims of each head RoPE rotates (the first ones; transformers' int(head_dim * factor))."""
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        """A family's own mapping after the shared one (extra fields, caps, refusals)."""
        return values

    def flags(self) -> Flags:
        return Flags()

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        """Per layer: full attention with the model's RoPE, unless a family says otherwise."""
        return (LayerAttention("full", None, self.rope_theta, self.rope_scaling),) * self.num_hidden_layers

    def layer_moe(self, layer: int) -> MoESpec | None:
        """Layer `layer`'s mixture of experts (models/moe.py), None for a dense MLP (every layer, unless a
        family says otherwise)."""
        return None

    def layer_flags(self, layer: int) -> Flags:
        """Layer `layer`'s Flags where its attention differs from the model's (Llama 4's NoPE layers)."""
        return self.flags()

    def layer_heads(self, layer: int) -> int:
        """Layer `layer`'s query heads (Laguna's differ by layer: num_attention_heads_per_layer)."""
        return self.num_attention_heads

    def layer_intermediate(self, layer: int) -> int:
        """Layer `layer`'s MLP width (OpenELM's differ by layer: ffn_multipliers)."""
        return self.intermediate_size

    def layer_kv_heads(self, layer: int) -> int:
        """Layer `layer`'s KV heads (MiMo-V2-Flash's sliding layers hold twice its full ones'; kv_layers says so)."""
        return self.num_key_value_heads

    def latent_attention(self) -> MLASpec | None:
        """Every layer's multi-head latent attention (models/mla.py), None for plain attention."""
        return None

    def kv_layers(self) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]] | None:
        """Where layers' KV caches differ (Gemma 4): per cache layer (kv heads, head dim), and per layer the
        layer whose keys and values it attends over (itself, or an earlier one it shares); None where every
        layer holds its own of one shape. Only the cache kiln owns takes such a model. A recurrent layer (one
        state_layers gives states) holds no pages: (1, 1)."""
        states = self.state_layers()
        if not any(states):
            return None
        return (tuple((1, 1) if s else (self.num_key_value_heads, self.head_dim) for s in states),
                tuple(range(len(states))))

    def state_layers(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Per layer, the shapes of its recurrent state tensors (Qwen3.5's DeltaNet; KVCacheLayout.layer_states);
        empty where no layer keeps one."""
        return ()


def _flat_rope(hf: dict) -> dict:
    """transformers 5 writes RoPE as `rope_parameters: {rope_type, rope_theta, factor, ...}` instead of
    top-level `rope_theta` and `rope_scaling`: read either."""
    params = hf.get("rope_parameters")
    if not isinstance(params, dict) or "rope_theta" not in params:
        return hf                       # absent, or per layer type (Gemma 3): the family maps it
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
    default = scaling.get("rope_type", scaling.get("type", "default")) == "default"
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    return {**hf, "rope_theta": params["rope_theta"], "rope_scaling": None if default else scaling,
            "partial_rotary_factor": partial}


def _check_yarn(values: dict, hf: dict) -> None:
    """A YaRN scaling needs the pretraining context (in rope_scaling, or beside it); its factor is the
    context over it where unwritten (transformers' rule)."""
    scaling = values["rope_scaling"]
    original = scaling.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings")
    if not original:
        raise ValueError("rope_scaling type 'yarn' needs original_max_position_embeddings (the pretraining "
                         "context); add it to config.json's rope_scaling")
    values["rope_scaling"] = dict(scaling, original_max_position_embeddings=original,
                                  factor=scaling.get("factor") or values["context_window_size"] / original)


def attention_by_type(types, window: int | None, rope: Callable[[str], tuple]) -> tuple[LayerAttention, ...]:
    """Each layer's LayerAttention from its type ("sliding_attention" | "full_attention"): sliding layers
    attend to the last `window` tokens (full where `window` is None); `rope(type)` gives the layer's
    (theta, scaling) or (theta, scaling, rotates)."""
    return tuple(LayerAttention("sliding", window, *rope(t)) if t == "sliding_attention" and window
                 else LayerAttention("full", None, *rope(t)) for t in types)


def rope_on_sliding_only(c, window: int | None = None) -> tuple[LayerAttention, ...]:
    """c's layers by c.layer_types: sliding ones (of `window`, c.sliding_window where not given) with the model's RoPE,
    full ones with no positions at all (EXAONE 4, Cohere 2, Flint, OLMo Hybrid, Beam, Ergo)."""
    return attention_by_type(c.layer_types, c.sliding_window if window is None else window,
                             lambda t: (c.rope_theta, c.rope_scaling, t == "sliding_attention"))


def local_rope_on_sliding(c) -> tuple[LayerAttention, ...]:
    """c's layers by c.layer_types: sliding ones rotating unscaled by c.local_rope_theta, full ones by the model's RoPE
    (OLMo 3, Mellum, MiMo-V2-Flash)."""
    return attention_by_type(c.layer_types, c.sliding_window, lambda t: (
        (c.local_rope_theta, None) if t == "sliding_attention" else (c.rope_theta, c.rope_scaling)))


def rope_in_graph(layers: tuple[LayerAttention, ...], flags: Flags | None = None) -> bool:
    """Whether q and k are rotated in the graph: the layers' RoPE differ (or some have none, or rotate dims of their
    own), the cache lacks the scaling, q and k are normed after their rotation, or q's scale follows its position."""
    ropes = {(a.rope, a.rope_theta, repr(a.rope_scaling), a.rotary_dim) for a in layers}
    kinds = {(a.rope_scaling or {}).get("rope_type") for a in layers}
    by_flags = bool(flags and (flags.qk_norm_after_rope or flags.attn_temperature or flags.rope_in_graph))
    return len(ropes) > 1 or not all(a.rope for a in layers) or bool(kinds & set(GRAPH_SCALINGS)) or by_flags


class DecoderStack(nn.Module):
    def __init__(self, c: DecoderConfig, flags: Flags, attention: tuple[LayerAttention, ...]):
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        if flags.learned_positions:
            self.embed_positions = nn.Embedding(c.context_window_size, c.hidden_size)
        in_graph = rope_in_graph(attention, flags) and not flags.learned_positions
        self.needs_positions = in_graph or flags.learned_positions
        self.layers = nn.ModuleList([self.decoder_layer(c, i, c.layer_flags(i), inv_freq(
            a.rotary_dim or c.rotary_dim, a.rope_theta, a.rope_scaling) if in_graph and a.rope else None)
            for i, a in enumerate(attention)])
        self.norm = Norm(c.hidden_size, c.norm_eps, flags.final_norm_kind or flags.norm)
        if flags.embed_norm:
            self.embed_norm = Norm(c.hidden_size, c.norm_eps, flags.embed_norm_kind or flags.norm)

    def decoder_layer(self, c: DecoderConfig, i: int, flags: Flags, rope: tuple | None) -> nn.Module:
        """Layer i, with its flags and its RoPE where the graph applies it (a family whose layers have other parts
        than DecoderLayer's overrides this: Nemotron-NAS's)."""
        mla = c.latent_attention()
        latent = LatentAttention(c.hidden_size, c.num_attention_heads, mla, flags.sm_scale(c.head_dim),
                                 flags.qkv_bias, rope, flags.attn_temperature) if mla else None
        return DecoderLayer(c.hidden_size, c.layer_intermediate(i), c.layer_heads(i), c.layer_kv_heads(i),
                            c.head_dim, c.norm_eps, flags, rope,
                            SparseMoE(c.hidden_size, moe, flags) if (moe := c.layer_moe(i)) else None, latent)

    def forward(self, x: Tensor, kv_cache: PagedKVCache) -> Tensor:
        b, s, d = x.shape
        if hasattr(self, "embed_norm"):
            x = self.embed_norm(x)
        positions = kv_cache.get_query_positions(b * s) if self.needs_positions else None   # [b * s]
        if hasattr(self, "embed_positions"):                     # absolute positions
            x = x + op.reshape(self.embed_positions(positions), (b, s, d))
        for layer_id, layer in enumerate(self.layers):
            x = layer(x, kv_cache, layer_id, positions)
        return self.norm(x)


class CausalLM(nn.Module):
    """Entry functions (see runtime/contract.py ENTRY_FUNCTIONS). Logits are always float32."""

    def __init__(self, config: DecoderConfig):
        self.config, self.flags = config, config.flags()
        self.attention = config.layer_attention()
        self.sliding_window = sliding_window(self.attention)
        self.rope_in_graph = rope_in_graph(self.attention, self.flags)
        self.model = self.stack(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=self.flags.head_bias)
        self.dtype = "float32"
        self.kv_dtype: str | None = None      # the KV cache's, where it is not the compute dtype
        self.owned_layout: OwnedLayout | None = None   # set by own_kv_cache: kiln's cache, not TVM's

    def stack(self, config: DecoderConfig) -> nn.Module:
        """The layers between the embedding and the head (a family whose layers are not DecoderLayers: its own)."""
        return DecoderStack(config, self.flags, self.attention)

    @property
    def window_mode(self) -> str | None:
        """How the KV cache slides: "per_sequence" when every layer slides (Mistral) and the cache applies
        RoPE: plain "mha" layers and a per-sequence window the runtime enables, so TVM frees the pages
        that leave it (cached keys move, so TVM applies RoPE inside attention). "per_layer" otherwise
        (mixed layers): per-layer windows over every page. None without sliding layers, or over the
        cache kiln owns (which masks windows by position)."""
        kinds = {a.kind for a in self.attention}
        if "sliding" not in kinds or self.owned_layout is not None:
            return None
        problem = self.tvm_cache_problem()
        if problem:
            raise ValueError(f"{problem}; compile with --kv-cache kiln (or auto)")
        return "per_sequence" if kinds == {"sliding"} else "per_layer"

    def tvm_cache_problem(self) -> str | None:
        """Why TVM's paged KV cache cannot run this model (then `kiln compile` takes the cache kiln owns),
        None where it can."""
        kinds = {a.kind for a in self.attention}
        if self.config.kv_layers():
            return ("this model's layers differ in KV head size or share an earlier layer's keys and values, "
                    "and TVM's paged KV cache holds one shape for every layer")
        c = self.config
        if len({c.layer_heads(i) for i in range(c.num_hidden_layers)}) > 1:
            return "this model's layers differ in query heads, and TVM's paged KV cache attends one count for all"
        if self.flags.attn_sinks:
            return ("this model's attention has sinks (a logit per head in every softmax), which TVM's paged KV "
                    "cache cannot apply")
        if self.flags.alibi:
            return "this model's attention adds ALiBi's bias by distance, which TVM's paged KV cache cannot apply"
        if kinds != {"sliding"}:
            return None
        if self.rope_in_graph or self.flags.learned_positions:
            # TVM 0.27's per-layer windows crash when no layer is full, and its per-sequence window
            # renumbers the positions a graph-side RoPE reads.
            return ("every layer slides and RoPE is applied in the graph (scaled or learned positions): TVM's paged "
                    "KV cache supports neither")
        if self.config.rotary_dim != self.config.head_dim:
            return ("every layer slides and RoPE rotates part of each head (partial_rotary_factor): TVM's paged KV "
                    "cache then rotates whole heads inside attention")
        return None

    def to(self, dtype: str | None = None) -> None:
        super().to(dtype=dtype)
        if dtype is not None:
            self.dtype = dtype

    def set_kv_dtype(self, dtype: str) -> None:
        """Keep the KV cache in `dtype` (float16 under float32 compute: half the cache's bytes; each
        layer's q, k and v are rounded to it on their way into attention, as llama.cpp's f16 cache
        does); the compute dtype's own is the default."""
        self.kv_dtype = None if dtype == self.dtype else dtype
        for layer in self.model.layers:     # its attentions, or the one mixer of a family whose layers name it so
            for attention in layer.attentions() if hasattr(layer, "attentions") else \
                    (layer.self_attn if hasattr(layer, "self_attn") else layer.mixer,):
                attention.kv_dtype = self.kv_dtype

    def _logits(self, hidden: Tensor) -> Tensor:
        if self.config.tie_word_embeddings:
            logits = tied_logits(hidden, self.model.embed_tokens)
        else:
            logits = self.lm_head(hidden)
        logits = logits if logits.dtype == "float32" else logits.astype("float32")
        if self.flags.logit_divisor:
            logits = logits / self.flags.logit_divisor
        cap = self.flags.final_logit_softcap
        return op.tanh(logits / cap) * cap if cap else logits

    def embed(self, input_ids: Tensor) -> Tensor:
        x = self.model.embed_tokens(input_ids)                   # [seq, hidden]
        scale = self.flags.embed_scale
        return x * scale if scale else x

    def prefill(self, input_embed: Tensor, paged_kv_cache: PagedKVCache):
        kv = self._cache(paged_kv_cache)
        hidden = self.model(input_embed, kv)                     # [1, seq, hidden]
        return self._logits(_last_token(hidden)), self._cache_out(kv)  # [1, 1, vocab]

    def decode(self, input_embed: Tensor, paged_kv_cache: PagedKVCache):
        kv = self._cache(paged_kv_cache)
        return self._logits(self.model(input_embed, kv)), self._cache_out(kv)

    def batch_prefill(self, input_embeds: Tensor, logit_positions: Tensor, paged_kv_cache: PagedKVCache):
        kv = self._cache(paged_kv_cache)
        hidden = self.model(input_embeds, kv)                    # [1, total_seq, hidden]
        hidden = op.take(hidden, logit_positions, axis=1)        # [1, batch, hidden]
        return self._logits(hidden), self._cache_out(kv)         # [1, batch, vocab]

    def batch_hidden(self, input_embeds: Tensor, logit_positions: Tensor, paged_kv_cache: PagedKVCache):
        """batch_prefill's final (normed) hidden states instead of logits: what embeddings pool."""
        kv = self._cache(paged_kv_cache)
        hidden = op.take(self.model(input_embeds, kv), logit_positions, axis=1)   # [1, batch, hidden]
        return (hidden if hidden.dtype == "float32" else hidden.astype("float32")), self._cache_out(kv)

    def batch_decode(self, input_embeds: Tensor, paged_kv_cache: PagedKVCache):
        kv = self._cache(paged_kv_cache)
        return self._logits(self.model(input_embeds, kv)), self._cache_out(kv)  # [batch, 1, vocab]

    def batch_verify(self, input_embeds: Tensor, paged_kv_cache: PagedKVCache):
        kv = self._cache(paged_kv_cache)
        return self._logits(self.model(input_embeds, kv)), self._cache_out(kv)  # [1, seq, vocab]

    # -- the KV cache kiln owns (models/owned_kv.py) ----------------------------------------
    def own_kv_cache(self, page_size: int) -> None:
        """Attend over a KV cache kiln owns instead of TVM's (its pages and page tables inputs of the
        entry functions): after .to() and set_kv_dtype, before export."""
        c, first = self.config, self.attention[0]
        cache_rope = not (self.flags.learned_positions or self.rope_in_graph)
        if c.latent_attention() and cache_rope:
            raise ValueError("latent attention (MLA) whose RoPE the cache applies runs over TVM's paged KV cache "
                             "only (the cache kiln owns takes MLA without RoPE, Kimi Linear's)")
        layer_kv, sources = c.kv_layers() or ((), ())
        self.owned_layout = OwnedLayout(
            c.num_attention_heads, c.num_key_value_heads, c.head_dim, page_size, self.kv_dtype or self.dtype,
            tuple(a.window if a.kind == "sliding" else 0 for a in self.attention),
            {"theta": first.rope_theta, "scaling": first.rope_scaling or {}, "rotary_dim": c.rotary_dim}
            if cache_rope else None, self.flags.attn_logit_softcap, layer_kv, sources,
            tuple(c.alibi_slopes()) if self.flags.alibi else (), c.state_layers())

    def _cache(self, given):
        """The forward's KV cache: TVM's object as given, or the owned cache over the given pages and tables."""
        return given if self.owned_layout is None else OwnedKVCache(self.owned_layout, given)

    def _cache_out(self, kv):
        return kv if self.owned_layout is None else kv.outputs()

    def greedy_tokens(self, logits: Tensor) -> Tensor:
        """batch_decode's logits [batch, 1, vocab] -> each row's argmax [batch] int32: greedy
        decoding without copying the logits back. A large vocabulary is reduced in two kernels, each
        row's chunks first (see _argmax_chunks)."""
        vocab = int(logits.shape[-1])
        if vocab > 1 << 24:
            raise ValueError(f"greedy_tokens indexes the vocabulary in float32, exact below 2**24; "
                             f"this one has {vocab} entries")
        chunks = _argmax_chunks(vocab)
        if chunks == 1:
            return op.tensor_expr_op(_argmax_te, "greedy_argmax", [logits])
        winners = op.tensor_expr_op(lambda x: _chunk_argmax_te(x, chunks), "greedy_argmax_chunks", [logits])
        return op.tensor_expr_op(_argmax_of_chunks_te, "greedy_argmax", [winners])

    def sample_tokens(self, logits: Tensor, params: Tensor) -> Tensor:
        """batch_decode's logits [batch, 1, vocab] and per row (temperature, top_k, top_p, min_p, u)
        [batch, 5] -> each row's sampled token [batch] int32 (models/sampling.py): a sampled decode
        step without copying the logits back."""
        target = Target.current()
        gpu = target.kind.name != "llvm"
        lanes = lanes_for(int(target.attrs["max_num_threads"]) if "max_num_threads" in target.attrs else None)
        return op.tensor_ir_op(sample_kernel(int(logits.shape[-1]), gpu, lanes), "sample_tokens", [logits, params],
                               out=Tensor.placeholder([logits.shape[0]], "int32"))

    def create_paged_kv_cache(self, max_batch_size: tirx.Var, max_total_seq_len: tirx.Var,
                              prefill_chunk_size: tirx.Var, page_size: tirx.Var,
                              support_sliding_window: tirx.Var) -> PagedKVCache:
        c, first = self.config, self.attention[0]
        kinds = [a.kind for a in self.attention]
        windowed = self.window_mode == "per_sequence"
        return TIRPagedKVCache(
            attn_kind="mha" if set(kinds) == {"full"} or windowed
            else ["mha_sliding" if k == "sliding" else "mha" for k in kinds],
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
            # RoPE in the graph: the cache rotates nothing (keys are stored rotated; RoPE is relative, so a
            # sliding cache that moves them stays exact). Every layer sliding: TVM rotates inside attention.
            rope_mode=(RopeMode.NONE if self.flags.learned_positions or self.rope_in_graph
                       else RopeMode.INLINE if windowed else RopeMode.NORMAL),
            rope_scale=1,
            rope_theta=first.rope_theta,
            rope_scaling={} if self.rope_in_graph else first.rope_scaling or {},
            rope_ext_factors=relax.prim_value(0),  # only longrope uses it
            rotary_dim=c.rotary_dim,
            enable_disaggregation=False,
            dtype=self.kv_dtype or self.dtype,
            target=Target.current(),
            **({"layer_sliding_window_size": self.sliding_window} if self.sliding_window else {}),
        )


class PositionalStack(nn.Module):
    """The embedding, a family's own layers (each called with the cache, its index and the forward's positions)
    and a final norm: the stacks OwnedStackLM runs."""

    def __init__(self, c: DecoderConfig, layers: list[nn.Module], norm: str = "rms"):
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = Norm(c.hidden_size, c.norm_eps, norm)

    def forward(self, x: Tensor, kv) -> Tensor:
        b, s, _ = x.shape
        positions = kv.get_query_positions(b * s)
        for i, layer in enumerate(self.layers):
            x = layer(x, kv, i, positions)
        return self.norm(x)


def head_weights(c: DecoderConfig, prefix: str = "model", embed: str = "embed_tokens", norm: str = "norm") -> dict:
    """The weight map's embedding, final norm and (untied) head, the checkpoint's `embed` and `norm` under
    `prefix`."""
    m = {"model.embed_tokens.weight": [f"{prefix}.{embed}.weight"], "model.norm.weight": [f"{prefix}.{norm}.weight"]}
    if not c.tie_word_embeddings:
        m["lm_head.weight"] = ["lm_head.weight"]
    return m


class OwnedStackLM(CausalLM):
    """CausalLM's entry functions over a family's own layer stack (STACK), its KV cache always the one kiln owns:
    OWNED_ONLY says why TVM's cannot hold it."""

    STACK: ClassVar[type]
    OWNED_ONLY: ClassVar[str]

    def __init__(self, config: DecoderConfig):
        nn.Module.__init__(self)                    # not CausalLM's: that would build the plain decoder stack
        self.config, self.flags = config, config.flags()
        self.attention = config.layer_attention()
        self.sliding_window = None
        self.rope_in_graph = True
        self.model = self.STACK(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.dtype = "float32"
        self.kv_dtype: str | None = None
        self.owned_layout = None

    def create_paged_kv_cache(self, *args):
        raise ValueError(f"{self.OWNED_ONLY}; it runs over the KV cache kiln owns only")


def sliding_window(layers: tuple[LayerAttention, ...]) -> int | None:
    """The one window size of the sliding-window layers, None without any (the KV cache takes one)."""
    windows = {a.window for a in layers if a.kind == "sliding"}
    if len(windows) > 1:
        raise ValueError(f"sliding-window layers use {len(windows)} window sizes; the KV cache takes one")
    return windows.pop() if windows else None


def _argmax_chunks(vocab: int) -> int:
    """How many chunks greedy_tokens splits each row's vocabulary into (1: one kernel reduces the row).

    One thread block per row read an 8B model's 128,256 logits in 100 us of a 7 ms decode step on an
    H100 (CUPTI, issue 10): 256 threads, 501 dependent loads each, on one of 132 SMs. Chunks of at
    least 1,024 logits, up to 64 per row, each get a block; a second kernel reduces their winners.
    A power of two where one divides the vocabulary, else its largest divisor up to 64 (GPT-2's 50,257:
    29 chunks of 1,733; the CPU's kernel takes sizes off its 16 lanes with a scalar tail)."""
    powers_of_two = (64, 32, 16, 8, 4, 2)
    for chunks in (*powers_of_two, *(c for c in range(63, 2, -1) if c not in powers_of_two)):
        if vocab % chunks == 0 and vocab // chunks >= 1024:
            return chunks
    return 1


def _argmax_reducer():
    """The (index, value) argmax reducer: the larger value wins, the smaller index among equal ones;
    identity (-1, the lowest float)."""
    def combine(lhs, rhs):
        (i, v), (j, w) = lhs, rhs
        first = tirx.Or(v > w, tirx.And(v == w, i < j))
        return tirx.Select(first, i, j), tirx.Select(v > w, v, w)

    def identity(i_dtype, v_dtype):
        return tirx.const(-1, i_dtype), tirx.min_value(v_dtype)

    return te.comm_reducer(combine, identity, name="argmax")


def _token_of(index: te.Tensor) -> te.Tensor:
    """The float32 index a row's reduction kept -> int32 token; -1 (nothing beat the lowest float) -> 0."""
    return te.compute(index.shape, lambda r: tirx.Cast("int32", tirx.max(index[r], tirx.const(0.0, "float32"))),
                      name="argmax")


def _chunk_argmax_te(x: te.Tensor, chunks: int) -> te.Tensor:
    """[b, 1, vocab] -> each chunk's winner [b, chunks, 2]: (first index of its maximum, as float32; the
    maximum). One output written by a spatial stage, so the GPU rules give the reduction a thread
    block per chunk (a reduction writing two outputs fell to one thread per chunk)."""
    b, _, vocab = x.shape
    size = tirx.const(int(vocab) // chunks, vocab.ty)                  # every extent in the vocabulary's int type
    j = te.reduce_axis((tirx.const(0, vocab.ty), size), name="j")
    index, value = te.compute((b, tirx.const(chunks, vocab.ty)), lambda r, c: _argmax_reducer()(
        (tirx.Cast("float32", c * size + j), x[r, 0, c * size + j]), axis=j), name="argmax_chunk")
    return te.compute((b, tirx.const(chunks, vocab.ty), tirx.const(2, vocab.ty)),
                      lambda r, c, t: tirx.Select(t == 0, index[r, c], value[r, c]), name="winner")


def _argmax_of_chunks_te(winners: te.Tensor) -> te.Tensor:
    """Chunk winners [b, chunks, 2] -> [b] int32: the first chunk holding the row's maximum gives its index."""
    b, chunks, _ = winners.shape
    c = te.reduce_axis((0, chunks), name="c")
    best, _ = te.compute((b,), lambda r: _argmax_reducer()((winners[r, c, 0], winners[r, c, 1]), axis=c),
                         name="argmax_red")
    return _token_of(best)


def _argmax_te(x: te.Tensor) -> te.Tensor:
    """[b, 1, vocab] float32 -> [b] int32, the first of equal maxima (numpy's argmax, an all -inf
    row included).

    Its own reduction rather than relax's argmax, which carries the index in int64, a type WGSL
    lacks. The index rides as a float32 (exact below 2**24, far above any vocabulary): an int32
    index cast from the int64 axis gets its comparison rewritten by TVM's simplifier into a form
    its cross-thread reduction no longer recognises, and an int32 axis breaks that reduction's
    loop conditions. The reducer is TOPI's argmax in form and identity (-1, the lowest float); a
    row none of whose values beats the lowest float (all -inf) keeps -1 and becomes 0, as in numpy."""
    b, _, vocab = x.shape
    k = te.reduce_axis((0, vocab), name="k")
    index, _ = te.compute((b,), lambda r: _argmax_reducer()((tirx.Cast("float32", k), x[r, 0, k]), axis=k),
                          name="argmax_red")
    return _token_of(index)      # the (index, value) pair stays inside the kernel; a spatial stage writes the index


def _last_token(hidden: Tensor) -> Tensor:
    """hidden[:, -1:, :] as a TE op (the sequence length is symbolic)."""
    def compute(x: te.Tensor):
        b, s, d = x.shape
        return te.compute((b, 1, d), lambda i, _, k: x[i, s - 1, k], name="last_token")
    return op.tensor_expr_op(compute, "last_token", [hidden])


# ----------------------------------------------------------------------------- weight maps


@dataclass(frozen=True)
class WeightSpec:
    """A parameter made from HF tensors: concatenated along axis 0, then `transform`ed (e.g. a
    Conv1D weight transposed to [out, in]). A plain list of names is a WeightSpec without transform."""

    hf_names: tuple[str, ...]
    transform: Callable[[np.ndarray], np.ndarray] | None = None
    apart: bool = False                     # transform takes the tensors as a list (shapes that do not
                                            # concatenate: gpt-oss's MXFP4 blocks and scales)


WeightMap = dict[str, "list[str] | WeightSpec"]


def rope_halves(c: DecoderConfig) -> Callable[[np.ndarray], np.ndarray]:
    """For a checkpoint whose RoPE rotates adjacent pairs (2i, 2i+1) (GLM, ERNIE 4.5, Helium, Cohere):
    q/k/v rows (weights or biases, q then k then v) with each q and k head's rotary dims reordered to
    kiln's pairs (i, i + rotary/2): evens first, then odds. Pair i keeps its frequency, and q and k
    permuted alike leave every score q.k as it was, so the model computes exactly the checkpoint's."""
    d, head = c.head_dim, _halves_order(c)
    rotated = c.num_attention_heads + c.num_key_value_heads            # q and k heads; v's rows stay
    values = np.arange(rotated * d, (rotated + c.num_key_value_heads) * d)
    order = np.concatenate([h * d + head for h in range(rotated)] + [values])
    return lambda rows: rows[order]


def head_dims_halves(c: DecoderConfig) -> Callable[[np.ndarray], np.ndarray]:
    """A q/k norm's weight (one head's [head_dim], each head's [heads, head_dim], or all heads' flat) with each
    head's dims in rope_halves' order: the norm acts on q and k after their rows were reordered."""
    d, head = c.head_dim, _halves_order(c)
    return lambda w: w.reshape(-1, d)[:, head].reshape(w.shape)


def _halves_order(c: DecoderConfig) -> np.ndarray:
    """One head's dims as kiln's RoPE pairs them: the rotary dims' evens, then odds, then the rest."""
    return np.concatenate([pair_halves(c.rotary_dim), np.arange(c.rotary_dim, c.head_dim)])


def weight_spec(entry: "list[str] | WeightSpec") -> WeightSpec:
    """A weight-map entry as a WeightSpec (a plain list of HF names has no transform)."""
    return entry if isinstance(entry, WeightSpec) else WeightSpec(tuple(entry))
# kiln's local names -> the HF names of a Llama-style checkpoint; families override entries.
LLAMA_NAMES = {
    "embed_tokens": "model.embed_tokens", "embed_positions": "model.embed_positions", "norm": "model.norm",
    "lm_head": "lm_head", "layer": "model.layers.{i}",
    "input_layernorm": "input_layernorm", "post_attention_layernorm": "post_attention_layernorm",
    "post_attn_norm": "post_attn_norm", "post_mlp_norm": "post_mlp_norm",
    "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj", "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm",
    "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj",
}


def prefixed_names(names: dict[str, str], prefix: str) -> dict[str, str]:
    """`names` with the decoder under `prefix` instead of "model" (a multimodal checkpoint's text model:
    model.language_model in transformers 5, language_model.model in 4, whose head is then
    language_model.lm_head)."""
    if prefix == "model":
        return names
    return dict(names, embed_tokens=f"{prefix}.embed_tokens", norm=f"{prefix}.norm", layer=f"{prefix}.layers.{{i}}",
                lm_head="language_model.lm_head" if prefix.startswith("language_model") else names["lm_head"])


def decoder_weight_map(c: DecoderConfig, names: dict[str, str] = LLAMA_NAMES) -> WeightMap:
    """kiln parameter name -> the HF tensor names (concatenated along axis 0) that make it."""
    f, n = c.flags(), names
    norm_parts = ("weight", "bias") if f.norm in BIASED_NORMS else () if f.norm in PARAMLESS_NORMS else ("weight",)
    m: WeightMap = {"model.embed_tokens.weight": [f"{n['embed_tokens']}.weight"]}
    if f.learned_positions:
        m["model.embed_positions.weight"] = [f"{n['embed_positions']}.weight"]
    m.update({f"model.norm.{p}": [f"{n['norm']}.{p}"] for p in norm_parts})
    if not c.tie_word_embeddings:
        parts = ("weight", "bias") if f.head_bias else ("weight",)
        m.update({f"lm_head.{p}": [f"{n['lm_head']}.{p}"] for p in parts})
    for i in range(c.num_hidden_layers):
        k, h = f"model.layers.{i}", n["layer"].format(i=i)
        norms = ["input_layernorm", "post_attention_layernorm"][:1 if f.shared_norm else 2] if f.pre_norms else []
        norms += ["post_attn_norm", "post_mlp_norm"] if f.sandwich_norms else []
        for norm in norms:
            m.update({f"{k}.{norm}.{p}": [f"{h}.{n[norm]}.{p}"] for p in norm_parts})
        qkv = [f"{h}.{n[x]}" for x in ("q_proj", "k_proj", "v_proj")]
        for p in ("weight", "bias") if f.qkv_bias else ("weight",):
            names = [f"{x}.{p}" for x in qkv]
            m[f"{k}.self_attn.qkv_proj.{p}"] = WeightSpec(tuple(names), rope_halves(c)) if c.ADJACENT_ROPE else names
        if f.qk_norm and (kind := f.qk_norm_kind or f.norm) not in PARAMLESS_NORMS:
            for x, p in ((x, p) for x in ("q_norm", "k_norm") for p in ("weight", "bias")[:2 if kind in BIASED_NORMS
                                                                                            else 1]):
                names = [f"{h}.{n[x]}.{p}"]
                m[f"{k}.self_attn.{x}.{p}"] = WeightSpec(tuple(names), head_dims_halves(c)) if c.ADJACENT_ROPE \
                    else names
        mlp = ("gate_proj", "up_proj") if f.gated_mlp else ("up_proj",)
        projs = {"self_attn.o_proj": ([n["o_proj"]], f.o_bias), "mlp.down_proj": ([n["down_proj"]], f.mlp_bias),
                 "mlp.gate_up_proj" if f.gated_mlp else "mlp.up_proj": ([n[x] for x in mlp], f.mlp_bias)}
        for param, (parts, bias) in projs.items():
            for p in ("weight", "bias") if bias else ("weight",):
                m[f"{k}.{param}.{p}"] = [f"{h}.{x}.{p}" for x in parts]
    return m
