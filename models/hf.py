"""Hugging Face model directories: config.json + safetensors (single or sharded) or PyTorch .bin."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Callable

import numpy as np

from .bnb import BnbWeights, read_bnb_method
from .fp8 import FP8Weights, decode_e4m3, read_fp8_method
from .prequantized import PrequantizedWeights, read_quant_method
from .source import ModelLoadError, ModelSource, content_hash

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
              "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
              "BOOL": np.bool_, "F8_E4M3": np.uint8}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


def _widen(a: np.ndarray, stored: str = "") -> np.ndarray:
    """A tensor as read (bfloat16 as uint16, float8 as uint8 bytes, `stored` naming which) -> float32 or float16."""
    if stored == "BF16":   # bfloat16 is the top half of a float32
        return (a.astype(np.uint32) << 16).view(np.float32)
    if stored == "F8_E4M3":
        return decode_e4m3(a)
    return a if a.dtype in (np.float32, np.float16) else a.astype(np.float32)


class SafetensorsWeights:
    """Memory-maps .safetensors shards and reads tensors one at a time (no torch needed)."""

    def __init__(self, files: list[Path]):
        self._where: dict[str, tuple[Path, dict, int]] = {}
        for f in files:
            header, offset = _read_st_header(f)
            for name, info in header.items():
                if name != "__metadata__":
                    self._where[name] = (f, info, offset)

    def names(self) -> list[str]:
        return list(self._where)

    def get(self, name: str) -> np.ndarray:
        return _widen(self.stored(name), self._where[name][1]["dtype"])

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._where[name][1]["shape"])

    def tensor_type(self, name: str) -> str:
        """The stored dtype as safetensors names it: "F32", "F16", "BF16", ..."""
        return self._where[name][1]["dtype"]

    def stored(self, name: str) -> np.ndarray:
        """The tensor in its stored dtype (bfloat16 as uint16; integers stay integers)."""
        f, info, offset = self._where[name]
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ModelLoadError(f"{f}: tensor {name} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        a = np.memmap(f, dtype=np.uint8, mode="r", offset=offset + start, shape=(end - start,))
        return np.array(a.view(dtype).reshape(info["shape"]))


def _read_st_header(f: Path) -> tuple[dict, int]:
    size = f.stat().st_size
    with open(f, "rb") as fh:
        raw = fh.read(8)
        n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else size
        if n + 8 > size:
            raise ModelLoadError(f"{f} is truncated or not a safetensors file; re-download it")
        try:
            header = json.loads(fh.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelLoadError(f"{f} has a corrupt safetensors header ({e}); re-download it") from None
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise ModelLoadError(f"{f} is truncated ({size} bytes, header says {8 + n + end}); re-download it")
    return header, 8 + n


class TorchBinWeights:
    """pytorch_model*.bin through torch.load(weights_only=True): never plain pickle."""

    def __init__(self, files: list[Path]):
        try:
            import torch
        except ImportError:
            raise ModelLoadError("reading pytorch_model.bin needs torch: pip install torch==2.13.0") from None
        self._torch = torch
        self._tensors: dict = {}
        for f in files:
            try:
                self._tensors.update(torch.load(f, map_location="cpu", weights_only=True, mmap=True))
            except Exception as e:  # torch raises many types for a bad file
                raise ModelLoadError(f"cannot read {f} with torch.load(weights_only=True): {e}") from None

    def names(self) -> list[str]:
        return list(self._tensors)

    def get(self, name: str) -> np.ndarray:
        t = self._tensors[name]
        if t.is_floating_point() and t.dtype not in (self._torch.float32, self._torch.float16):
            t = t.float()                          # bfloat16, float8
        return _widen(t.numpy())

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name].shape)

    def tensor_type(self, name: str) -> str:
        """The stored dtype as safetensors would name it: "F32", "F16", "BF16", ..."""
        torch, dtype = self._torch, self._tensors[name].dtype
        return {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}.get(dtype, str(dtype))

    def stored(self, name: str) -> np.ndarray:
        """The tensor in its stored dtype (bfloat16 as uint16; integers stay integers)."""
        t = self._tensors[name]
        return t.view(self._torch.int16).numpy().view(np.uint16) if t.dtype == self._torch.bfloat16 else t.numpy()


def _weight_files(d: Path) -> tuple[str, list[Path]]:
    for index, kind in (("model.safetensors.index.json", "safetensors"), ("pytorch_model.bin.index.json", "bin")):
        if (d / index).exists():
            try:
                shards = sorted(set(json.loads((d / index).read_text())["weight_map"].values()))
            except (json.JSONDecodeError, KeyError) as e:
                raise ModelLoadError(f"{d / index} is not a valid shard index ({e}); re-download it") from None
            missing = [s for s in shards if not (d / s).exists()]
            if missing:
                raise ModelLoadError(f"{d} is missing shards {missing} listed in {index}; download them")
            return kind, [d / s for s in shards]
    st = sorted(d.glob("*.safetensors"))
    if st:
        return "safetensors", st
    bins = sorted(d.glob("pytorch_model*.bin"))
    if bins:
        return "bin", bins
    raise ModelLoadError(f"{d} has no weights (looked for *.safetensors, model.safetensors.index.json, "
                         "pytorch_model*.bin); download the model's weight files into it")


def read_config(cfg_path: Path) -> dict:
    try:
        return json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{cfg_path} is not valid JSON ({e}); fix or re-download it") from None


def load_hf_dir(d: Path) -> ModelSource:
    cfg_path = d / "config.json"
    if not cfg_path.exists():
        raise ModelLoadError(f"{d} has no config.json; pass a Hugging Face model directory "
                             "(config.json + *.safetensors) or a .gguf file")
    hf_config = read_config(cfg_path)
    qc = hf_config.get("quantization_config") or None
    if qc is not None and not isinstance(qc, dict):
        raise ModelLoadError(f"{cfg_path}: quantization_config is {type(qc).__name__} {qc!r:.60}, not an object; "
                             "the checkpoint's config.json is malformed (re-download it)")
    fp8 = read_fp8_method(d, qc) if qc else None
    mxfp4 = bool(qc) and str(qc.get("quant_method", "")).lower() == "mxfp4"
    if mxfp4 and hf_config.get("model_type") != "gpt_oss":
        raise ModelLoadError(f"{cfg_path}: quantization_config says mxfp4, which kiln reads for gpt-oss's experts only "
                             f"(this is model_type {hf_config.get('model_type')!r}); pass a float checkpoint")
    bitnet = bool(qc) and str(qc.get("quant_method", "")).lower() == "bitnet"     # models/bitnet.py reads them
    if bitnet and hf_config.get("model_type") != "bitnet":
        raise ModelLoadError(f"{cfg_path}: quantization_config says bitnet, which kiln reads for BitNet models only "
                             f"(this is model_type {hf_config.get('model_type')!r}); pass a float checkpoint")
    bnb = read_bnb_method(d, qc) if qc else None
    method = read_quant_method(d, qc) if qc and fp8 is None and not mxfp4 and bnb is None and not bitnet else None
    kind, files = _weight_files(d)
    weights = SafetensorsWeights(files) if kind == "safetensors" else TorchBinWeights(files)
    write_tokenizer, notes = tokenizer_files(d, hf_config.get("model_type"))
    if method is not None:
        weights = PrequantizedWeights(weights, method, d)
        notes = [f"{method.describe()}: {weights.quantized()} Linear weights stored quantized", *notes]
    elif fp8 is not None:
        weights = FP8Weights(weights, fp8, d)
        notes = [f"{fp8.describe()}: {weights.scaled()} weights", *notes]
    elif bnb is not None:
        weights = BnbWeights(weights, bnb, d)
        notes = [f"{bnb.describe()}: {weights.quantized()} weights stored 4-bit, read as the values their codes "
                 "stand for", *notes]
    elif mxfp4:
        notes = ["MXFP4 experts decoded exactly to float, then stored as --quant says (as-stored, auto's choice: "
                 "8-bit with each block's power-of-two scale, which holds them exactly)", *notes]
    return ModelSource(path=d, format="hf", hf_config=hf_config, weights=weights, write_tokenizer=write_tokenizer,
                       content_hash=content_hash([cfg_path, *files]), notes=notes,
                       stored_quant=method.label if method else "MXFP4" if mxfp4 else "bitsandbytes" if bnb else None)


def has_weights(d: Path) -> bool:
    """Whether a folder holds Hugging Face weight files (safetensors, .bin or their shard index)."""
    return any(any(d.glob(p)) for p in ("*.safetensors", "pytorch_model*.bin", "*.bin.index.json"))


def chat_templates(d: Path) -> tuple[str | list | None, bool]:
    """The folder's chat templates kept beside tokenizer_config.json, and whether they replace the config's own:
    chat_template.jinja (the default) and additional_chat_templates/<name>.jinja (named: tool_use, ...), which
    transformers takes ahead of the config's (its save_pretrained writes them so since 4.5x: a checkpoint saved today
    has no chat_template in tokenizer_config.json); else a processor's chat_template.json (vision-language
    checkpoints), for a config without one. (None, False) where the folder has none of them."""
    named = {}
    if (d / "chat_template.jinja").is_file():
        named["default"] = (d / "chat_template.jinja").read_text(encoding="utf-8")
    if (d / "additional_chat_templates").is_dir():
        named.update({f.stem: f.read_text(encoding="utf-8")
                      for f in sorted((d / "additional_chat_templates").glob("*.jinja"))})
    if named:
        return (named["default"] if list(named) == ["default"] else
                [{"name": name, "template": source} for name, source in named.items()]), True
    if not (d / "chat_template.json").is_file():
        return None, False
    try:
        template = json.loads((d / "chat_template.json").read_text(encoding="utf-8"))["chat_template"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{d / 'chat_template.json'} is not a JSON object with a chat_template "
                             f"({type(e).__name__}: {e}); fix or re-download it") from None
    return template, False


def _fold_chat_template(template, replaces: bool, config_path: Path) -> bool:
    """`template` (chat_templates') put into the artifact's tokenizer_config.json, where kiln's tokenizer reads it
    (written where the folder had none); False where nothing was written."""
    try:
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    except json.JSONDecodeError:
        return False            # left as it is: loading the artifact names the file
    if template is None or not replaces and config.get("chat_template"):
        return False
    config["chat_template"] = template
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    return True


# How the notes tokenizer_files gives begin (models/tokenizer_from.py drops them where --tokenizer gives another)
TOKENIZER_NOTE_STARTS = ("no tokenizer.json", "tokenizer.json built from", "no tokenizer_config.json")


# Model types whose tokenizer files alone do not make their tokenizer (their code adds special tokens and a prompt
# prefix): kiln builds none from them, and says why.
OWN_CODE_TOKENIZERS = {"chatglm": "ChatGLM's own (its special tokens, [gMASK]<sop> and the chat roles, are added by "
                                  "its Python code; the -hf releases' tokenizer.json holds them: pass it with "
                                  "--tokenizer)"}


def tokenizer_files(d: Path, model_type: str | None = None) -> tuple[Callable[[Path], list[str]], list[str]]:
    """A writer that copies the folder's tokenizer files into an artifact, and the note to give without one
    (`model_type`: config.json's, which names GPT-2's tokenizer where tokenizer_config.json names no class)."""
    from .bpe_files import build_byte_level_bpe, build_tiktoken
    from .sp_tokenizer import build_tokenizer, tokenizer_config
    built, why, source = None, None, None
    templates, has_json = chat_templates(d), (d / "tokenizer.json").exists()
    if not has_json and model_type in OWN_CODE_TOKENIZERS:
        why = OWN_CODE_TOKENIZERS[model_type]
    elif not has_json and (d / "tokenizer.model").exists():
        built, why = build_tokenizer(d / "tokenizer.model", tokenizer_config(d))
        source = "tokenizer.model (SentencePiece BPE, as transformers' fast conversion does)"
    elif not has_json and (d / "vocab.json").exists() and (d / "merges.txt").exists():
        built, why = build_byte_level_bpe(d, tokenizer_config(d), model_type)
        source = "vocab.json and merges.txt (byte-level BPE, as transformers' GPT2Tokenizer builds it)"
    elif not has_json and (d / "tiktoken.model").exists():
        built, why = build_tiktoken(d, tokenizer_config(d))
        source = "tiktoken.model (byte-level BPE with the merges tiktoken's ranks make, Kimi's split)"

    def write_tokenizer(dest: Path) -> list[str]:
        copied = []
        for name in TOKENIZER_FILES:
            if (d / name).exists():
                shutil.copy2(d / name, dest / name)
                copied.append(name)
        if built is not None:
            built.save(str(dest / "tokenizer.json"))
            copied.append("tokenizer.json")
        if _fold_chat_template(*templates, dest / "tokenizer_config.json") and "tokenizer_config.json" not in copied:
            copied.append("tokenizer_config.json")
        if "tokenizer.json" in copied and "tokenizer_config.json" not in copied:     # an artifact holds both
            (dest / "tokenizer_config.json").write_text("{}", encoding="utf-8")
            copied.append("tokenizer_config.json")
        return copied

    if has_json:
        notes = [] if (d / "tokenizer_config.json").exists() or templates[0] is not None else [
            "no tokenizer_config.json: special tokens as tokenizer.json and config.json give them (no chat template)"]
    elif built is not None:
        notes = [f"tokenizer.json built from {source}"]
    else:
        files = "tokenizer.model" if source and source.startswith("tokenizer.model") else "tokenizer"
        notes = ["no tokenizer.json" + (f" (its {files} is {why}, which kiln does not convert)" if why else "")
                 + ": the artifact takes token ids only (`kiln generate --ids`, token-id prompts on the "
                 "server); put the model's tokenizer.json in the folder and recompile to use text"]
    return write_tokenizer, notes
