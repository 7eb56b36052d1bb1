"""Cohere Command-R / Aya (`cohere`) and Command R7B / Aya Vision's text model (`cohere2`): attention and
MLP side by side behind one LayerNorm without a bias (x + attn(n(x)) + mlp(n(x))), the logits scaled
by `logit_scale`, a tied head, and RoPE rotating adjacent pairs of dims (kiln reorders the q and k rows
as it loads them: causal_lm.rope_halves). Command R7B's layers are 3 sliding-window ones with RoPE to
each global one without any (`layer_types`, else every `sliding_window_pattern`-th is global); Cohere's MoE
(`cohere2_moe`) adds experts to them (Cohere2MoeConfig).
Command-R+ (`use_qk_norm`) LayerNorms q and k per head before RoPE, each head with its own weight."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import DECODER_FIELDS, CausalLM, DecoderConfig, LayerAttention, WeightMap, WeightSpec, \
    decoder_weight_map, rope_on_sliding_only
from .config import ConfigField, dense_layers, fields_with, layer_types, mrope_as_rope, window_of
from .layers import Flags
from .moe import MoESpec, moe_weight_map


@dataclass(frozen=True)
class CohereConfig(DecoderConfig):
    logit_scale: float = 0.0625
    attention_bias: bool = False            # q, k, v and o
    use_qk_norm: bool = False

    ARCH: ClassVar[str] = "cohere"
    ADJACENT_ROPE: ClassVar[bool] = True
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        DECODER_FIELDS, ConfigField("tie_word_embeddings", ("tie_word_embeddings",), default=True),
        ConfigField("logit_scale", ("logit_scale",), default=0.0625),
        ConfigField("attention_bias", ("attention_bias",), default=False),
        ConfigField("use_qk_norm", ("use_qk_norm",), default=False))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if not values["logit_scale"]:
            raise ValueError(f"logit_scale {values['logit_scale']!r} would zero every logit; fix config.json")
        return values

    def flags(self) -> Flags:
        return Flags(norm="layer_nobias", qkv_bias=self.attention_bias, o_bias=self.attention_bias,
                     parallel_residual=True, shared_norm=True, logit_divisor=1.0 / self.logit_scale,
                     qk_norm=self.use_qk_norm, qk_norm_head_weights=True)


@dataclass(frozen=True)
class Cohere2Config(CohereConfig):
    sliding_window: int | None = 4096
    layer_types: tuple[str, ...] = ()

    ARCH: ClassVar[str] = "cohere2"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *CohereConfig.FIELDS, ConfigField("sliding_window", ("sliding_window",), default=4096),
        ConfigField("layer_types", ("layer_types",), default=None))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        types = layer_types(values["layer_types"], values["num_hidden_layers"], hf, pattern=4)
        # transformers' Cohere2 has no q/k norms, whatever config.json says
        return super().adapt(dict(values, layer_types=types, use_qk_norm=False), hf, notes)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        """Sliding layers rotate q and k; global ones attend with no positions at all."""
        return rope_on_sliding_only(self, window_of(vars(self)) or 0)


@dataclass(frozen=True)
class CohereCompassTextConfig(Cohere2Config):
    """Cohere Compass's language model (cohere_compass_text, alone or inside CohereCompassForConditionalGeneration):
    Command R7B's layers with RoPE on halves of each head (not pairs), its RoPE given per layer kind (rope_parameters:
    the sliding layers' with M-RoPE sections, which turn a text prompt as RoPE does; the full layers' null: no
    positions), logit_scale unset as 1."""

    ARCH: ClassVar[str] = "cohere_compass_text"
    ADJACENT_ROPE: ClassVar[bool] = False

    @classmethod
    def from_hf(cls, hf: dict) -> "CohereCompassTextConfig":
        rope = hf.get("rope_parameters")
        if isinstance(rope, dict) and {"sliding_attention", "full_attention"} & rope.keys():
            if rope.get("full_attention") is not None or not rope.get("sliding_attention"):
                raise ValueError("Cohere Compass with RoPE on its full-attention layers, or none on its sliding ones "
                                 "(rope_parameters), is not supported: kiln runs Command R7B's layout")
            hf = dict(hf, rope_parameters=mrope_as_rope({"rope_parameters": rope["sliding_attention"]})[
                "rope_parameters"])
        return super().from_hf(dict(hf, logit_scale=1.0) if hf.get("logit_scale") is None else hf)


@dataclass(frozen=True)
class Cohere2MoeConfig(Cohere2Config):
    """Cohere's MoE (`cohere2_moe`): Command R7B's layers with a sparse MLP (the top k of the router's logits,
    weighed by their softmax, or by their sigmoid, normalised where norm_topk_prob), an ungated shared MLP of
    num_shared_experts experts' width summed or averaged with the experts (`shared_expert_combination_strategy`:
    "average" halves both: the routed weights through routed_scale, the shared down rows as they load), dense
    MLPs of prefix_dense_intermediate_size where `mlp_layer_types` says (the first first_k_dense_replace), which
    rotate q and k even where global when prefix_dense_sliding_window_pattern is 1; RMSNorm where rms_norm_eps is
    set, else Cohere's LayerNorm."""

    num_experts: int = 8
    top_k: int = 2
    moe_intermediate_size: int = 0
    shared_experts: int = 0
    shared_average: bool = True
    sigmoid: bool = False
    norm_topk_prob: bool = True
    dense_layers: tuple[int, ...] = ()
    dense_rope: bool = True
    rms_norm: bool = False

    ARCH: ClassVar[str] = "cohere2_moe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *Cohere2Config.FIELDS, ConfigField("num_experts", ("num_experts",), default=8),
        ConfigField("top_k", ("num_experts_per_tok",), default=2),
        ConfigField("shared_experts", ("num_shared_experts",), default=0),
        ConfigField("combination", ("shared_expert_combination_strategy",), default="average"),
        ConfigField("selection", ("expert_selection_fn",), default="softmax"),
        ConfigField("norm_topk_prob", ("norm_topk_prob",), default=True),
        ConfigField("mlp_layer_types", ("mlp_layer_types",), default=None),
        ConfigField("first_dense", ("first_k_dense_replace",), default=0),
        ConfigField("dense_intermediate_size", ("prefix_dense_intermediate_size",), default=None),
        ConfigField("prefix_pattern", ("prefix_dense_sliding_window_pattern",), default=1))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n, first, prefix = values["num_hidden_layers"], values.pop("first_dense"), values.pop("prefix_pattern")
        combination, selection = values.pop("combination"), values.pop("selection")
        if combination not in ("sum", "average") or selection not in ("softmax", "sigmoid"):
            raise ValueError(f"shared_expert_combination_strategy {combination!r} / expert_selection_fn "
                             f"{selection!r}: transformers takes sum or average / softmax or sigmoid; fix config.json")
        if not values["layer_types"]:       # transformers' own default: the dense prefix keeps its own pattern
            pattern = hf.get("sliding_window_pattern") or 4
            values["layer_types"] = [("full_attention" if (i + 1) % prefix == 0 else "sliding_attention")
                                     for i in range(first)] + [
                ("full_attention" if (i + 1) % pattern == 0 else "sliding_attention") for i in range(n - first)]
        experts = values["intermediate_size"]
        values = dict(values, moe_intermediate_size=experts, intermediate_size=values.pop("dense_intermediate_size")
                      or experts, dense_layers=dense_layers(values.pop("mlp_layer_types"), n, first),
                      dense_rope=prefix == 1, shared_average=combination == "average", sigmoid=selection == "sigmoid",
                      rms_norm=hf.get("rms_norm_eps") is not None)
        return super().adapt(values, hf, notes)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        layers = super().layer_attention()
        return tuple(dataclasses.replace(a, rope=True) if i in self.dense_layers and self.dense_rope else a
                     for i, a in enumerate(layers))

    def layer_moe(self, layer: int) -> MoESpec | None:
        if layer in self.dense_layers:
            return None
        halved = self.shared_average and self.shared_experts
        return MoESpec(self.num_experts, self.top_k, self.moe_intermediate_size,
                       self.norm_topk_prob or not self.sigmoid, self.moe_intermediate_size * self.shared_experts,
                       shared_gated=False, scoring="sigmoid" if self.sigmoid else "softmax",
                       routed_scale=0.5 if halved else 1.0)

    def flags(self) -> Flags:
        return dataclasses.replace(super().flags(), norm="rms") if self.rms_norm else super().flags()


CohereForCausalLM = Cohere2ForCausalLM = Cohere2MoeForCausalLM = CohereCompassForCausalLM = CausalLM


def weight_map(c: CohereConfig) -> WeightMap:
    if not isinstance(c, Cohere2MoeConfig):
        return decoder_weight_map(c)
    m = moe_weight_map(c, {"router": "mlp.gate", "expert": "mlp.experts.{j}", "shared": "mlp.shared_experts",
                           "gate": "gate_proj", "up": "up_proj", "down": "down_proj"})
    if c.shared_average and c.shared_experts:       # (routed + shared) / 2: the shared half here
        for key, names in list(m.items()):
            if key.endswith(".mlp.shared.down_proj.weight"):
                m[key] = WeightSpec(tuple(names), lambda w: (w * 0.5).astype(w.dtype))
    return m
