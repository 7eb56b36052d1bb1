"""LoRA adapters (PEFT's format: adapter_config.json + adapter_model.safetensors / .bin; or llama.cpp's LoRA
GGUF, _with_gguf_adapter) merged into the model they were trained on, at compile time (`kiln compile BASE --lora
ADAPTER`; or a PEFT adapter's folder as any command's MODEL, where its base_model_name_or_path is a local path or
alias: models.load).

Each adapted Linear's weight becomes W + scale * B @ A (transposed where the base stores its Linears [in, out]:
fan_in_fan_out, GPT-2's Conv1D), an adapted embedding's E + scale * (B @ A)^T (lora_embedding_A / _B), with
scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora; rank_pattern and alpha_pattern give a module
its own r and alpha (PEFT's matching: the pattern ends the module's name at a dot). A module in modules_to_save
is replaced by the adapter's copy (as is an adapted embedding's base layer, which PEFT saves beside it). That is
PEFT's merge_and_unload: the merged model computes what PeftModel computes, up to float32 rounding
(tests/numerics/test_lora.py: against PEFT's unmerged forward).

The merge is a view of the base's weights (LoraWeights): a merged tensor reads as float32 and is then stored as
--quant says (its stored quantized form, a GGUF block or a GPTQ code, no longer holds it); every other tensor
keeps the base's stored form. Anything of PEFT's that changes the computation otherwise (DoRA, LoRA biases,
trainable tokens, layer replication, adapters on parameters, aLoRA) is refused by name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np

from .source import ModelLoadError, ModelSource, content_hash

PREFIX = "base_model.model."
# adapter_config.json keys whose PEFT methods compute what a plain merge does not: refused where set
REFUSED = {"use_dora": "DoRA (a learned magnitude per column)", "lora_bias": "LoRA biases",
           "trainable_token_indices": "trainable tokens", "layer_replication": "layer replication",
           "target_parameters": "LoRA on parameters (MoE experts)", "alora_invocation_tokens": "activated LoRA",
           "use_qalora": "QA-LoRA", "use_bdlora": "block-diagonal LoRA", "arrow_config": "Arrow routing"}


@dataclasses.dataclass(frozen=True)
class Delta:
    """One adapted tensor: its A and B tensors' names in the adapter, the scale, and how the product lies."""
    a: str
    b: str
    scale: float
    embedding: bool                     # lora_embedding_A / _B: (B @ A)^T over an embedding [vocab, dim]
    transposed: bool                    # fan_in_fan_out: the base stores the Linear [in, out]


def with_adapter(source: ModelSource, adapter: str | Path) -> ModelSource:
    """`source` with the LoRA adapter at `adapter` (a PEFT folder, or llama.cpp's LoRA GGUF) merged into its
    weights (a ModelLoadError naming what is wrong with the adapter otherwise)."""
    folder = Path(adapter).expanduser()
    if folder.suffix == ".gguf" and folder.is_file():
        return _with_gguf_adapter(source, folder)
    cfg_path = folder / "adapter_config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(f"{folder} has no adapter_config.json: --lora takes a PEFT LoRA adapter's folder "
                             "(adapter_config.json + adapter_model.safetensors)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{cfg_path} is not valid JSON ({e}); fix or re-download it") from None
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise ModelLoadError(f"{cfg_path}: peft_type {cfg.get('peft_type')!r}; kiln merges LORA adapters only")
    refused = [what for key, what in REFUSED.items() if cfg.get(key)]
    if cfg.get("bias", "none") != "none":
        refused.append(f"bias {cfg['bias']!r} (trained biases)")
    if refused:
        raise ModelLoadError(f"{cfg_path} uses {', '.join(refused)}, which kiln does not merge; merge it with "
                             "PEFT's merge_and_unload and compile the merged model")
    tensors = _adapter_weights(folder)
    deltas, replaced = _plan(cfg, tensors, set(source.weights.names()), cfg_path)
    if not deltas and not replaced:
        raise ModelLoadError(f"{folder}: the adapter's tensors adapt none of the model's ({len(tensors.names())} "
                             f"tensors under {PREFIX}...); is it an adapter for this model?")
    tied = source.hf_config.get("tie_word_embeddings", False)
    embed = [n for n in (*deltas, *replaced) if n.endswith("embed_tokens.weight")]
    if embed and tied and not any(n.endswith("lm_head.weight") for n in (*deltas, *replaced)):
        raise ModelLoadError(f"{folder} changes the embedding of a model whose head is tied to it (PEFT changes "
                             "the embedding alone); merge it with PEFT and compile the merged model")
    ranks = sorted({_rank(tensors, d.a) for d in deltas.values()})
    note = (f"LoRA adapter {folder.name} merged: {len(deltas)} weights (rank {'/'.join(map(str, ranks)) or '-'}, "
            f"lora_alpha {cfg.get('lora_alpha', 8)}{', rsLoRA' if cfg.get('use_rslora') else ''})"
            + (f", {len(replaced)} replaced (modules_to_save)" if replaced else ""))
    files = sorted(p for p in folder.iterdir() if p.name.startswith("adapter_"))
    return _merged(source, LoraWeights(source.weights, tensors, deltas, replaced), folder, files, note)


def _merged(source: ModelSource, weights: "LoraWeights", adapter: Path, files: list[Path], note: str) -> ModelSource:
    """`source` over the merged `weights`, keyed by its own content and the adapter's files (source.content_hash's
    blockwise hash), the note first."""
    digest = hashlib.sha256(f"{source.content_hash}|{content_hash(files)}".encode()).hexdigest()
    return dataclasses.replace(source, weights=weights, content_hash=digest, notes=[note, *source.notes],
                               adapter=str(adapter))


def adapter_base(folder: Path) -> Path | str:
    """The model an adapter folder names as its base (adapter_config.json's base_model_name_or_path), where it
    is a local folder or file (beside the adapter, or as written) or one of kiln's aliases."""
    from .packaged import PACKAGED
    cfg_path = folder / "adapter_config.json"
    try:
        named = json.loads(cfg_path.read_text()).get("base_model_name_or_path")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{cfg_path} is not valid JSON ({e}); fix or re-download it") from None
    if named in PACKAGED:
        return named
    for candidate in ([Path(named).expanduser(), folder / named, folder.parent / named] if named else []):
        if candidate.exists():
            return candidate.resolve()
    raise ModelLoadError(f"{folder} is a LoRA adapter whose base model ({named or 'not named'}) is not a local "
                         f"path kiln can read (kiln reads no hub); pass the base model's folder with the adapter "
                         f"as --lora: kiln compile BASE --lora {folder}")


def _with_gguf_adapter(source: ModelSource, path: Path) -> ModelSource:
    """llama.cpp's LoRA GGUF (convert_lora_to_gguf.py: general.type adapter, adapter.type lora,
    adapter.lora.alpha; for each adapted tensor X, X.lora_a [r, in] and X.lora_b [out, r] under X's GGUF name,
    q and k's B rows permuted as the base's are; a norm whole, as mergekit writes it; an embedding adapter is
    refused), merged as llama.cpp applies it: scale alpha / r (1 without alpha), names and rows mapped to the base's
    Hugging Face ones through the adapter architecture's GGUF map (models/gguf_arch.py)."""
    import gguf

    from .gguf import _hf_name, unpermute_rows
    from .gguf_arch import GGUF_ARCHS
    from .gguf_meta import meta
    reader = gguf.GGUFReader(str(path))
    kind, which = meta(reader, "general.type", None), meta(reader, "adapter.type", None)
    if kind != "adapter" or which != "lora":
        raise ModelLoadError(f"{path} is not a LoRA adapter GGUF (general.type {kind!r}, adapter.type {which!r}); "
                             "--lora takes a PEFT adapter folder or llama.cpp's convert_lora_to_gguf.py output")
    arch = meta(reader, "general.architecture", None)
    spec = GGUF_ARCHS.get(arch)
    if spec is None:
        raise ModelLoadError(f"{path}: a LoRA adapter for GGUF architecture {arch!r}, which kiln does not read")
    alpha = float(meta(reader, "adapter.lora.alpha", 0.0) or 0.0)
    base = set(source.weights.names())
    heads = {".self_attn.q_proj.": source.hf_config.get("num_attention_heads"),
             ".self_attn.k_proj.": source.hf_config.get("num_key_value_heads")
             or source.hf_config.get("num_attention_heads")} if spec.permuted else {}
    tensors = {t.name: t for t in reader.tensors}
    pairs: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
    whole: dict[str, np.ndarray] = {}
    for name, t in tensors.items():
        if name.endswith(".lora_b"):
            continue
        target = _hf_name(spec, name[:-len(".lora_a")] if name.endswith(".lora_a") else name)
        if target is None or target not in base:
            raise ModelLoadError(f"{path}: {name} adapts no tensor of the model ({target or 'no Hugging Face name'});"
                                 " is it an adapter for this model?")
        if not name.endswith(".lora_a"):
            whole[target] = _gguf_array(t)
            continue
        if f"{name[:-2]}_b" not in tensors:
            raise ModelLoadError(f"{path}: {name} has no {name[:-2]}_b beside it; re-convert the adapter")
        if name.startswith("token_embd."):
            raise ModelLoadError(f"{path} adapts the token embedding, which kiln does not merge from a GGUF adapter "
                                 "yet; pass the PEFT adapter folder instead")
        a, b = _gguf_array(t), _gguf_array(tensors[f"{name[:-2]}_b"])
        n = next((n for part, n in heads.items() if part in target), 0)
        if n:
            b = unpermute_rows(b, int(n))
        r = a.shape[0]
        pairs[target] = (a, b, alpha / r if alpha else 1.0)
    if not pairs and not whole:
        raise ModelLoadError(f"{path} holds no LoRA tensors")
    note = (f"LoRA adapter {path.name} (GGUF) merged: {len(pairs)} weights (rank "
            f"{'/'.join(map(str, sorted({a.shape[0] for a, _, _ in pairs.values()})))}, lora_alpha {alpha:g})"
            + (f", {len(whole)} replaced" if whole else ""))
    arrays = _Arrays({**{f"{t}.lora_A": a for t, (a, _, _) in pairs.items()},
                      **{f"{t}.lora_B": b for t, (_, b, _) in pairs.items()}, **whole})
    deltas = {t: Delta(f"{t}.lora_A", f"{t}.lora_B", scale, False, False) for t, (_, _, scale) in pairs.items()}
    return _merged(source, LoraWeights(source.weights, arrays, deltas, {t: t for t in whole}), path, [path], note)


def _gguf_array(t) -> np.ndarray:
    """A GGUF tensor as float32 in torch's layout (rows first)."""
    import gguf
    data = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
    return data.reshape(tuple(int(d) for d in reversed(t.shape)))


class _Arrays:
    """Named arrays in memory, as a weight source."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self._arrays = arrays

    def names(self) -> list[str]:
        return list(self._arrays)

    def get(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._arrays[name].shape


def _adapter_weights(folder: Path):
    from .hf import SafetensorsWeights, TorchBinWeights
    st = folder / "adapter_model.safetensors"
    if st.is_file():
        return SafetensorsWeights([st])
    binary = folder / "adapter_model.bin"
    if binary.is_file():
        return TorchBinWeights([binary])
    raise ModelLoadError(f"{folder} has no adapter_model.safetensors (or adapter_model.bin); re-save the adapter "
                         "with PEFT's save_pretrained")


def _plan(cfg: dict, tensors, base: set[str], where: Path) -> tuple[dict[str, Delta], dict[str, str]]:
    """base tensor name -> its Delta; base tensor name -> the adapter tensor replacing it (modules_to_save)."""
    deltas: dict[str, Delta] = {}
    replaced: dict[str, str] = {}
    alpha, rslora = float(cfg.get("lora_alpha", 8)), bool(cfg.get("use_rslora"))
    held = set(tensors.names())
    for name in tensors.names():
        rest = name[len(PREFIX):] if name.startswith(PREFIX) else name
        m = re.fullmatch(r"(.+)\.lora_(embedding_)?A(?:\.[\w-]+)?(?:\.weight)?", rest)
        if m:
            module, embedding = m.group(1), bool(m.group(2))
            b = name.replace("lora_embedding_A" if embedding else "lora_A", "lora_embedding_B" if embedding
                             else "lora_B")
            target = f"{module}.weight"
            if b not in held:
                raise ModelLoadError(f"{where.parent}: {name} has no {b} beside it; re-save the adapter with PEFT")
            if target not in base:
                raise ModelLoadError(f"{where.parent}: {name} adapts {target}, which the model does not have; is it "
                                     "an adapter for this model?")
            r = _rank(tensors, name)
            r_m = _pattern(cfg.get("rank_pattern") or {}, module, r)
            a_m = float(_pattern(cfg.get("alpha_pattern") or {}, module, alpha))
            deltas[target] = Delta(name, b, a_m / (math.sqrt(r_m) if rslora else r_m), embedding,
                                   bool(cfg.get("fan_in_fan_out")) and not embedding)
        elif re.search(r"\.lora_(embedding_)?B(?:\.[\w-]+)?(?:\.weight)?$", rest):
            continue
        else:
            # a module_to_save's copy; or the base layer of an adapted embedding (PEFT saves it with the adapter)
            target = re.sub(r"\.(?:modules_to_save\.[\w-]+|base_layer)\.", ".", rest)
            if target not in base:
                raise ModelLoadError(f"{where.parent}: {name} replaces no tensor of the model (no {target}); is it "
                                     "an adapter for this model?")
            replaced[target] = name
    return deltas, replaced


def _rank(tensors, a_name: str) -> int:
    """An A tensor's rank: its rows ([r, in] for a Linear, [r, vocab] for an embedding)."""
    shape = tensors.shape(a_name) if hasattr(tensors, "shape") else np.shape(tensors.get(a_name))
    return int(shape[0])


def _pattern(patterns: dict, module: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup: the first key that ends the module's name at a dot."""
    for key, value in patterns.items():
        if re.fullmatch(rf"(.*\.)?(?:{key})", module):
            return value
    return default


class LoraWeights:
    """The base's tensors with the adapter merged (names as the base's); a merged tensor is float32 and has no
    stored quantized form, every other keeps the base's."""

    _BY_NAME = ("stored_form", "stored_codes")

    def __init__(self, inner, adapter, deltas: dict[str, Delta], replaced: dict[str, str]) -> None:
        self._inner, self._adapter, self._deltas, self._replaced = inner, adapter, deltas, replaced

    def names(self) -> list[str]:
        return self._inner.names()

    def merged(self, name: str) -> bool:
        return name in self._deltas or name in self._replaced

    def get(self, name: str) -> np.ndarray:
        if not self.merged(name):
            return self._inner.get(name)
        base = np.asarray(self._adapter.get(self._replaced[name]) if name in self._replaced
                          else self._inner.get(name), np.float32)
        if name not in self._deltas:
            return base
        d = self._deltas[name]
        a = np.asarray(self._adapter.get(d.a), np.float32)
        b = np.asarray(self._adapter.get(d.b), np.float32)
        delta = (b @ a) * np.float32(d.scale)
        if d.embedding or d.transposed:
            delta = delta.T
        if base.shape != delta.shape:
            raise ModelLoadError(f"the adapter's update of {name} is {delta.shape}, the tensor {base.shape}; the "
                                 "adapter was trained on another model")
        return base + delta

    def tensor_type(self, name: str) -> str:
        return "F32" if self.merged(name) else self._inner.tensor_type(name)

    def has_raw(self, name: str) -> bool:
        inner = getattr(self._inner, "has_raw", None)
        return not self.merged(name) and (inner is None or inner(name))

    def __getattr__(self, attr: str):
        if attr.startswith("_"):
            raise AttributeError(attr)
        value = getattr(self._inner, attr)              # AttributeError where the source has no such method
        if attr in self._BY_NAME:
            return lambda name, *rest: None if self.merged(name) else value(name, *rest)
        return value
