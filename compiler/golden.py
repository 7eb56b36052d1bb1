"""Golden logits: a reference's top-k logits on a few short prompts, stored in the artifact
(contract.write_golden) so that `kiln check` can tell a correct build from a wrong one anywhere it runs.

The reference is transformers on the same weights in float32 when it can build the model (a Hugging
Face folder; the config and dequantized tensors of a GGUF or a GPTQ / AWQ / compressed-tensors
checkpoint as kiln reads them); otherwise the caller's fallback (the face passes kiln's own float32
build of the same source for the host). Cheap by design: three prompts of at most 16 tokens, one forward each.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from kiln.runtime.contract import GoldenPrompt

TOP_K = 32
MAX_TOKENS = 16
TEXTS = ("The capital of France is Paris, and the capital of Germany is",
         "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
         "Once upon a time, in a small village by the sea, there lived a")

LogitsFn = Callable[[list[int]], np.ndarray]            # token ids [n] -> logits [n, vocab]
Reference = tuple[LogitsFn, str]                        # (the forward, what it is, for the artifact's record)


def golden_prompts(tokenizer_json: Path | None, vocab_size: int, bos_token_id: int | None) -> list[list[int]]:
    """TEXTS through the model's tokenizer (BOS first when the model has one), cut to MAX_TOKENS;
    seeded random ids when there is no tokenizer.json."""
    bos = [bos_token_id] if bos_token_id is not None and bos_token_id < vocab_size else []
    if tokenizer_json is not None and tokenizer_json.is_file():
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(tokenizer_json))
        prompts = [bos + [i for i in tok.encode(t, add_special_tokens=False).ids if i < vocab_size] for t in TEXTS]
        if all(len(p) >= 4 for p in prompts):
            return [p[:MAX_TOKENS] for p in prompts]
    rng = np.random.default_rng(0)
    return [bos + rng.integers(0, vocab_size, size=n - len(bos)).tolist() for n in (8, 12, MAX_TOKENS)]


def transformers_reference(source) -> Reference | tuple[None, str]:
    """transformers' float32 forward over the source's weights, or (None, why it cannot read them)."""
    try:
        import torch
        import transformers
    except ImportError:
        return None, "transformers is not installed"
    if source.format not in ("hf", "gguf"):
        return None, f"transformers does not read {source.format} models"
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):
            own = (source.format == "hf" and source.stored_quant in (None, "MXFP4")     # transformers reads MXFP4
                   and not _custom_code(source.hf_config) and not source.adapter)    # a LoRA: merged tensors
            read = _hf_model if own else _model_from_tensors
            model = read(source, torch, transformers)
            model = looped(model, source.hf_config, torch).eval()      # Nanbeige's layers in loops; else itself
    except Exception as e:      # an architecture this transformers lacks, a config it rejects
        return None, f"transformers cannot load it ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    finally:
        transformers.logging.set_verbosity(verbosity)

    def forward(ids: list[int]) -> np.ndarray:
        # eagerly: transformers' BitNet layers are torch.compile'd (tens of seconds of inductor here)
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):
            return model(torch.tensor([ids])).logits[0].float().numpy()
    via = f" ({source.stored_quant} tensors as kiln reads them)" if source.stored_quant else ""
    if source.format == "hf" and source.stored_quant == "MXFP4":
        via = " (its MXFP4 experts dequantized by transformers)"
    return forward, f"transformers {transformers.__version__} float32{via}"


def _custom_code(hf_config: dict) -> bool:
    """A checkpoint transformers has no class for, whose language model kiln reads (models/vision_text.py CUSTOM):
    the reference is transformers' model of that language model, over the tensors as kiln reads them."""
    from kiln.models.vision_text import CUSTOM
    return bool(set(hf_config.get("architectures") or []) & set(CUSTOM))


def _hf_model(source, torch, transformers):
    load = dict(dtype=torch.float32, attn_implementation="eager")
    qc = source.hf_config.get("quantization_config") or {}
    if str(qc.get("quant_method", "")).lower() == "mxfp4":      # gpt-oss's experts: dequantized on the host
        load["quantization_config"] = transformers.Mxfp4Config(dequantize=True)
    with tempfile.TemporaryDirectory() as tmp:
        path, hf_config = _as_stand_in(source, Path(tmp))
        return _causal_lm(transformers, hf_config, lambda cls: cls.from_pretrained(path, **load))


def _stand_in(hf_config: dict) -> tuple[str, str] | None:
    """(model type, class) of the transformers class that runs a family whose own code transformers lacks (its config
    class's STAND_IN), else None."""
    from kiln.models.registry import find_architecture
    try:
        return getattr(find_architecture(hf_config).config_cls, "STAND_IN", None)
    except Exception:           # not a registered family: transformers decides alone
        return None


def looped(model, hf_config: dict, torch):
    """`model` (a Llama of transformers) with its layers run num_loops times, its final norm between loops unless
    skip_loop_final_norm, where config.json loops them (Nanbeige 4.2, as llama.cpp's nanbeige graph runs it); else
    itself."""
    loops = hf_config.get("num_loops") or 1
    if hf_config.get("model_type") != "nanbeige" or loops == 1:
        return model
    skip = bool(hf_config.get("skip_loop_final_norm"))

    class Looped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, ids):
            m = self.inner.model
            x = m.embed_tokens(ids)
            positions = torch.arange(ids.shape[1])[None]
            rope = m.rotary_emb(x, positions)
            mask = torch.full((ids.shape[1],) * 2, float("-inf")).triu(1)[None, None]
            for j in range(loops):
                if j and not skip:
                    x = m.norm(x)
                for layer in m.layers:
                    x = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rope)
            return type("Output", (), {"logits": self.inner.lm_head(m.norm(x))})
    return Looped()


def _as_stand_in(source, tmp: Path) -> tuple[Path, dict]:
    """(the folder transformers loads, its config): the source's own, or for a format whose code transformers lacks
    but whose computation one of its classes runs (the family's config class STAND_IN: model type, class), a folder
    of links to the source's files with config.json naming that class."""
    stand_in = _stand_in(source.hf_config)
    if stand_in is None:
        return source.path, source.hf_config
    model_type, cls = stand_in
    hf_config = dict(source.hf_config, model_type=model_type, architectures=[cls])
    hf_config.pop("auto_map", None)
    for f in Path(source.path).iterdir():
        if f.name != "config.json":
            (tmp / f.name).symlink_to(f.resolve())
    (tmp / "config.json").write_text(json.dumps(hf_config))
    return tmp, hf_config


def _causal_lm(transformers, hf_config: dict, build):
    """build(AutoModelForCausalLM), or where no causal LM is registered for the model type (Mistral 4)
    build(the class config.json's architectures name)."""
    try:
        return build(transformers.AutoModelForCausalLM)
    except ValueError:
        named = [c for a in hf_config.get("architectures") or [] if (c := getattr(transformers, a, None))]
        if not named:
            raise
        return build(named[0])


def _no_init():
    """transformers' context that skips weight initialisation, where this version has one."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        return contextlib.nullcontext()
    return no_init_weights()


def _model_from_tensors(source, torch, transformers):
    """transformers' model built from the config kiln read, with the tensors as kiln's reader hands them
    over (dequantized, Hugging Face layout): transformers' own GGUF loader drops settings kiln reads
    (Llama 3 RoPE factors, Gemma soft-capping, per-layer RoPE bases), and its GPTQ, AWQ and
    compressed-tensors loaders need those packages and their kernels."""
    cfg = dict(source.hf_config, pad_token_id=None)     # no effect on logits; a default may lie outside the vocab
    qc = cfg.pop("quantization_config", None) or {}
    model_type = cfg.pop("model_type")
    if (stand_in := _stand_in(source.hf_config)) is not None:
        model_type, cfg["architectures"] = stand_in[0], [stand_in[1]]
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    with _no_init():            # every weight is loaded below: a random init is wasted (SmolLM2: 2.8 s)
        model = _causal_lm(transformers, source.hf_config, lambda cls: (
            cls.from_config if cls is transformers.AutoModelForCausalLM else cls._from_config)(
            config, dtype=torch.float32, attn_implementation="eager"))
    bitnet = str(qc.get("quant_method", "")).lower() == "bitnet"
    if bitnet:          # BitNet's Linears as transformers' own (8-bit activations; a GGUF's: AutoBitLinear, offline)
        from transformers.integrations.bitnet import replace_with_bitnet_linear
        model = replace_with_bitnet_linear(model, modules_to_not_convert=["lm_head"],
                                           quantization_config=transformers.BitNetQuantConfig(**qc))
    state = {name: torch.from_numpy(np.asarray(source.weights.get(name), np.float32)) for name in source.weights.names()}
    state = _checkpoint_renames(state, config.model_type, set(model.state_dict()))
    state = _fused_experts(state, set(model.state_dict()), torch)
    if "embed_out.weight" in state and "lm_head.weight" not in state:     # GPT-NeoX's checkpoint name
        state["lm_head.weight"] = state.pop("embed_out.weight")
    missing, _ = model.load_state_dict(state, strict=False, assign=bitnet)    # (its Linears were made on meta)
    tied = {"lm_head.weight"} if config.get_text_config().tie_word_embeddings else set()
    missing = [m for m in missing if m not in tied and not m.endswith(("rotary_emb.inv_freq", "attn.bias",
                                                                       "attn.masked_bias"))]
    if missing:
        raise ValueError(f"the {source.stored_quant} source lacks {missing[:3]} under transformers' names")
    model.tie_weights()
    return model


def _checkpoint_renames(state: dict, model_type: str, model_keys: set) -> dict:
    """`state` with the checkpoint names transformers renames at load for this model type (its
    conversion mapping's plain renames, in order: EXAONE 3's transformer.h.N.attn.attention.* ->
    model.layers.N.self_attn.*) where a name is not the model's own."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        from transformers.core_model_loading import WeightRenaming
    except ImportError:             # a transformers without conversion mappings renames nothing
        return state
    renames = [(re.compile(src), dst) for r in get_checkpoint_conversion_mapping(model_type) or ()
               if type(r) is WeightRenaming and len(r.source_patterns) == len(r.target_patterns)
               for src, dst in zip(r.source_patterns, r.target_patterns)]
    if not renames:
        return state
    out = {}
    for key, value in state.items():
        new = key
        if key not in model_keys:
            for pattern, target in renames:
                new = pattern.sub(target, new)
        out[new] = value
    return out


_EXPERT_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))     # Qwen / OLMoE, Mixtral


def _fused_experts(state: dict, model_keys: set, torch) -> dict:
    """`state` with each MoE layer's per-expert tensors (checkpoint names, as kiln's readers hand them over)
    stacked into transformers 5's fused parameters (experts.gate_up_proj [experts, gate rows + up rows,
    cols], experts.down_proj), and Mixtral's router (block_sparse_moe.gate) under its module's name
    (mlp.gate); Granite MoE's stacked input_linear / output_linear and router.layer renamed to them; a
    router's choice bias under transformers' module name (_CHOICE_BIAS_NAMES)."""
    for key in sorted(k for k in model_keys if k.endswith(".experts.gate_up_proj") and k not in state):
        mlp = key[: -len(".experts.gate_up_proj")]
        if f"{mlp}.input_linear.weight" in state:             # Granite MoE: stacked already, other names
            state[key] = state.pop(f"{mlp}.input_linear.weight")
            state[f"{mlp}.experts.down_proj"] = state.pop(f"{mlp}.output_linear.weight")
            state[f"{mlp}.router.weight"] = state.pop(f"{mlp}.router.layer.weight")
            continue
        for prefix in (mlp, mlp.replace(".mlp", ".block_sparse_moe")):
            for gate, up, down in _EXPERT_NAMES:
                count = 0
                while f"{prefix}.experts.{count}.{gate}.weight" in state:
                    count += 1
                if not count:
                    continue
                take = [[state.pop(f"{prefix}.experts.{j}.{p}.weight") for p in (gate, up, down)] for j in range(count)]
                state[key] = torch.stack([torch.cat([g, u]) for g, u, _ in take])
                state[f"{mlp}.experts.down_proj"] = torch.stack([d for _, _, d in take])
                if f"{prefix}.gate.weight" in state and f"{mlp}.gate.weight" not in state:
                    state[f"{mlp}.gate.weight"] = state.pop(f"{prefix}.gate.weight")
    for old, new in _CHOICE_BIAS_NAMES:
        for key in [k for k in state if k.endswith(old) and k not in model_keys]:
            if key.replace(old, new) in model_keys:
                state[key.replace(old, new)] = state.pop(key)
    return state


# A router's choice bias under its checkpoint name -> transformers' module name (transformers' loader renames
# these: MiniMax-M2, ERNIE 4.5 MoE, K-EXAONE).
_CHOICE_BIAS_NAMES = ((".block_sparse_moe.e_score_correction_bias", ".mlp.e_score_correction_bias"),
                      (".mlp.moe_statics.e_score_correction_bias", ".mlp.gate.moe_statics.e_score_correction_bias"),
                      (".mlp.e_score_correction_bias", ".mlp.gate.e_score_correction_bias"))


def compute_golden(prompts: list[list[int]], forward: LogitsFn, report: Callable[[str, int, int], None],
                   top_k: int = TOP_K) -> list[GoldenPrompt]:
    """Each prompt's top-k ids and logits at every position, reporting ("golden", i, n)."""
    out = []
    report("golden", 0, len(prompts))
    for i, ids in enumerate(prompts):
        logits = np.asarray(forward(list(ids)), dtype=np.float32)          # [n, vocab]
        k = min(top_k, logits.shape[-1])
        top = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
        out.append(GoldenPrompt(np.asarray(ids, np.int32), top.astype(np.int32),
                                np.take_along_axis(logits, top, axis=-1)))
        report("golden", i + 1, len(prompts))
    return out

