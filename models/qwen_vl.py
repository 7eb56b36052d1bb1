"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE: the text model of each vision-language checkpoint.

kiln reads text, so it reads the language model and leaves the vision tower (`visual.*` or
`model.visual.*`) unread. Their text models are Qwen2 (Qwen2-VL, Qwen2.5-VL: q/k/v biases), Qwen3 (q/k
norms) and Qwen3-MoE (the top k of softmax scores, always renormalised) whose RoPE is M-RoPE: the
rotary frequencies split in sections (`mrope_section`, Qwen3-VL's interleaved) turning by a token's
time, height and width positions. A text token's three positions are all its position in the
sequence, so every frequency turns by it: plain RoPE, exactly (transformers' and llama.cpp's graphs
compute the same for a text prompt; the tests compare against transformers' VL classes).

Where the weights are: transformers writes Qwen2-VL and Qwen2.5-VL under the released checkpoints'
names (`model.layers.N`, `lm_head`), config.json flat (as released: M-RoPE as rope_scaling type
"mrope") or with a text_config (transformers 5); Qwen3-VL and Qwen3-VL-MoE under
`model.language_model`, with a text_config. Qwen3-VL-MoE's experts are 3-D: gate_up_proj and
down_proj as released ([experts, in, out]) or as transformers 5 saves them ([experts, out, in]),
told apart by their shapes as transformers does when it loads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .causal_lm import LLAMA_NAMES, CausalLM, WeightMap, WeightSpec, decoder_weight_map, prefixed_names
from .config import mrope_as_rope, text_model
from .moe import expert_rows, moe_weight_map
from .qwen2 import Qwen2Config
from .qwen3 import Qwen3Config
from .qwen_moe import NAMES as MOE_NAMES
from .qwen_moe import Qwen3MoeConfig

TEXT_ONLY = ("text model only: the vision tower is not read (prompts are text); M-RoPE over a text token's "
             "equal time, height and width positions is plain RoPE")


def vl_text(hf: dict) -> dict:
    """The text model's config.json fields: text_config where there is one, else the flat file as released;
    the outer tie_word_embeddings where it says (transformers' choice for the model); M-RoPE read as RoPE."""
    text, _ = text_model(hf)
    if isinstance(hf.get("text_config"), dict) and hf.get("tie_word_embeddings") is not None:
        text = {**text, "tie_word_embeddings": hf["tie_word_embeddings"]}
    return mrope_as_rope(text)


class VisionLanguageText:
    """A config class (mixed in before its base) that reads a VL checkpoint's text model (vl_text) and says so."""

    @classmethod
    def from_hf(cls, hf: dict):
        return super().from_hf(vl_text(hf))

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        notes.append(TEXT_ONLY)
        return super().adapt(values, hf, notes)


@dataclass(frozen=True)
class Qwen2VLConfig(VisionLanguageText, Qwen2Config):
    weight_prefix: str = "model"                        # the released checkpoints' names, which transformers keeps

    ARCH: ClassVar[str] = "qwen2_vl"


@dataclass(frozen=True)
class Qwen3VLConfig(VisionLanguageText, Qwen3Config):
    weight_prefix: str = "model.language_model"         # where transformers writes the text model's weights

    ARCH: ClassVar[str] = "qwen3_vl"


@dataclass(frozen=True)
class Qwen3VLMoeConfig(VisionLanguageText, Qwen3MoeConfig):
    weight_prefix: str = "model.language_model"

    ARCH: ClassVar[str] = "qwen3_vl_moe"

    @classmethod
    def adapt(cls, values: dict, hf: dict, notes: list[str]) -> dict:
        # Qwen3VLMoeTextTopKRouter renormalises the top k always (config.json says nothing of it)
        return super().adapt(dict(values, norm_topk_prob=True), hf, notes)


Qwen2VLForCausalLM = Qwen3VLForCausalLM = CausalLM


def weight_map(c: Qwen2VLConfig | Qwen3VLConfig) -> WeightMap:
    return decoder_weight_map(c, prefixed_names(LLAMA_NAMES, c.weight_prefix))


def moe_map(c: Qwen3VLMoeConfig) -> WeightMap:
    m = moe_weight_map(c, dict(MOE_NAMES, fused="mlp.experts"), prefixed_names(LLAMA_NAMES, c.weight_prefix))
    width, hidden = c.moe_intermediate_size, c.hidden_size
    for key, entry in m.items():
        if key.endswith(".experts_gate_up.weight"):
            m[key] = WeightSpec(entry.hf_names, _expert_rows(2 * width, hidden, entry.hf_names[0]))
        elif key.endswith(".experts_down.weight"):
            m[key] = WeightSpec(entry.hf_names, _expert_rows(hidden, width, entry.hf_names[0]))
    return m


def _expert_rows(rows: int, cols: int, name: str):
    """A 3-D experts tensor as kiln's expert Linear [experts * rows, cols]: as transformers 5 holds it
    ([experts, rows, cols]) or as released ([experts, cols, rows], transposed), by its shape (transformers'
    Transpose(check_dims): a square one is taken as its own layout)."""
    def rows_of(stacked):
        if tuple(stacked.shape[1:]) == (rows, cols):
            return expert_rows(stacked)
        if tuple(stacked.shape[1:]) == (cols, rows):
            return expert_rows(stacked.transpose(0, 2, 1))
        raise ValueError(f"{name} is {list(stacked.shape)}; Qwen3-VL-MoE's config says [experts, {rows}, {cols}] "
                         f"(or [experts, {cols}, {rows}] as released); the checkpoint does not match its config.json")
    return rows_of
