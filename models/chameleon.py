"""Meta's Chameleon (ChameleonForConditionalGeneration; Anole): a Llama whose q and k are LayerNormed a head before
RoPE (over head_dim, each head with its own weight and bias, epsilon 1e-5), with, where `swin_norm` (Chameleon
30B), the norms after attention and MLP instead of before (x + n(attn(x))). Its vocabulary holds the image tokens its
VQ-VAE makes (`vocabulary_map`'s IMGIMG* names); its forward gives them the lowest logit (it generates text unless
told otherwise), and so does kiln's. The VQ-VAE (model.vqmodel) is not read: prompts are text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor

from .causal_lm import DECODER_FIELDS, LLAMA_NAMES, CausalLM, DecoderConfig, WeightMap, decoder_weight_map
from .config import ConfigField
from .layers import Flags

QK_NORM_EPS = 1e-5                          # ChameleonLayerNorm's, whatever rms_norm_eps is


@dataclass(frozen=True)
class ChameleonConfig(DecoderConfig):
    attention_bias: bool = False
    mlp_bias: bool = False
    swin_norm: bool = False
    image_tokens: tuple[int, ...] = ()

    ARCH: ClassVar[str] = "chameleon"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *DECODER_FIELDS, ConfigField("attention_bias", ("attention_bias",), default=False),
        ConfigField("mlp_bias", ("mlp_bias",), default=False),
        ConfigField("swin_norm", ("swin_norm",), default=False),
        ConfigField("image_tokens", ("vocabulary_map",), default=None))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if values["norm_eps"] != QK_NORM_EPS:
            raise ValueError(f"Chameleon with rms_norm_eps {values['norm_eps']} is not supported: its q/k norms' "
                             f"epsilon is {QK_NORM_EPS} and kiln gives a model's norms one (the released models')")
        images = sorted(int(i) for name, i in (values["image_tokens"] or {}).items() if name.startswith("IMGIMG"))
        notes.append(f"Chameleon's language model only: its VQ-VAE image tokenizer is not read (prompts are text); "
                     f"its {len(images)} image tokens get the lowest logit, as its forward gives them")
        return dict(values, image_tokens=tuple(images))

    def flags(self) -> Flags:
        return Flags(qk_norm=True, qk_norm_kind="layer", qk_norm_head_weights=True, qkv_bias=self.attention_bias,
                     o_bias=self.attention_bias, mlp_bias=self.mlp_bias, pre_norms=not self.swin_norm,
                     sandwich_norms=self.swin_norm)


class ChameleonForCausalLM(CausalLM):
    def _logits(self, hidden: Tensor) -> Tensor:
        logits = super()._logits(hidden)
        if not self.config.image_tokens:
            return logits
        lowest = np.zeros(self.config.vocab_size, np.float32)
        lowest[list(self.config.image_tokens)] = np.finfo(np.float32).min     # min + a logit rounds to min
        return logits + nn.Tensor.from_const(lowest)


def weight_map(c: ChameleonConfig) -> WeightMap:
    names = dict(LLAMA_NAMES, post_attn_norm="input_layernorm", post_mlp_norm="post_attention_layernorm") \
        if c.swin_norm else LLAMA_NAMES
    return decoder_weight_map(c, names)
