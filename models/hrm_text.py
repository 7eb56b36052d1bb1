"""HRM-Text (hrm_text): a hierarchical recurrent model of two stacks of `num_layers_per_stack` Llama layers (norms
without weights, the attention output gated by sigmoid(gate_proj(x)) before o_proj, multi-head attention, a
weightless norm after each stack), run in loops: a high-level state z_H (the embeddings times `embedding_scale`)
and a low-level one z_L (`z_L_init`, a learned vector); `H_cycles` times, the low stack runs `L_cycles` times on
z_L + z_H, then the high stack on z_H + z_L; the head reads z_H. Every run of a layer has its own keys and values:
the cache holds num_layers_per_stack x H_cycles x (L_cycles + 1) layers (config.json's num_hidden_layers, as
transformers writes it; a config that gives the per-stack count there, without num_layers_per_stack, is read so too).

Its checkpoints (as released, and as transformers saves them) hold each layer's gate, q, k and v as one `gqkv_proj`
(in that order) and the MLP's gate and up as `gate_up_proj`. transformers' prefix-LM attention (a prompt marked by
token_type_ids attending both ways) is not run: kiln attends causally, as transformers does without
token_type_ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache

from .causal_lm import DECODER_FIELDS, CausalLM, DecoderConfig, WeightMap, WeightSpec
from .config import ConfigField, fields_with
from .glm4_moe import gates_after_queries
from .layers import DecoderLayer, Flags, Norm


@dataclass(frozen=True)
class HrmTextConfig(DecoderConfig):
    layers_per_stack: int = 1
    h_cycles: int = 2
    l_cycles: int = 3
    embedding_scale: float = 1.0
    split_layers: bool = False              # llama.cpp's layout (the GGUF reader's: models/gguf_arch.py _hrm_text)

    ARCH: ClassVar[str] = "hrm_text"
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *fields_with(DECODER_FIELDS, ConfigField("head_dim", ("head_dim",), default=128)),
        ConfigField("layers_per_stack", ("num_layers_per_stack",), default=None),
        ConfigField("h_cycles", ("H_cycles",), default=2), ConfigField("l_cycles", ("L_cycles",), default=3),
        ConfigField("embedding_scale", ("embedding_scale",), default=None),
        ConfigField("initializer_range", ("initializer_range",), default=0.02),
        ConfigField("split_layers", ("kiln_split_layers",), default=False))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        biased = [k for k in ("attention_bias", "mlp_bias") if hf.get(k)]
        if biased or values["num_key_value_heads"] != values["num_attention_heads"]:
            raise ValueError(f"HRM-Text with {', '.join(biased) or 'fewer key/value heads than query heads'} is not "
                             "supported (its released form: no biases, multi-head attention)")
        per_stack = values["layers_per_stack"] or values["num_hidden_layers"]     # an older config: the stack's
        runs = values["h_cycles"] * (values["l_cycles"] + 1)
        init = values.pop("initializer_range")
        scale = values["embedding_scale"] or 1.0 / init        # transformers' default: 1 / initializer_range
        if hf.get("prefix_lm", True):
            notes.append("HRM-Text's prefix-LM attention (a prompt attending both ways where token_type_ids mark it) "
                         "is not run: kiln attends causally, as transformers does without token_type_ids")
        return dict(values, layers_per_stack=per_stack, num_hidden_layers=per_stack * runs, embedding_scale=scale)

    def flags(self) -> Flags:
        return Flags(norm="rms_noparam", attn_output_gate=True, embed_scale=self.embedding_scale)


class HrmStack(nn.Module):
    """The low stack's layers (layers[:n]) and the high stack's (layers[n:]), each run at its cache slots."""

    needs_positions = False                 # one RoPE on every layer: the cache applies it

    def __init__(self, c: HrmTextConfig, flags: Flags):
        n = c.layers_per_stack
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.z_L_init = nn.Parameter((c.hidden_size,))
        self.layers = nn.ModuleList([DecoderLayer(c.hidden_size, c.intermediate_size, c.num_attention_heads,
                                                  c.num_key_value_heads, c.head_dim, c.norm_eps, flags)
                                     for _ in range(2 * n)])
        self.final_norm = Norm(c.hidden_size, c.norm_eps, "rms_noparam")
        self.n, self.h_cycles, self.l_cycles = n, c.h_cycles, c.l_cycles

    def _run(self, x: Tensor, kv_cache: PagedKVCache, high: bool, first_slot: int) -> Tensor:
        for i in range(self.n):
            x = self.layers[self.n * high + i](x, kv_cache, first_slot + i)
        return self.final_norm(x)

    def forward(self, x: Tensor, kv_cache: PagedKVCache) -> Tensor:
        z_high, z_low = x, op.broadcast_to(self.z_L_init, x.shape)
        for h in range(self.h_cycles):
            for low in range(self.l_cycles):
                z_low = self._run(z_low + z_high, kv_cache, False, (h * (self.l_cycles + 1) + low) * self.n)
            z_high = self._run(z_high + z_low, kv_cache, True, (h * (self.l_cycles + 1) + self.l_cycles) * self.n)
        return z_high


class HrmTextForCausalLM(CausalLM):
    def stack(self, config: HrmTextConfig) -> nn.Module:
        return HrmStack(config, self.flags)


def weight_map(c: HrmTextConfig) -> WeightMap:
    m: WeightMap = {"model.embed_tokens.weight": ["model.embed_tokens.weight"], "model.z_L_init": ["model.z_L_init"]}
    if not c.tie_word_embeddings:
        m["lm_head.weight"] = ["lm_head.weight"]
    rows = c.num_attention_heads * c.head_dim
    per_head = gates_after_queries(c.num_attention_heads, c.head_dim)

    def gate_q_k_v(w: np.ndarray) -> np.ndarray:        # [gate | q | k | v] -> each head's q then its gate | k | v
        return per_head(np.concatenate([w[rows:2 * rows], w[:rows], w[2 * rows:]]))

    for j, (stack, i) in enumerate((s, i) for s in ("L", "H") for i in range(c.layers_per_stack)):
        k = f"model.layers.{j}"
        if c.split_layers:          # llama.cpp's: the stacks' layers in one list, each projection apart
            m[f"{k}.self_attn.qkv_proj.weight"] = WeightSpec(
                tuple(f"{k}.self_attn.{x}_proj.weight" for x in ("q", "gate", "k", "v")), per_head)
            m[f"{k}.mlp.gate_up_proj.weight"] = [f"{k}.mlp.gate_proj.weight", f"{k}.mlp.up_proj.weight"]
            m.update({f"{k}.{x}.weight": [f"{k}.{x}.weight"] for x in ("self_attn.o_proj", "mlp.down_proj")})
            continue
        h = f"model.{stack}_module.layers.{i}"
        m[f"{k}.self_attn.qkv_proj.weight"] = WeightSpec((f"{h}.attn.gqkv_proj.weight",), gate_q_k_v)
        m[f"{k}.self_attn.o_proj.weight"] = [f"{h}.attn.o_proj.weight"]
        m[f"{k}.mlp.gate_up_proj.weight"] = [f"{h}.mlp.gate_up_proj.weight"]
        m[f"{k}.mlp.down_proj.weight"] = [f"{h}.mlp.down_proj.weight"]
    return m
