"""Reading Hugging Face config.json dicts into kiln's frozen config dataclasses."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

_REQUIRED = object()


@dataclass(frozen=True)
class ConfigField:
    """One config field: the HF names it may appear under, in order, and its default.

    `default` may name another field ("num_attention_heads") whose value is used
    when none of the names is present; `_REQUIRED` (the default) makes it mandatory.
    """

    name: str
    hf_names: tuple[str, ...]
    default: Any = _REQUIRED


def fields_with(base: tuple[ConfigField, ...], *fields: ConfigField) -> tuple[ConfigField, ...]:
    """`base` with each of `fields` in place of the base field of its name, or after them where base has none
    (a family's FIELDS: the shared ones with its own names and defaults, then its own)."""
    names = {f.name for f in base}
    given = {f.name: f for f in fields}
    return (*(given.get(f.name, f) for f in base), *(f for f in fields if f.name not in names))


def refuse_unlike(hf: dict, wanted, arch: str) -> None:
    """A ValueError naming the first config.json key of `wanted` ((key, the value kiln runs) pairs) whose value the
    config sets otherwise: settings of a family's checkpoints that its transformers model does not run either."""
    for key, want in wanted:
        if hf.get(key, want) != want:
            raise ValueError(f"{arch} with {key} {hf[key]!r} is not supported (its transformers model runs "
                             f"{want!r}); fix config.json")


def one_of(table: dict, value, field: str, arch: str):
    """table[value], the kiln name of a config value; a ValueError naming the field and what is supported."""
    if value not in table:
        raise ValueError(f"{field} {value!r} is not supported for {arch} (supported: {', '.join(table)})")
    return table[value]


def window_of(values: dict) -> int | None:
    """config.json's sliding window where it slides: None where it is unset, 0, or no shorter than the context (such
    sliding layers attend to every position: plain attention)."""
    window = values["sliding_window"]
    return window if window and window < values["context_window_size"] else None


def layer_types(types, n: int, hf: dict, pattern: int) -> tuple[str, ...]:
    """Each of the `n` layers' attention: config.json's `layer_types`, else every `pattern`-th layer global
    (`sliding_window_pattern` where the config writes one: a count, or a string of L (local) and G
    (global) repeated, EXAONE 4's "LLLG") and the others sliding; a ValueError for a list of another
    length or kind."""
    pattern = hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or pattern
    if not types and isinstance(pattern, str):
        if set(pattern) - {"L", "G"} or not pattern:
            raise ValueError(f"sliding_window_pattern {pattern!r} must be a string of L and G; fix config.json")
        types = ["sliding_attention" if pattern[i % len(pattern)] == "L" else "full_attention" for i in range(n)]
    types = types or ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
    if len(types) != n or set(types) - {"full_attention", "sliding_attention"}:
        raise ValueError(f"layer_types must list 'full_attention' or 'sliding_attention' for each of the {n} "
                         f"layers; got {types}")
    return tuple(types)


def dense_layers(kinds, n: int, first_dense: int) -> tuple[int, ...]:
    """The layers whose MLP is dense: config.json's `mlp_layer_types` ("dense" | "sparse" each), else the first
    `first_dense` (first_k_dense_replace); a ValueError for a list of another length or kind."""
    kinds = kinds or ["dense" if i < first_dense else "sparse" for i in range(n)]
    if len(kinds) != n or set(kinds) - {"dense", "sparse"}:
        raise ValueError(f"mlp_layer_types must list 'dense' or 'sparse' for each of the {n} layers; got {kinds}")
    return tuple(i for i, k in enumerate(kinds) if k == "dense")


def one_partial_rotary(hf: dict, arch: str) -> dict:
    """RoPE per layer type whose types each give a partial_rotary_factor (Mellum, MiMo-V2-Flash): the one factor as
    config.json's own, taken out of each type's parameters; a ValueError where the types differ (kiln rotates the
    same dims on every layer). Other configs are returned as they are."""
    params = hf.get("rope_parameters")
    if not (isinstance(params, dict) and "full_attention" in params):
        return hf
    partial = {(p or {}).get("partial_rotary_factor", 1.0) for p in params.values()}
    if len(partial) > 1:
        raise ValueError(f"{arch} with partial_rotary_factor {sorted(partial)} per layer type is not supported (kiln "
                         "rotates the same dims on every layer)")
    return {**hf, "partial_rotary_factor": partial.pop(),
            "rope_parameters": {t: {k: v for k, v in (p or {}).items() if k != "partial_rotary_factor"}
                                for t, p in params.items()}}


def split_layer_rope(hf: dict, full_theta: float, local_theta: float) -> dict:
    """transformers 5's RoPE per layer type (`rope_parameters: {full_attention: {...}, sliding_attention:
    {...}}`, Gemma 3, OLMo 3) as flat fields: `rope_theta` and `rope_scaling` for full layers,
    `rope_local_base_freq` for sliding ones (which rotate unscaled; a scaled one is refused). Other dicts
    are returned as they are."""
    params = hf.get("rope_parameters")
    if not (isinstance(params, dict) and "full_attention" in params):
        return hf
    full, local = params["full_attention"] or {}, params.get("sliding_attention") or {}
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"rope_parameters.sliding_attention type {local['rope_type']!r} is not supported (sliding "
                         "layers rotate unscaled); fix config.json")
    scaling = {k: v for k, v in full.items() if k != "rope_theta"}
    default = scaling.get("rope_type", "default") == "default"
    flat = {k: v for k, v in hf.items() if k != "rope_parameters"}
    return {**flat, "rope_theta": full.get("rope_theta", full_theta), "rope_scaling": None if default else scaling,
            "rope_local_base_freq": local.get("rope_theta", local_theta)}


def text_model(hf: dict) -> tuple[dict, str]:
    """A multimodal config.json's text model (Gemma3ForConditionalGeneration, Mistral3ForConditionalGeneration)
    as its own config (text_config, with the outer eos/bos ids) and the prefix its weights are under
    (model.language_model in transformers 5, language_model.model in 4); a text-only one as it is, "model"."""
    if not isinstance(hf.get("text_config"), dict):
        return hf, "model"
    v5 = int(str(hf.get("transformers_version", "4")).split(".")[0]) >= 5
    return ({**hf["text_config"], **{k: hf[k] for k in ("eos_token_id", "bos_token_id") if k in hf}},
            "model.language_model" if v5 else "language_model.model")


# M-RoPE's rope types -> the RoPE each is on a text prompt (HunYuan-VL's XD-RoPE: its NTK "dynamic" at a fixed alpha)
_AS_ROPE = {"mrope": "default", None: "default", "xdrope": "dynamic"}


def mrope_as_rope(text: dict) -> dict:
    """A vision-language text model's config with its M-RoPE (rope_scaling type "mrope", or rope_parameters /
    rope_scaling with an mrope_section; HunYuan-VL's "xdrope" with an xdrope_section) read as the RoPE it is on a
    text prompt: its time, height and width sections (and HunYuan-VL's image index) turn by one position, the
    token's (Qwen2-VL, Qwen3-VL, GLM-4.1V, HunYuan-VL)."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = text.get(key)
        if isinstance(rope, dict) and ({"mrope_section", "xdrope_section"} & rope.keys()
                                       or rope.get("type") in ("mrope", "xdrope")):
            kind = rope.get("rope_type", rope.get("type"))
            rope = {k: v for k, v in rope.items()
                    if k not in ("type", "mrope_section", "xdrope_section", "mrope_interleaved")}
            text = {**text, key: {**rope, "rope_type": _AS_ROPE.get(kind, kind)}}
    return text


class TextModelOf:
    """A config class (mixed in before its base) that reads a multimodal config.json's text model
    (text_model) and keeps the prefix of its weights in its `weight_prefix` field."""

    @classmethod
    def from_hf(cls, hf: dict):
        hf, prefix = text_model(hf)
        return dataclasses.replace(super().from_hf(hf), weight_prefix=prefix)


def read_fields(hf: dict, fields: tuple[ConfigField, ...], arch: str) -> dict[str, Any]:
    """Pick each field from `hf`; raise one ValueError listing every missing field and the names tried."""
    values: dict[str, Any] = {}
    missing = []
    for f in fields:
        found = next((hf[n] for n in f.hf_names if n in hf and hf[n] is not None), _REQUIRED)
        if found is _REQUIRED:
            if f.default is _REQUIRED:
                missing.append(f"{f.name} (tried: {', '.join(f.hf_names)})")
                continue
            found = values.get(f.default, f.default) if isinstance(f.default, str) else f.default
        values[f.name] = found
    if missing:
        raise ValueError(f"config for a {arch} model is missing " + "; ".join(missing)
                         + ". Fix config.json or pass a complete Hugging Face model directory.")
    return values
