"""Nanbeige 4.2 (its own code: NanbeigeForCausalLM; llama.cpp's nanbeige GGUFs): a Llama whose layers run `num_loops`
times, the final norm applied between loops too (unless `skip_loop_final_norm`), each run of a layer at its own
KV-cache slots (as llama.cpp runs it: block_count physical layers, num_loops x block_count in its cache). One loop is
a Llama. The cache holds num_loops x num_hidden_layers layers; the weights are num_hidden_layers layers'."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache

from .causal_lm import CausalLM, DecoderStack, LayerAttention, WeightMap
from .config import ConfigField
from .llama import LlamaConfig
from .llama import weight_map as llama_weight_map


@dataclass(frozen=True)
class NanbeigeConfig(LlamaConfig):
    num_loops: int = 1
    loop_norm: bool = True                  # the final norm between loops (not skip_loop_final_norm)
    physical_layers: int = 0                # the layers with weights (num_hidden_layers: the cache's, every loop's)

    ARCH: ClassVar[str] = "nanbeige"
    STAND_IN: ClassVar[tuple[str, str]] = ("llama", "LlamaForCausalLM")     # its layers (compiler/golden.py loops them)
    FIELDS: ClassVar[tuple[ConfigField, ...]] = (
        *LlamaConfig.FIELDS, ConfigField("num_loops", ("num_loops",), default=1),
        ConfigField("loop_norm", ("skip_loop_final_norm",), default=False))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        loops = 1 if values["num_loops"] is None else values["num_loops"]
        if not isinstance(loops, int) or loops < 1:
            raise ValueError(f"nanbeige's num_loops must be a whole number from 1; got {values['num_loops']!r}; "
                             "fix config.json")
        if values["sliding_window"] or values["layer_types"]:
            raise ValueError("nanbeige with sliding-window layers is not supported (Nanbeige's attend to every token)")
        n = values["num_hidden_layers"]
        values = super().adapt(values, hf, notes)
        return dict(values, num_loops=loops, loop_norm=not values["loop_norm"], physical_layers=n,
                    num_hidden_layers=n * loops)


class LoopedStack(DecoderStack):
    """The physical layers, run num_loops times (run j of layer i at cache slot j x layers + i), normed between."""

    def __init__(self, c: NanbeigeConfig, flags, attention: tuple[LayerAttention, ...]):
        super().__init__(c, flags, attention[:c.physical_layers])
        self.loops, self.loop_norm = c.num_loops, c.loop_norm

    def forward(self, x: Tensor, kv_cache: PagedKVCache) -> Tensor:
        b, s, _ = x.shape
        positions = kv_cache.get_query_positions(b * s) if self.needs_positions else None
        n = len(self.layers)
        for j in range(self.loops):
            if j and self.loop_norm:
                x = self.norm(x)
            for i, layer in enumerate(self.layers):
                x = layer(x, kv_cache, j * n + i, positions)
        return self.norm(x)


class NanbeigeForCausalLM(CausalLM):
    def stack(self, config: NanbeigeConfig) -> nn.Module:
        return LoopedStack(config, self.flags, self.attention)


def weight_map(c: NanbeigeConfig) -> WeightMap:
    return llama_weight_map(dataclasses.replace(c, num_hidden_layers=c.physical_layers))
