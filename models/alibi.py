"""Decoders positioned by ALiBi instead of RoPE: each head adds slope_h * (j - p) to the score of the key at
position j for the query at p (Flags.alibi; over the KV cache kiln owns, targets/owned_kv.py):

    bloom   BLOOM / BLOOMZ: the embeddings LayerNormed (word_embeddings_layernorm), fused query_key_value with
            each head's q, k, v rows together (kiln's order: every q, then k, then v), LayerNorms and biases
            everywhere, a tanh-GELU MLP 4x wide, the head tied; slopes by the closest power of two of the
            heads, the rest interleaved from the next (build_alibi_tensor)
    mpt     MPT: Wqkv as q, k, v, no biases, LayerNorms without bias, an exact-GELU MLP expansion_ratio wide,
            clip_qkv, softmax_scale, the head tied; slopes 2^(-alibi_bias_max (h + 1) / n) over the next power
            of two n, odd ones first where the heads are fewer (build_mpt_alibi_tensor)
    baichuan Baichuan / Baichuan 2 (their own code, BaichuanForCausalLM): Llama's layers with q, k, v stored as one
            W_pack; the 13B models positioned by ALiBi (BLOOM's slopes), the 7B ones by RoPE (Baichuan-7B's
            BaiChuanForCausalLM, and hidden_size 4096: vLLM's rule, as config.json says neither); Baichuan 2 (its
            125,696-token vocabulary) normalises each row of its head at inference (NormHead), so it is read so

BLOOM adds slope * j (the key's position) where MPT adds slope * (j - p): a constant a row apart, which the
softmax removes. Neither has a trained context length in its config where BLOOM's is absent: 2048 tokens then
(BLOOM's training sequence), with a note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .causal_lm import (DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, LayerAttention, WeightMap,
                        WeightSpec, decoder_weight_map)
from .config import ConfigField, fields_with
from .gpt2 import CONV1D, _transposed
from .gpt2 import NAMES as GPT2_NAMES
from .layers import Flags

BLOOM_CONTEXT = 2048                        # BLOOM's training sequence length, where config.json names none


@dataclass(frozen=True)
class AlibiConfig(DecoderConfig):
    """What ALiBi decoders share: no RoPE on any layer, the slopes a family's."""

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return tuple(LayerAttention("full", rope=False) for _ in range(self.num_hidden_layers))

    def alibi_slopes(self) -> np.ndarray:
        raise NotImplementedError


def closest_power_slopes(n: int) -> np.ndarray:
    """ALiBi's slopes for n heads as BLOOM (build_alibi_tensor) and Baichuan (_get_interleave) compute them: by the
    closest power of two of the heads, the rest interleaved from the next; float32."""
    closest = 2 ** math.floor(math.log2(n))
    base = np.float32(2 ** (-(2 ** -(math.log2(closest) - 3))))
    slopes = base ** np.arange(1, 1 + closest, dtype=np.float32)
    if closest != n:
        extra = np.float32(2 ** (-(2 ** -(math.log2(2 * closest) - 3))))
        more = min(closest, n - closest)
        slopes = np.concatenate([slopes, extra ** np.arange(1, 1 + 2 * more, 2, dtype=np.float32)])
    return slopes.astype(np.float32)


@dataclass(frozen=True)
class BloomConfig(AlibiConfig):
    ARCH: ClassVar[str] = "bloom"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("hidden_size", ("hidden_size", "n_embed")),
        ConfigField("intermediate_size", ("intermediate_size",), default=None),
        ConfigField("context_window_size", ("max_position_embeddings", "seq_length"), default=None),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("apply_residual_connection_post_layernorm"):
            raise ValueError("BLOOM with apply_residual_connection_post_layernorm is not supported (the released "
                             "models leave it false); fix config.json")
        if values["context_window_size"] is None:
            notes.append(f"config.json names no context length: {BLOOM_CONTEXT} tokens, BLOOM's training sequence "
                         "(ALiBi runs past it, untrained)")
            values = dict(values, context_window_size=BLOOM_CONTEXT)
        return dict(values, intermediate_size=4 * values["hidden_size"])

    def flags(self) -> Flags:
        return Flags(norm="layer", activation="gelu_tanh", gated_mlp=False, qkv_bias=True, o_bias=True,
                     mlp_bias=True, embed_norm=True, alibi=True)

    def alibi_slopes(self) -> np.ndarray:
        """transformers' build_alibi_tensor's slopes, in float32 as it computes them."""
        return closest_power_slopes(self.num_attention_heads)


@dataclass(frozen=True)
class MptConfig(AlibiConfig):
    clip_qkv: float | None = None
    softmax_scale: float | None = None
    alibi_bias_max: float = 8.0

    ARCH: ClassVar[str] = "mpt"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("num_hidden_layers", ("n_layers", "num_hidden_layers")),
        ConfigField("num_attention_heads", ("n_heads", "num_attention_heads")),
        ConfigField("num_key_value_heads", ("n_heads", "num_attention_heads")),
        ConfigField("context_window_size", ("max_seq_len", "max_position_embeddings")),
        ConfigField("intermediate_size", ("intermediate_size",), default=None),
        ConfigField("norm_eps", ("layer_norm_epsilon",), default=1e-5),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        attn = hf.get("attn_config") or {}
        refused = [f"{key} {attn[key]!r}" for key, fine in (("alibi", True), ("qk_ln", False), ("prefix_lm", False),
                                                            ("attn_uses_sequence_id", False))
                   if key in attn and attn[key] != fine]
        refused += [f"{key} {hf[key]!r}" for key, fine in (("no_bias", True), ("logit_scale", None),
                                                           ("embedding_fraction", 1.0))
                    if key in hf and hf[key] != fine]
        if refused:
            raise ValueError(f"MPT with {', '.join(refused)} is not supported (kiln runs ALiBi, no biases, no q/k "
                             "norms, a causal mask); fix config.json")
        return dict(values, intermediate_size=int(hf.get("expansion_ratio", 4) * values["hidden_size"]),
                    clip_qkv=attn.get("clip_qkv"), softmax_scale=attn.get("softmax_scale"),
                    alibi_bias_max=float(attn.get("alibi_bias_max", 8)))

    def flags(self) -> Flags:
        return Flags(norm="layer_nobias", activation="gelu", gated_mlp=False, clip_qkv=self.clip_qkv,
                     attn_scale=self.softmax_scale, alibi=True)

    def alibi_slopes(self) -> np.ndarray:
        return max_bias_slopes(self.num_attention_heads, self.alibi_bias_max)


def max_bias_slopes(n: int, max_bias: float) -> np.ndarray:
    """ALiBi's slopes for n heads of a maximum bias (transformers' build_mpt_alibi_tensor's, llama.cpp's
    max_alibi_bias): 2^(-max_bias (h + 1) / w) over the next power of two w, odd ones first where the heads are fewer;
    float32, as MPT computes them."""
    wide = 2 ** math.ceil(math.log2(n))
    powers = np.arange(1, wide + 1, dtype=np.float32) * np.float32(max_bias / wide)
    slopes = (np.float32(1.0) / np.power(np.float32(2.0), powers)).astype(np.float32)
    if wide != n:
        slopes = np.concatenate([slopes[1::2], slopes[::2]])[:n]
    return slopes


@dataclass(frozen=True)
class BaichuanConfig(AlibiConfig):
    alibi: bool = True
    norm_head: bool = False
    split_qkv: bool = False                 # llama.cpp's layout (the GGUF reader's): q, k and v apart

    ARCH: ClassVar[str] = "baichuan"
    BAICHUAN2_VOCAB: ClassVar[int] = 125696
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("context_window_size", ("max_position_embeddings", "model_max_length")),
        ConfigField("split_qkv", ("kiln_split_qkv",), default=False))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        rope = "BaiChuanForCausalLM" in (hf.get("architectures") or []) or values["hidden_size"] == 4096
        norm_head = values["vocab_size"] == cls.BAICHUAN2_VOCAB
        notes.append(f"read as Baichuan{' 2' if norm_head else ''}'s {'7B' if rope else '13B'} form: "
                     f"{'RoPE' if rope else 'ALiBi'}{', its head rows normalised (NormHead)' if norm_head else ''}")
        return dict(values, alibi=not rope, norm_head=norm_head)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return super().layer_attention() if self.alibi else DecoderConfig.layer_attention(self)

    def flags(self) -> Flags:
        return Flags(alibi=self.alibi)

    def alibi_slopes(self) -> np.ndarray:
        return closest_power_slopes(self.num_attention_heads)


@dataclass(frozen=True)
class JaisConfig(AlibiConfig):
    """JAIS (its own code, JAISLMHeadModel; llama.cpp's jais GGUFs): GPT-2's layers (LayerNorms, biases, Conv1D
    weights stored [in, out]) with a SwiGLU MLP (c_fc2 the gate, c_fc the up), ALiBi of max bias alibi_bias_max (MPT's
    slopes), muP's scales: the embeddings times embeddings_scale, the logits times width_scale, scores over head_dim
    (not its root) where scale_qk_dot_by_d."""

    embeddings_scale: float = 1.0
    width_scale: float = 1.0
    scale_qk_dot_by_d: bool = True
    alibi_bias_max: float = 8.0

    ARCH: ClassVar[str] = "jais"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("norm_eps", ("layer_norm_epsilon", "rms_norm_eps"), default=1e-5),
        ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("embeddings_scale", ("embeddings_scale", "mup_embeddings_scale"), default=1.0),
        ConfigField("width_scale", ("width_scale",), default=None),
        ConfigField("scale_qk_dot_by_d", ("scale_qk_dot_by_d", "mup_scale_qk_dot_by_d"), default=True),
        ConfigField("alibi_bias_max", ("kiln_alibi_bias_max",), default=8.0))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        refused = [f"{k} {hf[k]!r}" for k, fine in (("position_embedding_type", "alibi"),
                                                    ("activation_function", "swiglu")) if hf.get(k, fine) != fine]
        if refused:
            raise ValueError(f"jais with {', '.join(refused)} is not supported (kiln runs its ALiBi, SwiGLU form); "
                             "fix config.json")
        width = values["width_scale"]
        if width is None:           # muP's output scale: mup_output_alpha x mup_width_scale
            width = hf.get("mup_output_alpha", 1.0) * hf.get("mup_width_scale", 1.0)
        return dict(values, width_scale=float(width), embeddings_scale=float(values["embeddings_scale"]))

    def flags(self) -> Flags:
        d = self.hidden_size // self.num_attention_heads
        return Flags(norm="layer", activation="silu", qkv_bias=True, o_bias=True, mlp_bias=True, alibi=True,
                     embed_scale=self.embeddings_scale if self.embeddings_scale != 1.0 else None,
                     logit_divisor=1.0 / self.width_scale if self.width_scale != 1.0 else None,
                     attn_scale=1.0 / d if self.scale_qk_dot_by_d else None)

    def alibi_slopes(self) -> np.ndarray:
        return max_bias_slopes(self.num_attention_heads, self.alibi_bias_max)


BloomForCausalLM = MptForCausalLM = BaichuanForCausalLM = JaisForCausalLM = CausalLM

JAIS_NAMES = dict(GPT2_NAMES, gate_proj="mlp.c_fc2", up_proj="mlp.c_fc", o_proj="attn.c_proj",
                  down_proj="mlp.c_proj")
BLOOM_NAMES = dict(LLAMA_NAMES, embed_tokens="transformer.word_embeddings", norm="transformer.ln_f",
                   lm_head="lm_head", layer="transformer.h.{i}", o_proj="self_attention.dense",
                   up_proj="mlp.dense_h_to_4h", down_proj="mlp.dense_4h_to_h")
MPT_NAMES = dict(LLAMA_NAMES, embed_tokens="transformer.wte", norm="transformer.norm_f", lm_head="lm_head",
                 layer="transformer.blocks.{i}", input_layernorm="norm_1", post_attention_layernorm="norm_2",
                 o_proj="attn.out_proj", up_proj="ffn.up_proj", down_proj="ffn.down_proj")


def _by_head(heads: int):
    """BLOOM's query_key_value rows ([heads, q k v, head_dim]) in kiln's order: every q, then every k, then v."""
    def reorder(rows: np.ndarray) -> np.ndarray:
        grouped = rows.reshape(heads, 3, -1, *rows.shape[1:])
        return np.concatenate([grouped[:, i].reshape(-1, *rows.shape[1:]) for i in range(3)], axis=0)
    return reorder


def weight_map(c: AlibiConfig) -> WeightMap:
    if isinstance(c, BaichuanConfig):
        return _baichuan_weight_map(c)
    if isinstance(c, JaisConfig):
        return _jais_weight_map(c)
    bloom = isinstance(c, BloomConfig)
    m = decoder_weight_map(c, BLOOM_NAMES if bloom else MPT_NAMES)
    for i in range(c.num_hidden_layers):
        k = f"model.layers.{i}.self_attn.qkv_proj"
        if bloom:
            for p in ("weight", "bias"):
                m[f"{k}.{p}"] = WeightSpec((f"transformer.h.{i}.self_attention.query_key_value.{p}",),
                                           _by_head(c.num_attention_heads))
        else:
            m[f"{k}.weight"] = [f"transformer.blocks.{i}.attn.Wqkv.weight"]
    if bloom:
        for p in ("weight", "bias"):
            m[f"model.embed_norm.{p}"] = [f"transformer.word_embeddings_layernorm.{p}"]
    return m


def _jais_weight_map(c: JaisConfig) -> WeightMap:
    """GPT-2's weight map (its names, its Conv1D weights [in, out] transposed) with the SwiGLU's gate (c_fc2) rows
    before its up's (c_fc)."""
    m = decoder_weight_map(c, JAIS_NAMES)
    for i in range(c.num_hidden_layers):
        m[f"model.layers.{i}.self_attn.qkv_proj.bias"] = [f"transformer.h.{i}.attn.c_attn.bias"]
        for param, conv in CONV1D.items():
            if param != "mlp.up_proj":
                m[f"model.layers.{i}.{param}.weight"] = WeightSpec((f"transformer.h.{i}.{conv}.weight",), _transposed)
        m[f"model.layers.{i}.mlp.gate_up_proj.weight"] = WeightSpec(
            tuple(f"transformer.h.{i}.mlp.{x}.weight" for x in ("c_fc2", "c_fc")),
            lambda ws: np.concatenate([_transposed(w) for w in ws]), apart=True)
    return m


def _baichuan_weight_map(c: BaichuanConfig) -> WeightMap:
    """Llama's names, q, k and v as W_pack's rows (kiln's order); Baichuan 2's head rows normalised as its NormHead
    does at inference (F.normalize: w / max(|w|, 1e-12))."""
    m = decoder_weight_map(c)
    for i in range(c.num_hidden_layers) if not c.split_qkv else ():
        m[f"model.layers.{i}.self_attn.qkv_proj.weight"] = [f"model.layers.{i}.self_attn.W_pack.weight"]
    if c.norm_head:
        m["lm_head.weight"] = WeightSpec(("lm_head.weight",), _normalized_rows)
    return m


def _normalized_rows(w: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(w.astype(np.float32), axis=1, keepdims=True)
    return (w.astype(np.float32) / np.maximum(norms, np.float32(1e-12))).astype(w.dtype)
