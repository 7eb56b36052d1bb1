"""Every non-default flag of the shared layers (models/layers.py Flags), checked against
transformers: three families defined here, each a config mapping, its flags and a weight map on
the causal-LM base (what a family file in models/ holds), registered for the test only.

    QK norm                              -> Qwen3
    (1+w) RMSNorm, tanh-GELU gating,     -> Gemma 2 (attention soft-capping off: TVM's paged
    sandwich norms, embedding scale,        attention cannot express it, and the flag refuses)
    final-logit soft-capping, query_pre_attn_scalar
    LayerNorm, learned positions (no     -> GPT-2
    RoPE), non-gated MLP, biases on every
    projection, a weight transform (Conv1D [in, out] -> [out, in])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import torch

import kiln
from kiln.models import registry
from kiln.models.causal_lm import (DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, WeightSpec,
                                   decoder_weight_map)
from kiln.models.config import ConfigField
from kiln.models.layers import Flags
from tiny_models import assert_prefill_and_decode_match, write_tokenizer

pytestmark = pytest.mark.numerics
TOL = 1e-4
IDS = np.random.default_rng(5).integers(0, 512, size=19).tolist()
SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2)


@dataclass(frozen=True)
class Qwen3Like(DecoderConfig):
    ARCH: ClassVar[str] = "qwen3"

    def flags(self) -> Flags:
        return Flags(qk_norm=True)


@dataclass(frozen=True)
class Gemma2Like(DecoderConfig):
    query_pre_attn_scalar: float = 0.0
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None

    ARCH: ClassVar[str] = "gemma2"
    FIELDS: ClassVar = (*DECODER_FIELDS, ConfigField("query_pre_attn_scalar", ("query_pre_attn_scalar",)),
                        ConfigField("final_logit_softcapping", ("final_logit_softcapping",), default=None),
                        ConfigField("attn_logit_softcapping", ("attn_logit_softcapping",), default=None))

    def flags(self) -> Flags:
        return Flags(norm="rms_1p", activation="gelu_tanh", sandwich_norms=True, embed_scale=self.hidden_size ** 0.5,
                     final_logit_softcap=self.final_logit_softcapping, attn_logit_softcap=self.attn_logit_softcapping,
                     query_pre_attn_scalar=self.query_pre_attn_scalar)


GEMMA2_NAMES = dict(LLAMA_NAMES, post_attention_layernorm="pre_feedforward_layernorm",
                    post_attn_norm="post_attention_layernorm", post_mlp_norm="post_feedforward_layernorm")


@dataclass(frozen=True)
class GPT2Like(DecoderConfig):
    ARCH: ClassVar[str] = "gpt2"
    FIELDS: ClassVar = tuple(ConfigField("intermediate_size", ("n_inner",), default=None)
                             if f.name == "intermediate_size" else f for f in DECODER_FIELDS)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        return dict(values, intermediate_size=values["intermediate_size"] or 4 * values["hidden_size"],
                    tie_word_embeddings=True)

    def flags(self) -> Flags:
        return Flags(norm="layer", activation="gelu_tanh", gated_mlp=False, qkv_bias=True, o_bias=True,
                     mlp_bias=True, learned_positions=True)


def _transposed(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.T)


def gpt2_weight_map(c: GPT2Like) -> dict:
    names = dict(LLAMA_NAMES, embed_tokens="transformer.wte", embed_positions="transformer.wpe",
                 norm="transformer.ln_f", layer="transformer.h.{i}", input_layernorm="ln_1",
                 post_attention_layernorm="ln_2")
    m = decoder_weight_map(c, names)
    for i in range(c.num_hidden_layers):                 # Conv1D weights are [in, out]: transposed
        k, h = f"model.layers.{i}", f"transformer.h.{i}"
        for param, conv in (("self_attn.qkv_proj", "attn.c_attn"), ("self_attn.o_proj", "attn.c_proj"),
                            ("mlp.up_proj", "mlp.c_fc"), ("mlp.down_proj", "mlp.c_proj")):
            m[f"{k}.{param}.weight"] = WeightSpec((f"{h}.{conv}.weight",), _transposed)
            m[f"{k}.{param}.bias"] = [f"{h}.{conv}.bias"]
    return m


FAMILIES = {
    "qwen3": ("Qwen3", Qwen3Like, lambda c: decoder_weight_map(c), dict(head_dim=24)),
    "gemma2": ("Gemma2", Gemma2Like, lambda c: decoder_weight_map(c, GEMMA2_NAMES),
               dict(head_dim=16, query_pre_attn_scalar=24, final_logit_softcapping=3.0, attn_logit_softcapping=None,
                    sliding_window=4096, hidden_activation="gelu_pytorch_tanh")),
    "gpt2": ("GPT2", GPT2Like, gpt2_weight_map,
             dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, n_inner=None, activation_function="gelu_new")),
}


def _write(family: str, dest):
    import transformers
    hf_name, _, _, overrides = FAMILIES[family]
    cfg = dict(SMALL, **overrides) if family != "gpt2" else dict(vocab_size=512, eos_token_id=2, **overrides)
    torch.manual_seed(0)
    model = getattr(transformers, f"{hf_name}LMHeadModel" if family == "gpt2" else f"{hf_name}ForCausalLM")(
        getattr(transformers, f"{hf_name}Config")(**cfg, attn_implementation="eager"))
    with torch.no_grad():                                  # widen the random init so the tolerance bites
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.08 if p.ndim == 2 else 0.3).add_(1.0 if p.ndim == 1 and "bias" not in name else 0.0)
    dest.mkdir(parents=True)
    model.save_pretrained(dest)
    write_tokenizer(dest, 512)
    return model.eval()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_flags_match_transformers(family, tmp_path, monkeypatch):
    hf_name, config_cls, weight_map, _ = FAMILIES[family]
    arch_name = f"{hf_name}LMHeadModel" if family == "gpt2" else f"{hf_name}ForCausalLM"
    monkeypatch.setitem(registry.ARCHITECTURES, family, registry.Architecture(
        family, (arch_name,), (family,), config_cls, CausalLM, weight_map))
    ref = _write(family, tmp_path / "hf")
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art")
    assert_prefill_and_decode_match(art, ref, IDS, TOL)


def test_attention_softcap_is_refused_not_ignored():
    with pytest.raises(ValueError, match="attention logit soft-capping is not supported"):
        Flags(attn_logit_softcap=50.0)


def test_per_layer_rope_is_refused():
    from kiln.models.causal_lm import LayerAttention

    @dataclass(frozen=True)
    class TwoRopes(Qwen3Like):
        def layer_attention(self):
            return (LayerAttention("full", None, 10000.0), LayerAttention("sliding", 64, 1e6))

    c = TwoRopes.from_hf(SMALL)
    with pytest.raises(ValueError, match="per-layer RoPE bases are not supported yet"):
        CausalLM(c)
