"""Quantization schemes: how weights are stored in the artifact and computed with.

A scheme rewrites the nn.Module from outside (swapping nn.Linear / nn.Embedding for the
quantized forms in compiler/quant_modules.py) and returns a `QuantPlan`: which format
each weight got, and how to convert the source tensors, one weight at a time, into the
arrays the rewritten module's parameters expect.

Names follow MLC's convention: q<weight bits>f<compute float bits>; q0 keeps weights
in floating point. Schemes:

    q0f32, q0f16   float weights
    q4f32, q4f16   4-bit, group 32 along K, value = (q - 8) * scale, scale in f32 / f16
    q8f32          int8, group 32 along K, value = q * scale
    as-stored      a GGUF's own formats: Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and
                   Q6_K kept exactly (quant_gguf.GGUF_EXACT; 8-bit ones re-quantized to q4 on a target
                   without 8-bit storage, noted), F32 tensors kept as float, F16 / BF16 ones in
                   their 16 bits (quant_modules f16 / bf16, widened to float32 in the matmul); a
                   GPTQ, AWQ or compressed-tensors checkpoint's 4-bit codes kept exactly
                   (quant_prequant), GPTQ's desc_act re-quantized; MXFP4 (gpt-oss's experts, HF or
                   GGUF) as q8 with each block's power-of-two scale, which holds it exactly; IQ4_NL
                   and IQ4_XS as q8 too (exact), the other i-quants and TQ1_0 / TQ2_0 re-quantized. Q4_0,
                   Q4_1, Q8_0, Q5_0 and Q5_1 keep their float16 block scales in float16 where the target reads them
                   (TargetProfile.half_scales; labelled "-f16scales"), else float32
    as-stored-f16  the same weights, float16 activations: the planes keep float32
                   scales, so each weight dequantizes exactly, in float32, inside its matmul
    auto           as-stored for GGUF, GPTQ, AWQ, compressed-tensors and MXFP4, the target's best 4-bit scheme
                   for float weights

Linear weights (qkv, o, gate_up, down, an untied lm_head) and the embedding table are
quantized; norms and biases stay float. Groups run along K, so converting each HF tensor
of a fused weight (q/k/v, gate/up) and concatenating the planes along N is exact.

A q4 weight's scales are chosen by search (quant_pack._q4_levels): 13 candidate scales
around extreme / -8 (extreme: the group's value of largest magnitude, put on the grid's
bottom level -8, which has no positive twin) each round the group, and the rounding whose
least-squares scale leaves the least squared error wins, with that scale. q4f32 / q4f16
keep the most sensitive weights 8-bit: the LM head (an untied lm_head, or the embedding
when the head is tied to it) and every weight of the first and last eighth of the layers
(QuantPlan._at_the_ends), after llama.cpp's Q4_K_M, which gives more bits to its output
tensor and, at both ends of the stack, to attn_v and ffn_down. The plan's notes and the
per-weight formats in kiln-config.json record which weights.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from tvm.relax.frontend import nn

from kiln.models import ModelLoadError, ModelSource, WeightSpec, weight_spec

from . import quant_gguf, quant_pack, quant_prequant
from .quant_modules import BYTE_KINDS, QuantFormat, QuantizedEmbedding, QuantizedLinear

_FLOAT_TYPES = ("F32", "F16", "BF16")
_HALF_KINDS = {"F16": "f16", "BF16": "bf16"}        # stored 16-bit floats -> the kind keeping their bits
# stored types re-quantized to q4 (where not kept exactly); the rest to q8
_FOUR_BITS_OR_LESS = ("Q4_0", "Q4_1", "Q4_K", "Q3_K", "Q2_K", "GPTQ", "AWQ", "compressed-tensors", "NF4", "FP4",
                      "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XXS", "IQ2_XS", "IQ1_M", "IQ1_S", "TQ2_0",
                      "TQ1_0")


@dataclass(frozen=True)
class QuantScheme:
    name: str
    model_dtype: str            # activations, scales and unquantized weights
    description: str
    kind: str | None = None     # quantized format for float sources: "q4", "q8"; None keeps float
    group_size: int = 32
    as_stored: bool = False     # keep a GGUF's own quantized formats

    def apply(self, model: nn.Module, source: ModelSource, weight_map: dict, eight_bit: bool = True,
              codes_by_bits: bool = False, half_storage: bool = True, half_scales: bool = False) -> QuantPlan:
        """Cast the model to the compute dtype, swap quantized modules in, return the plan.
        ``eight_bit=False``: the target has no 8-bit storage, so every quantized weight is 4-bit.
        ``codes_by_bits``: the kernels turn integer codes into floats by their bits
        (quant_modules.code_value; the same values). ``half_storage=False``: the target has no
        16-bit storage, so as-stored keeps F16 / BF16 tensors in the compute dtype. ``half_scales``:
        as-stored keeps a GGUF's float16 block scales in float16 (TargetProfile.half_scales)."""
        if self.kind == "q8" and not eight_bit:
            raise ValueError(f"--quant {self.name} stores 8-bit integers, which this target's kernels cannot "
                             "read; use q4f32 or q4f16")
        model.to(self.model_dtype)
        plan = QuantPlan(self, dict(source.hf_config), eight_bit=eight_bit, codes_by_bits=codes_by_bits,
                         half_storage=half_storage, half_scales=half_scales, stored_quant=source.stored_quant)
        _swap_modules(model, "", lambda path, m: plan.decide(path, m, source, weight_map))
        plan.finish()
        return plan

    def convert(self, name: str, weight: np.ndarray, dtype: str | None = None) -> dict[str, np.ndarray]:
        """A float parameter's value -> {its artifact name: the array in the compute dtype, or in `dtype`
        where the module keeps the parameter in its own (an MoE router's float32)}."""
        return {name: np.ascontiguousarray(weight.astype(dtype or self.model_dtype, copy=False))}


SCHEMES: dict[str, QuantScheme] = {s.name: s for s in (
    QuantScheme("q0f32", "float32", "float32 weights and compute (reference numerics)"),
    QuantScheme("q0f16", "float16", "float16 weights and compute"),
    QuantScheme("q4f32", "float32", "4-bit weights (group 32, float32 scales), float32 compute", kind="q4"),
    QuantScheme("q4f16", "float16", "4-bit weights (group 32, float16 scales), float16 compute", kind="q4"),
    QuantScheme("q8f32", "float32", "8-bit weights (group 32, float32 scales), float32 compute", kind="q8"),
    QuantScheme("as-stored", "float32", "a GGUF's quantized weights kept exactly where a kiln kernel holds "
                "them, the rest re-quantized to 4/8-bit, float32 compute", kind="q4", as_stored=True),
    QuantScheme("as-stored-f16", "float16", "as-stored with float16 activations: the weights still dequantize "
                "exactly (float32, inside each matmul), every sum in float32", kind="q4", as_stored=True),
)}


def get_scheme(name: str, source: ModelSource | None = None, target_default: str = "q4f16") -> QuantScheme:
    """The scheme for --quant; `auto` is as-stored for weights stored quantized (a GGUF, a GPTQ, AWQ or
    compressed-tensors checkpoint), else the target's default (TargetProfile.default_quant)."""
    stored = source.stored_quant if source is not None else None
    if name == "auto":
        name = "as-stored" if stored else target_default
    if name not in SCHEMES:
        raise ValueError(f"unknown quantization {name!r}; choose one of: auto, {', '.join(SCHEMES)}")
    if SCHEMES[name].as_stored and source is not None and not stored:
        raise ValueError(f"--quant {name} keeps the stored quantization of a GGUF file or a GPTQ / AWQ / "
                         "compressed-tensors checkpoint, "
                         f"but this model's weights ({source.format}) are floats; use q4f32, q4f16 or q8f32")
    return SCHEMES[name]


@dataclass
class QuantPlan:
    """Per weight of one model: its format (None = float) and how to convert its tensors."""

    scheme: QuantScheme
    hf_config: dict
    eight_bit: bool = True                  # q8 allowed (the target reads 8-bit integers)
    codes_by_bits: bool = False             # dequantize codes to floats by their bits (quant_modules.code_value)
    half_storage: bool = True               # f16 / bf16 weights allowed (the target reads 16-bit values)
    half_scales: bool = False               # a GGUF's float16 block scales kept in float16 (float32 compute)
    stored_quant: str | None = None         # the source's stored quantization (ModelSource.stored_quant)
    formats: dict[str, QuantFormat | None] = field(default_factory=dict)   # weight name -> format
    shapes: dict[str, tuple[int, int]] = field(default_factory=dict)       # quantized: [N, K]
    notes: list[str] = field(default_factory=list)
    _planes: dict[str, str] = field(default_factory=dict)                  # plane param -> weight name
    _requantized: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (type, kind) -> HF names
    _kept: Counter = field(default_factory=Counter)                        # "Q4_K as q4m" -> tensors
    _kept_8bit: list[str] = field(default_factory=list)                    # by a 4-bit scheme

    # -- rewriting the model -------------------------------------------------------------
    def decide(self, path: str, module: nn.Module, source: ModelSource,
               weight_map: dict) -> nn.Module:
        """The module to put at `path`: a quantized form of a Linear/Embedding, or itself."""
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            return module
        name = f"{path}.weight"
        rows, cols = (module.out_features, module.in_features) if isinstance(module, nn.Linear) \
            else (module.num, module.dim)
        fmt = self._format_for(name, weight_spec(weight_map.get(name, [])), source, cols, self._is_lm_head(module))
        self.formats[name] = fmt
        if fmt is None:
            return module
        self.shapes[name] = (int(rows), int(cols))
        dtype = self.scheme.model_dtype
        if isinstance(module, nn.Linear):
            new = QuantizedLinear(module.in_features, module.out_features, fmt, dtype, bias=module.bias is not None,
                                  by_bits=self.codes_by_bits)
        else:
            new = QuantizedEmbedding(module.num, module.dim, fmt, dtype, by_bits=self.codes_by_bits)
        self._planes.update({f"{path}.{plane}": name for plane in fmt.plane_names})
        return new

    def _is_lm_head(self, module: nn.Module) -> bool:
        """The output projection: a vocab-sized Linear, or the token table when tied to it."""
        vocab = self.hf_config.get("vocab_size")
        if isinstance(module, nn.Linear):
            return module.out_features == vocab
        return module.num == vocab and bool(self.hf_config.get("tie_word_embeddings"))

    def _format_for(self, name: str, spec: WeightSpec, source: ModelSource, cols: int,
                    lm_head: bool) -> QuantFormat | None:
        scheme = self.scheme
        if scheme.kind is None:
            return None
        if scheme.as_stored:
            types = [source.weights.tensor_type(n) for n in spec.hf_names]
            if types and all(t in _FLOAT_TYPES for t in types):
                return self._float_as_stored(types)
        if cols % scheme.group_size:
            return None
        if not scheme.as_stored:
            # The LM head is the most precision-sensitive weight: 8-bit, as llama.cpp does for
            # its output tensor (SmolLM2 perplexity: +28% with a 4-bit head, +16% with 8-bit).
            kind = scheme.kind
            if kind == "q4" and self.eight_bit and (lm_head or self._at_the_ends(name)):
                kind = "q8"
                self._kept_8bit.append(name)
            return QuantFormat(kind, scheme.group_size, scheme.model_dtype)
        exact = {_exact_form(source, n, t) for n, t in zip(spec.hf_names, types)}
        if not self.eight_bit:
            exact = {e if e is None or e[0] not in BYTE_KINDS else None for e in exact}
        if len(exact) == 1 and None not in exact and spec.transform is None:
            kind, group = exact.pop()
            fmt = QuantFormat(kind, group, self._exact_scale_dtype(types))
            self._kept.update(f"{t} as {self._label(fmt)}" for t in types)      # one exact form for every part
            return fmt
        # No exact form (GPTQ's desc_act), parts of one fused weight stored differently, or
        # a layout transform: re-quantize, to 8-bit unless every part had 4 bits or fewer.
        kind = "q4" if not self.eight_bit or all(t in _FOUR_BITS_OR_LESS for t in types) else "q8"
        for hf_name, t in zip(spec.hf_names, types):
            self._requantized.setdefault((t, kind), []).append(hf_name)
        return QuantFormat(kind, scheme.group_size, "float32")

    def _exact_scale_dtype(self, types: list[str]) -> str:
        """An exact form's scale dtype: float16 where the target reads it (half_scales), the compute is
        float32 (under float16 compute, float32 scales are what keeps q * scale exact: quant_modules
        weight_dtype) and every part is a GGUF type whose block scales and mins are float16 as stored
        (quant_gguf.HALF_SCALED); else float32."""
        half = self.half_scales and self.scheme.model_dtype == "float32" and \
            all(t in quant_gguf.HALF_SCALED for t in types)
        return "float16" if half else "float32"

    def _float_as_stored(self, types: list[str]) -> QuantFormat | None:
        """A weight stored as floats, under as-stored: its 16 bits where every part has the same 16-bit
        type (f16 / bf16, widened to float32 in its matmul: exact, half float32's bytes), else None
        (float, in the compute dtype: float32 tensors, float16 ones under float16 compute, mixed parts)."""
        kinds = {_HALF_KINDS.get(t) for t in types}
        kind = kinds.pop() if len(kinds) == 1 else None
        if kind is None or not self.half_storage or (kind == "f16" and self.scheme.model_dtype == "float16"):
            return None
        self._kept.update(f"{t} as {kind}" for t in types)
        return QuantFormat(kind, 32, "float32")

    def _at_the_ends(self, name: str) -> bool:
        """Whether a weight is in the first or last eighth of the layers (round(layers / 8) each
        side), which the 4-bit schemes keep 8-bit: the most sensitive layers (llama.cpp's Q4_K_M
        gives their attn_v and ffn_down more bits).

        SmolLM2 (30 layers) q4f32 perplexity against q0f32, on tests/data/perplexity.txt and on
        held-out text: +16% / +17% with all layers 4-bit (before the scale search), +13% / +8%
        with the scale search, +3% / +2% with layers 0-3 and 26-29 8-bit as well (parameters
        98 -> 113 MB); their qkv and down weights alone gave +3% / +8%."""
        layer, layers = _layer_of(name), int(self.hf_config.get("num_hidden_layers", 0))
        ends = round(layers / 8)
        return layer is not None and (layer < ends or layer >= layers - ends)

    def finish(self) -> None:
        if self._kept_8bit:
            layers = sorted({i for i in map(_layer_of, self._kept_8bit) if i is not None})
            parts = [f"the LM head ({n})" for n in self._kept_8bit if _layer_of(n) is None]
            if layers:
                parts.append(f"layers {', '.join(map(str, layers))} (the first and last eighth)")
            self.notes.append(f"{self.scheme.name} keeps {len(self._kept_8bit)} weights 8-bit: {' and '.join(parts)}")
        origin = self.stored_quant
        if self._kept:
            kept = ", ".join(f"{n} {how}" for how, n in sorted(self._kept.items()))
            self.notes.append(f"{origin} weights kept bit-exact (as-stored): {kept}")
        for (t, kind), names in sorted(self._requantized.items()):
            if kind == "q8" and (t == "MXFP4" or origin == "MXFP4"):   # quant_pack._q8_scale: a block's power of two
                self.notes.append("MXFP4 tensors as q8 with each block's power-of-two scale (exact): "
                                  f"{_compact(names)}")
                continue
            self.notes.append(f"{'GGUF ' if origin == 'GGUF' else ''}{t} tensors re-quantized to {kind} (lossy): "
                              f"{_compact(names)}")

    # -- converting the weights ----------------------------------------------------------
    def weight_names(self, param_names: list[str]) -> list[str]:
        """The weights (weight-map keys) behind the module's parameters, in parameter order."""
        return list(dict.fromkeys(self._planes.get(p, p) for p in param_names))

    def convert(self, name: str, entry: list[str] | WeightSpec, source: ModelSource,
                float_shape: tuple[int, ...] | None = None, float_dtype: str | None = None) -> dict[str, np.ndarray]:
        """One weight's HF tensors -> {artifact tensor name: array}, one HF tensor at a time
        (a weight with a transform: all of them, concatenated and transformed, at once).

        float_shape, float_dtype: the shape the config implies for a weight kept as float, and the dtype
        its module declares."""
        spec, fmt = weight_spec(entry), self.formats.get(name)
        if fmt is None or spec.transform is not None:
            parts = [source.weights.get(n) for n in spec.hf_names]
            if spec.apart:
                value = spec.transform(parts)
            else:
                value = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
                value = spec.transform(value) if spec.transform is not None else value
            if fmt is not None:
                return self._planes_dict(name, fmt, [_quantized(fmt, value, name, source)], source)
            _check_shape(source, name, value.shape, float_shape or value.shape)
            return self.scheme.convert(name, value, float_dtype)
        cols = self.shapes[name][1]
        return self._planes_dict(name, fmt, [self._planes_of(fmt, n, source, cols) for n in spec.hf_names], source)

    def _planes_dict(self, name: str, fmt: QuantFormat, planes: list, source: ModelSource) -> dict[str, np.ndarray]:
        """Per-tensor planes, concatenated along N, as {artifact tensor name: array}."""
        rows, cols = self.shapes[name]
        _check_shape(source, name, (sum(p["qweight"].shape[0] for p in planes), cols), (rows, cols))
        prefix = name[: -len(".weight")]
        return {f"{prefix}.{plane}": np.ascontiguousarray(np.concatenate([p[plane] for p in planes], axis=0))
                for plane in fmt.plane_names}

    def _planes_of(self, fmt: QuantFormat, hf_name: str, source: ModelSource, cols: int) -> quant_pack.Planes:
        if self.scheme.as_stored:
            type_name = source.weights.tensor_type(hf_name)
            if _exact_form(source, hf_name, type_name) == (fmt.kind, fmt.group_size):
                if type_name in quant_gguf.GGUF_EXACT:
                    _, raw, shape = source.weights.get_raw(hf_name)
                    _check_shape(source, hf_name, (shape[0], shape[-1]), (shape[0], cols))
                    return quant_gguf.from_gguf_blocks(type_name, raw, fmt.scale_dtype)
                stored = source.weights.stored_codes(hf_name)
                _check_shape(source, hf_name, stored.codes.shape[1:], (cols,))
                return quant_prequant.from_stored_codes(stored, fmt.kind)
        w = source.weights.get(hf_name)
        _check_shape(source, hf_name, w.shape[1:], (cols,))
        return _quantized(fmt, w, hf_name, source)

    # -- the artifact's record -------------------------------------------------------------
    def describe(self) -> dict:
        """kiln-config.json "quantization": the scheme, and each weight format used."""
        used = Counter(self._label(fmt) for fmt in self.formats.values())
        formats = {self._label(fmt): fmt.describe() for fmt in self.formats.values() if fmt is not None}
        out: dict = {"name": self.scheme.name, "dtype": self.scheme.model_dtype}
        if formats:
            main = max(formats, key=lambda k: used[k])
            out.update({k: formats[main][k] for k in ("bits", "group_size") if k in formats[main]})
        out["formats"] = {k: {**formats.get(k, {}), "weights": n} for k, n in sorted(used.items())}
        if len(used) > 1:                                   # mixed: every weight's format
            out["tensors"] = {name: self._label(fmt) for name, fmt in self.formats.items()}
        return out

    def _label(self, fmt: QuantFormat | None) -> str:
        """A format's name in notes and kiln-config.json: its kind, with the group size when not 32 and
        "-f16scales" for float16 scales under float32 compute; a float weight's: the compute dtype."""
        if fmt is None:
            return self.scheme.model_dtype
        half = fmt.scale_dtype == "float16" and self.scheme.model_dtype == "float32"
        return _label(fmt.kind, fmt.group_size) + ("-f16scales" if half else "")


def _exact_form(source: ModelSource, hf_name: str, type_name: str) -> tuple[str, int] | None:
    """(kiln kind, group size) holding a stored quantized tensor's values exactly, or None: a GGUF
    type's (quant_gguf.GGUF_EXACT), a GPTQ / AWQ / compressed-tensors weight's (quant_prequant)."""
    if type_name in quant_gguf.GGUF_EXACT:
        has_raw = getattr(source.weights, "has_raw", None)
        return quant_gguf.GGUF_EXACT[type_name] if has_raw is None or has_raw(hf_name) else None
    form = source.weights.stored_form(hf_name) if hasattr(source.weights, "stored_form") else None
    return None if form is None else (quant_prequant.stored_kind(form[0], form[2]), form[1])


def _label(kind: str, group_size: int) -> str:
    """A format's name in notes and kiln-config.json: its kind, with the group size when not 32."""
    return kind if group_size == 32 else f"{kind}g{group_size}"


def _compact(names: list[str]) -> str:
    """HF tensor names with their layer indices folded: model.layers.{0-3,7}.mlp.down_proj.weight."""
    layers: dict[str, list[int]] = {}
    for name in names:
        i = _layer_of(name)
        key = name if i is None else name.replace(f".layers.{i}.", ".layers.{}.", 1)
        layers.setdefault(key, []).extend([] if i is None else [i])
    out = []
    for key, ids in layers.items():
        ids, runs = sorted(set(ids)), []
        for i in ids:
            if runs and i == runs[-1][1] + 1:
                runs[-1][1] = i
            else:
                runs.append([i, i])
        span = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
        out.append(key.replace("{}", f"{{{span}}}" if len(runs) > 1 or runs[0][0] != runs[0][1] else span)
                   if ids else key)
    return ", ".join(out)


def _layer_of(name: str) -> int | None:
    """The decoder layer index in a weight name (model.layers.<i>.), or None."""
    match = re.search(r"\.layers\.(\d+)\.", name)
    return int(match.group(1)) if match else None


def _quantized(fmt: QuantFormat, w: np.ndarray, name: str, source: ModelSource) -> quant_pack.Planes:
    """quant_pack.quantize, its refusals (NaN or infinite weights) naming the tensor and the file."""
    try:
        return quant_pack.quantize(fmt, w)
    except ValueError as e:
        raise ModelLoadError(f"{source.path}: {name}: {e}") from None


def _check_shape(source: ModelSource, name: str, got: tuple, expected: tuple) -> None:
    if tuple(got) != tuple(expected):
        raise ModelLoadError(f"{source.path}: {name} has shape {tuple(got)}, the config implies "
                             f"{tuple(expected)}; config.json does not match the weights")


def _swap_modules(module: nn.Module, prefix: str, replace: Callable[[str, nn.Module], nn.Module]) -> None:
    """Walk the module tree; put replace(path, child) in place of each child module."""
    for attr, child in list(vars(module).items()):
        path = f"{prefix}{attr}"
        if isinstance(child, nn.ModuleList):
            for i, item in enumerate(child):
                new = replace(f"{path}.{i}", item)
                if new is item:
                    _swap_modules(item, f"{path}.{i}.", replace)
                else:
                    child[i] = new
        elif isinstance(child, nn.Module):
            new = replace(path, child)
            if new is child:
                _swap_modules(child, f"{path}.", replace)
            else:
                setattr(module, attr, new)
