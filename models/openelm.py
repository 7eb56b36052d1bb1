"""Apple's OpenELM (openelm, OpenELMForCausalLM: OpenELM-270M / 450M / 1.1B / 3B and their -Instruct): a Llama whose
layers widen with depth (layer-wise scaling): each layer its own query heads (num_query_heads), KV heads (num_kv_heads)
and MLP width (ffn_multipliers[i] * model_dim made divisible by ffn_dim_divisor: to the nearest multiple, up one where
that fell more than 10% short), q and k RMS-normed a head before RoPE (normalize_qk_projections), q, k and v one
Linear (attn.qkv_proj), the MLP's gate and up one (ffn.proj_1), the embedding shared with the head; as the checkpoints'
own modeling_openelm.py runs them (llama.cpp's openelm reads the same). Its layers' heads differ, so it runs over the
KV cache kiln owns (`--kv-cache tvm` refused). The checkpoints ship no tokenizer (Apple's use Llama 2's): the
artifact takes token ids unless the folder holds one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import CausalLM, DecoderConfig, WeightMap
from .config import ConfigField
from .layers import Flags


def make_divisible(value: float, divisor: int) -> int:
    """OpenELM's rounding of a width: the nearest multiple of `divisor` (at least one), up one more where that fell
    more than 10% short."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _per_layer(hf: dict, key: str, n: int, kind: type | tuple[type, ...], what: str) -> tuple:
    values = hf.get(key)
    if not isinstance(values, list) or len(values) != n or not all(isinstance(v, kind) and v > 0 for v in values):
        raise ValueError(f"openelm {key} must list one positive {what} a layer ({n}); fix config.json")
    return tuple(values)


@dataclass(frozen=True)
class OpenELMConfig(DecoderConfig):
    query_heads: tuple[int, ...] = ()
    kv_heads: tuple[int, ...] = ()
    widths: tuple[int, ...] = ()
    qk_norm: bool = True

    ARCH: ClassVar[str] = "openelm"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        ConfigField("vocab_size", ("vocab_size",)),
        ConfigField("hidden_size", ("model_dim",)),
        ConfigField("intermediate_size", ("intermediate_size",), default=0),
        ConfigField("num_hidden_layers", ("num_transformer_layers",)),
        ConfigField("num_attention_heads", ("num_attention_heads",), default=0),
        ConfigField("num_key_value_heads", ("num_key_value_heads",), default=0),
        ConfigField("head_dim", ("head_dim",)),
        ConfigField("norm_eps", ("rms_norm_eps",), default=1e-6),      # modeling_openelm.py's, fixed
        ConfigField("rope_theta", ("rope_freq_constant",), default=10000.0),
        ConfigField("context_window_size", ("max_context_length",)),
        ConfigField("tie_word_embeddings", ("share_input_output_layers",), default=True),
        ConfigField("rope_scaling", ("rope_scaling",), default=None),
        ConfigField("partial_rotary_factor", ("partial_rotary_factor",), default=1.0),
        ConfigField("bos_token_id", ("bos_token_id",), default=None),
        ConfigField("eos_token_ids", ("eos_token_id",), default=None),
        ConfigField("qk_norm", ("normalize_qk_projections",), default=True))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        for key, want in (("ffn_with_glu", True), ("activation_fn_name", "swish")):
            if hf.get(key, want) != want:
                raise ValueError(f"openelm with {key} {hf[key]!r} is not supported (the released checkpoints set "
                                 f"{want!r}); fix config.json")
        n, hidden = values["num_hidden_layers"], values["hidden_size"]
        queries, kv = _per_layer(hf, "num_query_heads", n, int, "int"), _per_layer(hf, "num_kv_heads", n, int, "int")
        for i, (q, k) in enumerate(zip(queries, kv)):
            if q % k:
                raise ValueError(f"openelm layer {i}: {q} query heads do not group over {k} KV heads; fix config.json")
        if isinstance(hf.get("intermediate_size"), list):                  # the widths as they are (a GGUF's)
            widths = _per_layer(hf, "intermediate_size", n, int, "int")
        else:
            divisor = hf.get("ffn_dim_divisor", 256)
            widths = tuple(make_divisible(m * hidden, divisor)
                           for m in _per_layer(hf, "ffn_multipliers", n, (int, float), "number"))
        return dict(values, query_heads=queries, kv_heads=kv, widths=widths, num_attention_heads=queries[0],
                    num_key_value_heads=kv[0], intermediate_size=max(widths))

    def flags(self) -> Flags:
        return Flags(qk_norm=self.qk_norm)

    def layer_heads(self, layer: int) -> int:
        return self.query_heads[layer]

    def layer_kv_heads(self, layer: int) -> int:
        return self.kv_heads[layer]

    def layer_intermediate(self, layer: int) -> int:
        return self.widths[layer]

    def kv_layers(self):
        return tuple((k, self.head_dim) for k in self.kv_heads), tuple(range(self.num_hidden_layers))


OpenELMForCausalLM = CausalLM


def weight_map(c: OpenELMConfig) -> WeightMap:
    m: WeightMap = {"model.embed_tokens.weight": ["transformer.token_embeddings.weight"],
                    "model.norm.weight": ["transformer.norm.weight"]}
    if not c.tie_word_embeddings:
        m["lm_head.weight"] = ["lm_head.weight"]
    for i in range(c.num_hidden_layers):
        k, h = f"model.layers.{i}", f"transformer.layers.{i}"
        m.update({f"{k}.input_layernorm.weight": [f"{h}.attn_norm.weight"],
                  f"{k}.self_attn.qkv_proj.weight": [f"{h}.attn.qkv_proj.weight"],
                  f"{k}.self_attn.o_proj.weight": [f"{h}.attn.out_proj.weight"],
                  f"{k}.post_attention_layernorm.weight": [f"{h}.ffn_norm.weight"],
                  f"{k}.mlp.gate_up_proj.weight": [f"{h}.ffn.proj_1.weight"],
                  f"{k}.mlp.down_proj.weight": [f"{h}.ffn.proj_2.weight"]})
        if c.qk_norm:
            m.update({f"{k}.self_attn.q_norm.weight": [f"{h}.attn.q_norm.weight"],
                      f"{k}.self_attn.k_norm.weight": [f"{h}.attn.k_norm.weight"]})
    return m
