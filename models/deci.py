"""NVIDIA's Nemotron-NAS models (nemotron-nas, DeciLMForCausalLM: Llama-3.1-Nemotron-51B, Llama-3.3-Nemotron-Super-49B,
Llama-3.1-Nemotron-Ultra-253B) and Deci's DeciLM-7B (deci): Llamas whose layers a neural architecture search made
unlike each other. Each layer's block_configs entry gives its attention: its own KV heads (num_attention_heads //
n_heads_in_group), or one hidden x hidden Linear in its place (replace_with_linear: self_attn.linear_attn), or none
(no_op: no input norm either); and its MLP: a SwiGLU of its own width (ffn_mult: int(2 * ffn_mult * hidden / 3)
rounded up to a multiple of 256), or a Linear (mlp.linear_mlp), or none (no post-attention norm either). DeciLM-7B is
a Llama with num_key_value_heads_per_layer. As the checkpoints' own modeling_decilm.py runs them (vLLM, TensorRT-LLM
and llama.cpp's deci read the same).

The layers' KV heads differ and some layers hold none, so the model runs over the KV cache kiln owns (its layers
without attention hold no pages worth the name: one head of one dim), and `--kv-cache tvm` is refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache

from .causal_lm import CausalLM, DecoderStack, WeightMap, head_weights
from .config import ConfigField, fields_with
from .layers import MLP, Flags, Norm, PagedAttention
from .llama import LlamaConfig

ATTENTION, LINEAR, NONE = "attention", "linear", "none"


@dataclass(frozen=True)
class Block:
    """One layer's parts: attention (ATTENTION with `kv_heads`, LINEAR or NONE) and MLP (ATTENTION's sibling: "mlp"
    of `intermediate_size`, LINEAR or NONE)."""

    attention: str
    kv_heads: int
    mlp: str
    intermediate_size: int


def ffn_width(ffn_mult: float, hidden: int) -> int:
    """DeciLM's MLP width: int(2 * ffn_mult * hidden / 3) rounded up to a multiple of 256."""
    width = int(2 * ffn_mult * hidden / 3)
    return -(-width // 256) * 256


def _refuse_set(part: dict, keys: tuple[str, ...], where: str) -> None:
    for key in keys:
        if part.get(key) not in (None, False, 0, [], {}):
            raise ValueError(f"nemotron-nas {where} sets {key} {part[key]!r}, which kiln does not run (the released "
                             f"checkpoints leave it unset); fix config.json")


def _block(i: int, entry: dict, heads: int, hidden: int) -> Block:
    """Layer i's Block from its block_configs entry."""
    where = f"block_configs[{i}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("attention"), dict) \
            or not isinstance(entry.get("ffn"), dict):
        raise ValueError(f"nemotron-nas {where} must hold an 'attention' and an 'ffn' object; fix config.json")
    if entry.get("parallel_blocks"):
        raise ValueError(f"nemotron-nas {where} sets parallel_blocks (attention beside Mamba), which kiln does not run")
    a, f = entry["attention"], entry["ffn"]
    _refuse_set(a, ("window_length", "num_sink_tokens", "sparsify", "unshifted_sink",
                    "use_prefill_window_in_sink_attention", "mamba", "llama4"), f"{where}.attention")
    _refuse_set(f, ("sparsify", "moe"), f"{where}.ffn")
    if a.get("no_op"):
        attention, kv = NONE, 0
    elif a.get("replace_with_linear"):
        attention, kv = LINEAR, 0
    else:
        group = a.get("n_heads_in_group")
        if not isinstance(group, int) or group < 1 or heads % group:
            raise ValueError(f"nemotron-nas {where}.attention.n_heads_in_group {group!r} must divide "
                             f"num_attention_heads ({heads}) (or set no_op / replace_with_linear); fix config.json")
        attention, kv = ATTENTION, heads // group
    if f.get("no_op"):
        return Block(attention, kv, NONE, 0)
    if f.get("replace_with_linear"):
        return Block(attention, kv, LINEAR, 0)
    mult, width = f.get("ffn_mult"), f.get("intermediate_size")
    if mult is None and isinstance(width, int) and width > 0:        # a width as it is (a GGUF's feed_forward_length)
        return Block(attention, kv, "mlp", width)
    if not isinstance(mult, (int, float)) or mult <= 0:
        raise ValueError(f"nemotron-nas {where}.ffn.ffn_mult {mult!r} must be a positive number (or set no_op / "
                         "replace_with_linear); fix config.json")
    return Block(attention, kv, "mlp", ffn_width(mult, hidden))


@dataclass(frozen=True)
class DeciConfig(LlamaConfig):
    blocks: tuple[Block, ...] = ()

    ARCH: ClassVar[str] = "nemotron-nas"
    ROPE_TYPES: ClassVar[tuple[str, ...]] = (*LlamaConfig.ROPE_TYPES, "dynamic")
    FIELDS: ClassVar[tuple[ConfigField, ...]] = fields_with(
        LlamaConfig.FIELDS, ConfigField("intermediate_size", ("intermediate_size",), default=0),
        ConfigField("num_key_value_heads", ("num_key_value_heads",), default="num_attention_heads"))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{cls.ARCH} with hidden_act {hf['hidden_act']!r} is not supported (kiln runs DeciLM's "
                             "silu); fix config.json")
        if (values["rope_scaling"] or {}).get("rope_type") == "dynamic":
            notes.append("dynamic NTK RoPE scaling acts past max_position_embeddings only, which caps the context: "
                         "within it RoPE is unscaled")
            values = dict(values, rope_scaling=None)
        n, heads, hidden = values["num_hidden_layers"], values["num_attention_heads"], values["hidden_size"]
        if "block_configs" in hf:
            entries = hf["block_configs"]
            if not isinstance(entries, list) or len(entries) != n:
                raise ValueError(f"nemotron-nas block_configs must list one entry a layer ({n}); fix config.json")
            blocks = tuple(_block(i, e, heads, hidden) for i, e in enumerate(entries))
        elif "num_key_value_heads_per_layer" in hf:                     # DeciLM-7B
            kv = hf["num_key_value_heads_per_layer"]
            if not isinstance(kv, list) or len(kv) != n or any(not isinstance(k, int) or k < 1 or heads % k
                                                                 for k in kv):
                raise ValueError(f"deci num_key_value_heads_per_layer must list {n} counts that divide "
                                 f"num_attention_heads ({heads}); fix config.json")
            if not values["intermediate_size"]:
                raise ValueError("deci config.json without intermediate_size; the checkpoint's config is incomplete")
            blocks = tuple(Block(ATTENTION, k, "mlp", values["intermediate_size"]) for k in kv)
        else:
            raise ValueError(f"{hf.get('model_type', cls.ARCH)} config.json without block_configs (or DeciLM-7B's "
                             "num_key_value_heads_per_layer): each layer's parts are unknown; fix config.json")
        values = super().adapt(values, hf, notes)
        if values["sliding_window"]:
            raise ValueError("nemotron-nas with sliding_window is not supported (its layers attend fully)")
        kv = next((b.kv_heads for b in blocks if b.attention == ATTENTION), heads)
        return dict(values, blocks=blocks, num_key_value_heads=kv)

    def layer_kv_heads(self, layer: int) -> int:
        return self.blocks[layer].kv_heads

    def kv_layers(self):
        """Each layer's own KV heads; a layer without attention (none, or a Linear) holds one head of one dim."""
        shapes = tuple((b.kv_heads, self.head_dim) if b.attention == ATTENTION else (1, 1) for b in self.blocks)
        return shapes, tuple(range(len(shapes)))


class LinearAttention(nn.Module):
    """A layer's attention replaced by one Linear (replace_with_linear): it reads no KV cache."""

    def __init__(self, hidden: int):
        self.linear_attn = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: Tensor, *_cache) -> Tensor:
        return self.linear_attn(x)


class LinearMLP(nn.Module):
    """A layer's MLP replaced by one Linear (replace_with_linear)."""

    def __init__(self, hidden: int):
        self.linear_mlp = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_mlp(x)


class DeciLayer(nn.Module):
    def __init__(self, c: DeciConfig, block: Block, flags: Flags, rope: tuple | None):
        h = c.hidden_size
        if block.attention != NONE:
            self.input_layernorm = Norm(h, c.norm_eps)
            self.self_attn = PagedAttention(h, c.num_attention_heads, block.kv_heads, c.head_dim, flags, c.norm_eps,
                                            rope) if block.attention == ATTENTION else LinearAttention(h)
        if block.mlp != NONE:
            self.post_attention_layernorm = Norm(h, c.norm_eps)
            self.mlp = MLP(h, block.intermediate_size, flags, c.norm_eps) if block.mlp == "mlp" else LinearMLP(h)

    def forward(self, x: Tensor, kv_cache: PagedKVCache, layer_id: int, positions: Tensor | None) -> Tensor:
        if hasattr(self, "self_attn"):
            x = x + self.self_attn(self.input_layernorm(x), kv_cache, layer_id, positions)
        if hasattr(self, "mlp"):
            x = x + self.mlp(self.post_attention_layernorm(x))
        return x

    def attentions(self) -> tuple:
        """Its attention over the KV cache (set_kv_dtype sets its dtype), none without one."""
        return (self.self_attn,) if isinstance(getattr(self, "self_attn", None), PagedAttention) else ()


class DeciStack(DecoderStack):
    """The decoder stack, each layer a DeciLayer of its block."""

    def decoder_layer(self, c: DeciConfig, i: int, flags: Flags, rope: tuple | None) -> nn.Module:
        return DeciLayer(c, c.blocks[i], flags, rope)


class DeciForCausalLM(CausalLM):
    def stack(self, config: DeciConfig) -> nn.Module:
        return DeciStack(config, self.flags, self.attention)


def weight_map(c: DeciConfig) -> WeightMap:
    f = c.flags()
    m = head_weights(c)
    for i, b in enumerate(c.blocks):
        k = f"model.layers.{i}"
        if b.attention != NONE:
            m[f"{k}.input_layernorm.weight"] = [f"{k}.input_layernorm.weight"]
        if b.attention == LINEAR:
            m[f"{k}.self_attn.linear_attn.weight"] = [f"{k}.self_attn.linear_attn.weight"]
        elif b.attention == ATTENTION:
            for p in ("weight", "bias") if f.qkv_bias else ("weight",):
                m[f"{k}.self_attn.qkv_proj.{p}"] = [f"{k}.self_attn.{x}_proj.{p}" for x in "qkv"]
            for p in ("weight", "bias") if f.o_bias else ("weight",):
                m[f"{k}.self_attn.o_proj.{p}"] = [f"{k}.self_attn.o_proj.{p}"]
        if b.mlp != NONE:
            m[f"{k}.post_attention_layernorm.weight"] = [f"{k}.post_attention_layernorm.weight"]
        if b.mlp == LINEAR:
            m[f"{k}.mlp.linear_mlp.weight"] = [f"{k}.mlp.linear_mlp.weight"]
        elif b.mlp == "mlp":
            for p in ("weight", "bias") if f.mlp_bias else ("weight",):
                m[f"{k}.mlp.gate_up_proj.{p}"] = [f"{k}.mlp.gate_proj.{p}", f"{k}.mlp.up_proj.{p}"]
                m[f"{k}.mlp.down_proj.{p}"] = [f"{k}.mlp.down_proj.{p}"]
    return m
