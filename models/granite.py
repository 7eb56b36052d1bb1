"""IBM Granite 3.x: a Llama with four multipliers — the embeddings scaled by `embedding_multiplier`,
attention's softmax scale `attention_multiplier` itself (not head_dim ** -0.5), each attention and
MLP output scaled by `residual_multiplier` before its residual add, and the logits divided by
`logits_scaling`. Granite MoE (3.0/3.1 1B-A400M, 3B-A800M) swaps each MLP for a sparse mixture
(every expert's gate and up rows in one 3-D `input_linear`, the top `num_experts_per_tok` renormalised);
Granite MoE Shared adds an always-on MLP beside it, ungated. NAVER's HyperCLOVA X SEED is a
Granite whose logits are multiplied by `logits_scaling`, whose attention scale defaults to
head_dim ** -0.5, and which norms the attention and MLP outputs too (`use_post_norm`: Peri-LN). Granite
4.0's models without Mamba layers (granite-4.0-micro: every `layer_types` entry "attention") are Granite
MoE Shared, or with no experts (`num_local_experts` 0) a Granite whose MLP is the shared one; RoPE only
where `position_embedding_type` is "rope". The hybrids (the -h- models) put Mamba-2 layers (`layer_types`
"mamba") among the attention ones: models/mamba2.py, over the KV cache kiln owns.
Granite SWA and Granite MoE SWA add attention sinks on every layer (a logit per head in each softmax: over
the KV cache kiln owns, models/owned_kv.py), sliding layers (by default all but every fourth from the
first) and a RoPE base per layer (`layer_rope_theta`, 0 for none); the MoE one's experts as transformers 5
stores them (3-D gate_up_proj and down_proj) beside an ungated shared MLP."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import LLAMA_NAMES, CausalLM, LayerAttention, WeightMap, WeightSpec, decoder_weight_map
from .config import ConfigField, fields_with
from .layers import Flags
from .llama import LlamaConfig
from .mamba2 import MAMBA_FIELDS, HybridLM, Mamba2Fields, hybrid_weight_map
from .moe import EXPERT_FIELDS, MoESpec, expert_rows


@dataclass(frozen=True)
class GraniteConfig(LlamaConfig):
    embedding_multiplier: float = 1.0
    attention_multiplier: float | None = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0

    ARCH: ClassVar[str] = "granite"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (*LlamaConfig.FIELDS, *(
        ConfigField(name, (name,), default=1.0)
        for name in ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")))

    def flags(self) -> Flags:
        return Flags(qkv_bias=self.attention_bias, o_bias=self.attention_bias, mlp_bias=self.mlp_bias,
                     embed_scale=self.embedding_multiplier, attn_scale=self.attention_multiplier,
                     residual_scale=self.residual_multiplier, logit_divisor=self.logits_scaling)


@dataclass(frozen=True)
class HyperCLOVAXConfig(GraniteConfig):
    use_post_norm: bool = False

    ARCH: ClassVar[str] = "hyperclovax"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        GraniteConfig.FIELDS, ConfigField("attention_multiplier", ("attention_multiplier",), default=None),
        ConfigField("use_post_norm", ("use_post_norm",), default=False))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if not values["logits_scaling"]:
            raise ValueError("logits_scaling 0 would zero every logit; fix config.json")
        return super().adapt(values, hf, notes)

    def flags(self) -> Flags:
        return dataclasses.replace(super().flags(), logit_divisor=1.0 / self.logits_scaling,
                                   sandwich_norms=self.use_post_norm)


@dataclass(frozen=True)
class GraniteMoeConfig(GraniteConfig):
    num_experts: int = 8
    top_k: int = 2
    shared_intermediate_size: int = 0       # Granite MoE Shared's always-on MLP

    ARCH: ClassVar[str] = "granitemoe"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *GraniteConfig.FIELDS, *EXPERT_FIELDS,
        ConfigField("shared_intermediate_size", ("shared_intermediate_size",), default=0))

    def layer_moe(self, layer: int) -> MoESpec:
        return MoESpec(self.num_experts, self.top_k, self.intermediate_size, normalize=True,
                       shared_intermediate_size=self.shared_intermediate_size, shared_gated=False)


@dataclass(frozen=True)
class GraniteMoeSharedConfig(GraniteMoeConfig):
    ARCH: ClassVar[str] = "granitemoeshared"


@dataclass(frozen=True)
class GraniteMoeHybridConfig(Mamba2Fields, GraniteMoeSharedConfig):
    rope: bool = True

    ARCH: ClassVar[str] = "granitemoehybrid"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        GraniteMoeSharedConfig.FIELDS, ConfigField("num_experts", ("num_local_experts", "num_experts"), default=0),
        ConfigField("top_k", ("num_experts_per_tok",), default=1),
        ConfigField("layer_types", ("layer_types", "layers_block_type"), default=None), *MAMBA_FIELDS)

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        blocks = values["layer_types"] or ["mamba"] * n             # transformers' default: every layer Mamba-2
        if len(blocks) != n or set(blocks) - {*_ATTENTION, *_MAMBA}:
            raise ValueError(f"layer_types must list 'mamba' or 'attention' for each of the {n} layers; got {blocks}; "
                             "fix config.json")
        values = dict(values, layer_types=None, rope=hf.get("position_embedding_type") == "rope")
        if not values["num_experts"]:       # dense: the shared MLP is the layer's MLP
            values.update(intermediate_size=values["shared_intermediate_size"], shared_intermediate_size=0)
        values = cls.mamba_values(values, [i for i, b in enumerate(blocks) if b in _MAMBA])
        return super().adapt(values, hf, notes)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return tuple(dataclasses.replace(a, rope=self.rope) for a in super().layer_attention())

    def layer_moe(self, layer: int) -> MoESpec | None:
        return super().layer_moe(layer) if self.num_experts else None


_ATTENTION, _MAMBA = ("attention", "full_attention"), ("mamba", "linear_attention")   # (transformers 5's names)


@dataclass(frozen=True)
class _SlidingSinks:
    """Granite SWA's attention (a mixin before the Granite config it extends)."""

    layer_rope_theta: tuple[float, ...] = ()

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        n = values["num_hidden_layers"]
        types = values["layer_types"] or tuple("full_attention" if i % 4 == 0 else "sliding_attention"
                                               for i in range(n))
        thetas = tuple(float(t) for t in (hf.get("layer_rope_theta") or [values["rope_theta"]] * n))
        if len(thetas) != n:
            raise ValueError(f"layer_rope_theta lists {len(thetas)} RoPE bases for {n} layers; fix config.json")
        return super().adapt(dict(values, layer_types=types, layer_rope_theta=thetas), hf, notes)

    def flags(self) -> Flags:
        return dataclasses.replace(super().flags(), attn_sinks=True)

    def layer_attention(self) -> tuple[LayerAttention, ...]:
        return tuple(dataclasses.replace(a, rope_theta=theta or a.rope_theta, rope=bool(theta))
                     for a, theta in zip(super().layer_attention(), self.layer_rope_theta))


_SWA_FIELDS = (ConfigField("sliding_window", ("sliding_window",), default=128),)


@dataclass(frozen=True)
class GraniteSWAConfig(_SlidingSinks, GraniteConfig):
    ARCH: ClassVar[str] = "granite_swa"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(GraniteConfig.FIELDS, *_SWA_FIELDS)


@dataclass(frozen=True)
class GraniteMoeSWAConfig(_SlidingSinks, GraniteMoeSharedConfig):
    ARCH: ClassVar[str] = "granitemoe_swa"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(GraniteMoeSharedConfig.FIELDS, *_SWA_FIELDS)


GraniteSWAForCausalLM = GraniteMoeSWAForCausalLM = CausalLM
GraniteForCausalLM = HyperCLOVAXForCausalLM = GraniteMoeForCausalLM = GraniteMoeSharedForCausalLM = CausalLM


def GraniteMoeHybridForCausalLM(c: GraniteMoeHybridConfig) -> CausalLM:
    """Granite 4.0: with Mamba-2 layers (the -h- models) over the KV cache kiln owns, else a Granite MoE Shared."""
    return HybridLM(c) if c.mamba_layers else CausalLM(c)


def weight_map(c: GraniteConfig) -> WeightMap:
    m = _weight_map(c)
    return hybrid_weight_map(c, m, "mamba") if isinstance(c, GraniteMoeHybridConfig) else m


def _weight_map(c: GraniteConfig) -> WeightMap:
    if isinstance(c, HyperCLOVAXConfig):
        return decoder_weight_map(c, dict(LLAMA_NAMES, post_attn_norm="post_norm1", post_mlp_norm="post_norm2"))
    m = decoder_weight_map(c)
    if isinstance(c, _SlidingSinks):
        for i in range(c.num_hidden_layers):
            m[f"model.layers.{i}.self_attn.sinks"] = [f"model.layers.{i}.self_attn.sinks"]
    if not isinstance(c, GraniteMoeConfig):
        return m
    if isinstance(c, GraniteMoeHybridConfig) and not c.num_experts:
        for i in range(c.num_hidden_layers):
            k, h = f"model.layers.{i}.mlp", f"model.layers.{i}.shared_mlp"
            m[f"{k}.gate_up_proj.weight"] = [f"{h}.input_linear.weight"]
            m[f"{k}.down_proj.weight"] = [f"{h}.output_linear.weight"]
        return m
    for i in range(c.num_hidden_layers):
        k, h = f"model.layers.{i}.mlp", f"model.layers.{i}"
        for key in [key for key in m if key.startswith(f"{k}.")]:
            del m[key]
        if isinstance(c, GraniteMoeSWAConfig):          # transformers 5's names and 3-D expert tensors
            m[f"{k}.router"] = [f"{h}.block_sparse_moe.router.weight"]
            gate_up, down = f"{h}.block_sparse_moe.experts.gate_up_proj", f"{h}.block_sparse_moe.experts.down_proj"
        else:
            m[f"{k}.router"] = [f"{h}.block_sparse_moe.router.layer.weight"]
            gate_up, down = f"{h}.block_sparse_moe.input_linear.weight", f"{h}.block_sparse_moe.output_linear.weight"
        m[f"{k}.experts_gate_up.weight"] = WeightSpec((gate_up,), expert_rows)
        m[f"{k}.experts_down.weight"] = WeightSpec((down,), expert_rows)
        if c.shared_intermediate_size:
            m[f"{k}.shared.gate_up_proj.weight"] = [f"{h}.shared_mlp.input_linear.weight"]
            m[f"{k}.shared.down_proj.weight"] = [f"{h}.shared_mlp.output_linear.weight"]
    return m
