"""Baidu ERNIE 4.5 (dense, e.g. ERNIE-4.5-0.3B): a Llama whose RoPE rotates adjacent pairs of each
head's dims (kiln reorders the q and k rows as it loads them: causal_lm.rope_halves) and whose
projections all carry biases, or none (`use_bias`). ERNIE 4.5 MoE (ERNIE-4.5-21B-A3B, 300B-A47B) makes the
MLPs of every `moe_layer_interval`-th layer from `moe_layer_start_index` to `moe_layer_end_index` sparse
mixtures of `moe_num_experts` experts (models/moe.py): softmax scores, the top `moe_k` chosen with a
per-expert bias (`moe_statics`), renormalised by max(sum, `moe_norm_min`), beside `moe_num_shared_experts`
shared ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, CausalLM, DecoderConfig, WeightMap, WeightSpec, decoder_weight_map
from .config import ConfigField, fields_with, mrope_as_rope
from .layers import Flags
from .moe import MoESpec, moe_weight_map


@dataclass(frozen=True)
class Ernie4_5Config(DecoderConfig):
    use_bias: bool = False

    ARCH: ClassVar[str] = "ernie4_5"
    ADJACENT_ROPE: ClassVar[bool] = True
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("use_bias", ("use_bias",), default=False))

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.use_bias, o_bias=self.use_bias, mlp_bias=self.use_bias)


@dataclass(frozen=True)
class Ernie4_5MoeConfig(Ernie4_5Config):
    num_experts: int = 0
    top_k: int = 1
    moe_intermediate_size: int = 0
    shared_experts: int = 0
    moe_start: int = 1
    moe_end: int = -1
    moe_interval: int = 1
    norm_min: float = 1e-12

    ARCH: ClassVar[str] = "ernie4_5_moe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *Ernie4_5Config.FIELDS,
        ConfigField("num_experts", ("moe_num_experts", "num_experts")),
        ConfigField("top_k", ("moe_k", "num_experts_per_tok")),
        ConfigField("moe_intermediate_size", ("moe_intermediate_size",)),
        ConfigField("shared_experts", ("moe_num_shared_experts",), default=0),
        ConfigField("moe_start", ("moe_layer_start_index",), default=1),
        ConfigField("moe_end", ("moe_layer_end_index",), default=-1),
        ConfigField("moe_interval", ("moe_layer_interval",), default=1),
        ConfigField("norm_min", ("moe_norm_min",), default=1e-12))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        for f in ("num_experts", "moe_intermediate_size", "moe_start", "moe_end"):
            if isinstance(values[f], (list, tuple)):        # the vision-language models' per-modality lists
                raise ValueError(f"ERNIE 4.5 MoE with a list for {f} (a vision-language model's) is not supported; "
                                 "load a text model (ERNIE-4.5-21B-A3B / 300B-A47B)")
        end = values["num_hidden_layers"] - 1 if values["moe_end"] == -1 else values["moe_end"]
        return super().adapt(dict(values, moe_end=end), hf, notes)

    def layer_moe(self, layer: int) -> MoESpec | None:
        if (layer + 1) % self.moe_interval or not self.moe_start <= layer <= self.moe_end:
            return None
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size, True,
                       self.moe_intermediate_size * self.shared_experts, shared_gated=False, choice_bias=True,
                       norm_min=self.norm_min)


@dataclass(frozen=True)
class Ernie4_5VLMoeTextConfig(Ernie4_5MoeConfig):
    """ERNIE 4.5 VL's language model (transformers' ernie4_5_vl_moe_text): ERNIE 4.5 MoE whose sparse layers hold a
    text and a vision set of experts, each with its router and choice-bias row, beside the shared ones. A text
    token takes the text set (the first `moe_num_experts`, the first of each per-modality list: router
    `mlp.gate.weight` stored [hidden, experts], choice bias row 0), so on a text prompt the model is ERNIE 4.5 MoE
    over those; the vision set is not read. Sparse layers by `mlp_layer_types`; its M-RoPE turns a text prompt as
    RoPE does (models/config.py mrope_as_rope)."""

    ARCH: ClassVar[str] = "ernie4_5_vl_moe_text"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *Ernie4_5MoeConfig.FIELDS, ConfigField("mlp_layer_types", ("mlp_layer_types",), default=None))

    @classmethod
    def from_hf(cls, hf: dict):
        return super().from_hf(mrope_as_rope(hf))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        text = {f: v[0] if isinstance(v := values[f], (list, tuple)) else v
                for f in ("num_experts", "moe_intermediate_size", "moe_start", "moe_end")}
        values = dict(values, **text)
        if (kinds := values.pop("mlp_layer_types")) is not None:
            sparse = [i for i, kind in enumerate(kinds) if kind == "sparse"]
            if sparse and sparse != list(range(sparse[0], sparse[-1] + 1)):
                raise ValueError(f"ERNIE 4.5 VL with sparse layers {sparse} (mlp_layer_types) not one run is not "
                                 "supported; fix config.json")
            values.update(moe_start=sparse[0] if sparse else len(kinds), moe_end=sparse[-1] if sparse else -1,
                          moe_interval=1)
        return super().adapt(values, hf, notes)


Ernie4_5ForCausalLM = Ernie4_5MoeForCausalLM = Ernie4_5VLMoeTextForCausalLM = CausalLM
NAMES = dict(router="mlp.gate", expert="mlp.experts.{j}", gate="gate_proj", up="up_proj", down="down_proj",
             shared="mlp.shared_experts", choice_bias="mlp.moe_statics.e_score_correction_bias")


def weight_map(c: Ernie4_5Config) -> WeightMap:
    if not isinstance(c, Ernie4_5MoeConfig):
        return decoder_weight_map(c)
    m = moe_weight_map(c, NAMES)
    vl = isinstance(c, Ernie4_5VLMoeTextConfig)
    for key, entry in m.items():            # moe_statics holds [1, experts]: one row (VL: [text; vision])
        if key.endswith(".choice_bias"):
            m[key] = WeightSpec(tuple(entry), (lambda b: b[0]) if vl else (lambda b: b.reshape(-1)))
        elif key.endswith(".router") and vl:    # the text router, stored [hidden, experts]
            m[key] = WeightSpec(tuple(entry), lambda w: w.T)
    return m
