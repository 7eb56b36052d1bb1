"""Every architecture kiln can compile, registered in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import llama, qwen2
from .source import ModelLoadError


@dataclass(frozen=True)
class Architecture:
    name: str
    hf_architectures: tuple[str, ...]     # config.json "architectures"
    model_types: tuple[str, ...]          # config.json "model_type"
    config_cls: Any                       # has from_hf(dict)
    model_cls: Callable                   # nn.Module taking the config
    weight_map: Callable                  # config -> {param name: [hf names] or WeightSpec}


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(
        name="llama",
        hf_architectures=("LlamaForCausalLM", "MistralForCausalLM"),
        model_types=("llama", "mistral"),
        config_cls=llama.LlamaConfig,
        model_cls=llama.LlamaForCausalLM,
        weight_map=llama.weight_map,
    ),
    "qwen2": Architecture(
        name="qwen2",
        hf_architectures=("Qwen2ForCausalLM",),
        model_types=("qwen2",),
        config_cls=qwen2.Qwen2Config,
        model_cls=qwen2.Qwen2ForCausalLM,
        weight_map=qwen2.weight_map,
    ),
}


def supported() -> str:
    return ", ".join(f"{a.name} ({'/'.join(a.hf_architectures)})" for a in ARCHITECTURES.values())


def find_architecture(hf_config: dict) -> Architecture:
    """The registered architecture for a config.json dict, by `architectures` then `model_type`."""
    names = hf_config.get("architectures") or []
    model_type = hf_config.get("model_type")
    for arch in ARCHITECTURES.values():
        if any(n in arch.hf_architectures for n in names) or model_type in arch.model_types:
            return arch
    what = "/".join(names) or model_type or "no 'architectures' or 'model_type' field"
    raise ModelLoadError(f"unknown architecture: {what}. Supported: {supported()}.")
