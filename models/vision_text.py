"""Vision-language checkpoints whose language model is a family kiln reads: that model, alone.

LLaVA (1.5, NeXT, OneVision, OneVision-1.5, NeXT-Video, Video-LLaVA, ViP-LLaVA), Idefics2 / Idefics3 / SmolVLM,
InternVL (its Hugging Face format, and its own code's: InternVLChatModel, whose language model is llm_config), Aya
Vision, Command A Vision, LFM2-VL / LFM3-VL, Ovis2 / Ovis2.5, LightOnOCR, EXAONE 4.5, Kimi K2.5, Step 3.7,
DeepSeek-VL, Janus, MiniCPM-V 4.6 / 4.7, Apertus 1.5, MiniMax-M3, Aria, VideoLLaMA 3, Granite 4 Vision,
Granite-Docling, HunYuan-VL, MiniCPM-OCR, Qianfan-OCR, HyperCLOVA X Vision, Cosmos 3 Omni, GLM-OCR, PaddleOCR-VL,
DeepSeek-OCR 2, GOT-OCR 2.0, Cosmos 3 Edge, ERNIE 4.5 VL, Cohere Compass, FastVLM, Perception LM, Nemotron 3 Nano Omni,
Muse Spark (WRAPPERS) put a vision tower and a
projector before a causal language model of another family (Llama, Mistral, Qwen2, Qwen3, Qwen3.5, LFM2, Cohere 2,
EXAONE 4, DeepSeek-V3, Step 3.5, Granite, HunYuan, HyperCLOVA X, Nemotron-H, ...), described by config.json's
text_config;
Voxtral an audio tower before a Llama / Mistral; Emu3 a VQ-VAE whose image codes are tokens of its Llama's
vocabulary; Fuyu a projection of image patches before a Persimmon; Qwen2.5-Omni and Qwen3-Omni a vision and an audio
tower before their thinker's Qwen2 / Qwen3-MoE (thinker_config.text_config, weights under `thinker.`; the whole
checkpoint adds a talker and a speech decoder). kiln reads text, so it reads that language model: its config is
text_config (with the outer eos / bos ids), its tensors the ones under the language model's prefix, renamed as the
family's own checkpoint names them (`model.*`, `lm_head`), and the towers' are left unread (a note says so). On a
text prompt the wrapper's forward is the language model's (the image or audio tokens are where the projected
features go, and a text prompt has none), so transformers' class for the whole checkpoint is the reference where it
has a forward (tests/numerics/test_vision_text.py; CUSTOM: the language model's class over the tensors kiln reads).

Where the language model's tensors are is read from the file, not from the transformers version that wrote it:
`language_model.model.*` and `language_model.lm_head` (LLaVA's and InternVL's as released, which transformers
keeps), `model.language_model.*` and `lm_head`, `model.text_model.*` (Idefics2/3, SmolVLM), `thinker.model.*` or
`thinker.model.language_model.*` and `thinker.lm_head` (the Omni models), `text_model.*` and `text_model.lm_head`
(Emu3 as released), `language_model.backbone.*` (Nemotron 3 Nano Omni's Nemotron-H, read under `backbone.` as that
family's checkpoints name it: FAMILY_ROOT). Its head is tied to
the embedding where the file has none, or config.json ties it.

Llama 3.2 Vision (Mllama) is a Llama 3 whose cross-attention layers (`cross_attention_layers`, reading the image)
transformers skips on a text prompt: kiln reads its other layers, in order, as the Llama they make, and the
embedding's first vocab_size rows (its 8 more are image tokens no text prompt holds).

Apertus 1.5 reads images and audio as codes of its vocabulary (tokenizer models left unread) and prunes its head to
the text's ids (`output_vocab_size`): kiln reads the model of the head's vocabulary, the embedding's first rows,
alone or inside the wrapper (pruned_vocab_of).

GLM-4.1V's and GLM-4.5V's language models are GLM-4-0414 and GLM-4.5 (glm4, glm4_moe) whose M-RoPE turns a
text prompt as their RoPE does (models/config.py mrope_as_rope).

Gemma 3, Mistral 3, Llama 4 and the Qwen VL models have families of their own (their text models differ from
the plain family's); PaliGemma is refused: it attends over its prompt both ways (a prefix LM).
"""

from __future__ import annotations

import dataclasses
import re

from .config import mrope_as_rope
from .source import ModelLoadError, ModelSource

# config.json architectures -> what the note calls it
WRAPPERS = {
    "LlavaForConditionalGeneration": "LLaVA", "LlavaNextForConditionalGeneration": "LLaVA-NeXT",
    "LlavaOnevisionForConditionalGeneration": "LLaVA-OneVision", "Idefics3ForConditionalGeneration": "Idefics3",
    "SmolVLMForConditionalGeneration": "SmolVLM", "InternVLForConditionalGeneration": "InternVL",
    "AyaVisionForConditionalGeneration": "Aya Vision", "MllamaForConditionalGeneration": "Llama 3.2 Vision",
    "Glm4vForConditionalGeneration": "GLM-4.1V", "Glm4vMoeForConditionalGeneration": "GLM-4.5V",
    "InternVLChatModel": "InternVL", "Cohere2VisionForConditionalGeneration": "Command A Vision",
    "VoxtralForConditionalGeneration": "Voxtral",
    "Lfm2VlForConditionalGeneration": "LFM2-VL", "Lfm3VlForConditionalGeneration": "LFM3-VL",
    "Idefics2ForConditionalGeneration": "Idefics2", "VipLlavaForConditionalGeneration": "ViP-LLaVA",
    "LlavaNextVideoForConditionalGeneration": "LLaVA-NeXT-Video", "VideoLlavaForConditionalGeneration": "Video-LLaVA",
    "LightOnOcrForConditionalGeneration": "LightOnOCR", "Ovis2ForConditionalGeneration": "Ovis2",
    "Ovis2_5ForConditionalGeneration": "Ovis2.5", "Glm46VForConditionalGeneration": "GLM-4.6V",
    "Exaone4_5_ForConditionalGeneration": "EXAONE 4.5", "Kimi_K25ForConditionalGeneration": "Kimi K2.5",
    "KimiK25ForConditionalGeneration": "Kimi K2.5",
    "DeepseekVLForConditionalGeneration": "DeepSeek-VL", "DeepseekVLHybridForConditionalGeneration": "DeepSeek-VL",
    "JanusForConditionalGeneration": "Janus", "LlavaOnevision15ForConditionalGeneration": "LLaVA-OneVision-1.5",
    "Qwen2_5OmniThinkerForConditionalGeneration": "Qwen2.5-Omni",
    "Qwen3OmniMoeThinkerForConditionalGeneration": "Qwen3-Omni",
    "MiniCPMV4_6ForConditionalGeneration": "MiniCPM-V 4.6", "MiniCPMV4_7ForConditionalGeneration": "MiniCPM-V 4.7",
    "Qwen2_5OmniForConditionalGeneration": "Qwen2.5-Omni", "Qwen3OmniMoeForConditionalGeneration": "Qwen3-Omni",
    "Apertus1p5ForConditionalGeneration": "Apertus 1.5", "MiniMaxM3SparseForConditionalGeneration": "MiniMax-M3",
    "AriaForConditionalGeneration": "Aria", "Emu3ForConditionalGeneration": "Emu3", "FuyuForCausalLM": "Fuyu",
    "Step3p7ForConditionalGeneration": "Step 3.7",
    "VideoLlama3ForConditionalGeneration": "VideoLLaMA 3", "Granite4VisionForConditionalGeneration": "Granite 4 Vision",
    "GraniteDoclingForConditionalGeneration": "Granite-Docling", "HunYuanVLForConditionalGeneration": "HunYuan-VL",
    "MiniCPMOcrForConditionalGeneration": "MiniCPM-OCR", "QianfanOCRForConditionalGeneration": "Qianfan-OCR",
    "HyperCLOVAXVisionV2ForConditionalGeneration": "HyperCLOVA X Vision", "Cosmos3OmniForConditionalGeneration":
    "Cosmos 3 Omni", "GlmOcrForConditionalGeneration": "GLM-OCR", "PaddleOCRVLForConditionalGeneration": "PaddleOCR-VL",
    "DeepseekOcr2ForConditionalGeneration": "DeepSeek-OCR 2", "GotOcr2ForConditionalGeneration": "GOT-OCR 2.0",
    "DeepseekOCRForCausalLM": "DeepSeek-OCR", "DeepseekOCR2ForCausalLM": "DeepSeek-OCR 2",
    "Cosmos3EdgeForConditionalGeneration": "Cosmos 3 Edge", "Ernie4_5_VLMoeForConditionalGeneration": "ERNIE 4.5 VL",
    "CohereCompassForConditionalGeneration": "Cohere Compass", "MuseGlimmerForConditionalGeneration": "Muse Glimmer",
    "FastVlmForConditionalGeneration": "FastVLM", "PerceptionLMForConditionalGeneration": "Perception LM",
    "NemotronH_Omni_Reasoning_V3": "Nemotron 3 Nano Omni", "MuseSparkForConditionalGeneration": "Muse Spark",
}
OMNI = ("Qwen2_5OmniForConditionalGeneration", "Qwen3OmniMoeForConditionalGeneration")   # thinker, talker, vocoder
# what a note says is left unread, where not a vision tower and projector
UNREAD = {"VoxtralForConditionalGeneration": "audio tower and projector",
          "Emu3ForConditionalGeneration": "VQ-VAE image tokenizer",
          "FuyuForCausalLM": "image patches' projection (vision_embed_tokens)",
          "Qwen2_5OmniThinkerForConditionalGeneration": "vision and audio towers",
          "Qwen3OmniMoeThinkerForConditionalGeneration": "vision and audio towers",
          **{omni: "vision and audio towers, talker and speech decoder" for omni in OMNI},
          "Apertus1p5ForConditionalGeneration": "vision and audio tokenizers",
          "Cosmos3EdgeForConditionalGeneration": "vision tower, projector and generation branch",
          "Ernie4_5_VLMoeForConditionalGeneration": "vision tower, projector and vision experts",
          **dict.fromkeys(("NemotronH_Omni_Reasoning_V3", "MuseSparkForConditionalGeneration"),
                          "vision tower and projector (and audio tower, where it has one)")}
# where the language model's config is, where not text_config (the first of these paths config.json holds)
TEXT_CONFIG = {"InternVLChatModel": (("llm_config",),), **{omni: (("thinker_config", "text_config"),) for omni in OMNI},
               **dict.fromkeys(("DeepseekOCRForCausalLM", "DeepseekOCR2ForCausalLM"), (("language_config",),)),
               # Nemotron 3 Nano Omni as released names it llm_config, transformers text_config
               "NemotronH_Omni_Reasoning_V3": (("text_config",), ("llm_config",))}
# DeepSeek-OCR's own code's language model: a DeepSeek-V2 without latent attention (use_mla false), which is
# DeepSeek-OCR 2's text model (transformers' deepseek_ocr2_text)
DEEPSEEK_OCR = ("DeepseekOCRForCausalLM", "DeepseekOCR2ForCausalLM")
# wrappers transformers has no forward for (their own code, trust_remote_code; a generate-only whole):
# compiler/golden.py's reference is transformers' model of the language model over the tensors kiln reads
CUSTOM = ("InternVLChatModel", "KimiK25ForConditionalGeneration", *OMNI)
# text model types that are another family's model on a text prompt (M-RoPE read as RoPE: models/config.py)
AS_FAMILY = {"glm4v_text": "glm4", "glm4v_moe_text": "glm4_moe", "qwen2_5_omni_text": "qwen2",
             "qwen3_omni_moe_text": "qwen3_moe", "emu3_text_model": "llama",
             # Granite 4 Vision's adds the towers' features into image tokens' states before some layers: none on text
             "granite4_vision_text": "granite", "granite_docling_text": "granite",
             "hunyuan_vl_text": "hunyuan_v1_dense",
             "qwen3_vl_text": "qwen3",          # Cosmos 3 Omni's (Qwen3-VL's own checkpoints: their family, qwen3_vl)
             "glm_ocr_text": "glm4",
             "paddleocr_vl_text": "llama",      # Ernie 4.5's layers with RoPE over halves (Ernie's own: over pairs)
             "cosmos3_edge_text": "arcee"}      # Llama's attention, relu2's ungated MLP
# such a text model's fields as its family reads them: what its class fixes (GLM-OCR's q, k, v have no biases), or
# reads under another name (PaddleOCR-VL's use_bias, every projection's)
AS_FAMILY_FIELDS = {"glm_ocr_text": lambda text: {"attention_bias": False},
                    "paddleocr_vl_text": lambda text: dict.fromkeys(("attention_bias", "mlp_bias"),
                                                                    bool(text.get("use_bias")))}
# the language model's tensors: under one of these, the family's "model." names after it
PREFIXES = ("language_model.backbone",                  # Nemotron 3 Nano Omni's Nemotron-H, as released
            "language_model.model", "model.language_model", "model.text_model", "thinker.model.language_model",
            "thinker.model", "text_model",
            "model",            # the language model's own names, the towers' beside them (Step 3.7's as released)
            "")                 # at the root (Cosmos 3 Edge's as released)
HEADS = ("language_model.lm_head.weight", "lm_head.weight", "thinker.lm_head.weight",
         "language_model.output.weight",       # InternLM 2's head (InternVL 2 / 2.5), which keeps its name
         "text_model.lm_head.weight")          # Emu3's, as released
EMBEDDINGS = ("embed_tokens", "tok_embeddings",     # the language model's embedding (InternLM 2's, the second;
              "embeddings")                         # Nemotron-H's, the third)
# text families whose own checkpoints keep the language model's tensors under another root than `model.`
FAMILY_ROOT = {"nemotron_h": "backbone"}
# what the language model holds under `model.` where the towers' tensors are there too (Step 3.7, DeepSeek-OCR 2)
OWN_PARTS = (*EMBEDDINGS, "layers", "norm")
# a wrapper's language model tensors named otherwise than its family's checkpoints name them (within a layer), and the
# tensors among its layers' that the language model does not run (Cosmos 3 Edge's generation branch)
RENAMED = {"Cosmos3EdgeForConditionalGeneration": (
    ("self_attn.to_q.", "self_attn.q_proj."), ("self_attn.to_k.", "self_attn.k_proj."),
    ("self_attn.to_v.", "self_attn.v_proj."), ("self_attn.to_out.", "self_attn.o_proj."),
    ("mlp.fc1.", "mlp.up_proj."), ("mlp.fc2.", "mlp.down_proj."))}
# (by the text config: a test of a tensor's name)
NOT_RUN = {"Cosmos3EdgeForConditionalGeneration": lambda text: re.compile(
               r"_moe_gen\.|\.self_attn\.(add_[qkv]_proj|to_add_out|norm_added_[qk]|k_norm_und_for_gen)\.").search,
           # ERNIE 4.5 VL's vision experts (after the text ones) and their router
           "Ernie4_5_VLMoeForConditionalGeneration": lambda text: lambda name: name.endswith(".mlp.gate.weight_1") or (
               (m := re.search(r"\.mlp\.experts\.(\d+)\.", name)) is not None
               and int(m[1]) >= _first(text["moe_num_experts"]))}


def _first(value):
    """A per-modality list's first (the text's) value, or the value."""
    return value[0] if isinstance(value, (list, tuple)) else value


def wrapper_of(hf_config: dict) -> str | None:
    """The vision-language class config.json names, where kiln reads its language model alone."""
    return next((n for n in hf_config.get("architectures") or [] if n in WRAPPERS), None)


def text_of(source: ModelSource) -> ModelSource:
    """`source` as its language model where config.json names a vision-language wrapper (WRAPPERS), else itself."""
    wrapper = wrapper_of(source.hf_config)
    if wrapper is None:
        return source
    hf, where, paths = source.hf_config, f"{source.path / 'config.json'}", TEXT_CONFIG.get(wrapper, (("text_config",),))
    path = next((p for p in paths if p[0] in hf), paths[0])
    text = hf
    for key in path:
        text = text.get(key) if isinstance(text, dict) else None
    if not isinstance(text, dict) or not text.get("model_type"):
        raise ModelLoadError(f"{where}: {wrapper} without a {'.'.join(path)} naming its language model's model_type; "
                             "the checkpoint's config.json is incomplete (re-download it)")
    names = source.weights.names()
    held = set(names)
    prefix = next((p for p in PREFIXES if {f"{p}.{e}.weight".lstrip(".") for e in EMBEDDINGS} & held), None)
    if prefix is None:
        raise ModelLoadError(f"{source.path}: {wrapper}'s language model has no embed_tokens under "
                             f"{' / '.join(PREFIXES)}; kiln reads those layouts (re-save it with transformers)")
    head = next((h for h in HEADS if h in held), None)
    tied = head is None or hf.get("tie_word_embeddings") is True
    config = {**text, **{k: hf[k] for k in ("eos_token_id", "bos_token_id") if hf.get(k) is not None},
              "tie_word_embeddings": tied,
              # the wrapper first: transformers' reference for the checkpoint is its class (compiler/golden.py)
              "architectures": [wrapper, *(text.get("architectures") or [])]}
    kind = text["model_type"]
    if wrapper in DEEPSEEK_OCR:
        if text.get("use_mla") is not False:
            raise ModelLoadError(f"{where}: {wrapper}'s language_config has latent attention (use_mla not false), "
                                 "which DeepSeek-OCR's language model has not; the config.json is not DeepSeek-OCR's")
        config, kind = dict(config, model_type="deepseek_ocr2_text"), "deepseek_v2 without latent attention"
    if text["model_type"] in AS_FAMILY:
        config = dict(mrope_as_rope(config), model_type=AS_FAMILY[text["model_type"]],
                      **AS_FAMILY_FIELDS.get(text["model_type"], lambda _: {})(text))
    layers, rows = None, None
    if wrapper == "MllamaForConditionalGeneration":
        config, layers, rows = _mllama_as_llama(config)
    notes = []
    if (pruned := _pruned_head(config)) is not None:
        config, rows = _pruned_config(config, pruned), pruned
        notes.append(_pruned_note(pruned, text["vocab_size"]))
    if prefix in ("model", ""):     # the towers' tensors beside the language model's (model.sam_model.*, ...)
        names = [n for n in names if n.split(".")[1 if prefix else 0] in OWN_PARTS]
    if wrapper in NOT_RUN:
        not_run = NOT_RUN[wrapper](text)
        names = [n for n in names if not not_run(n)]
    weights = TextWeights(source.weights, prefix, head, names, layers, rows, RENAMED.get(wrapper, ()),
                          FAMILY_ROOT.get(config["model_type"], "model"))
    left = len(held) - len(weights.names())
    note = (f"{WRAPPERS[wrapper]}'s language model ({kind}) only: its "
            f"{UNREAD.get(wrapper, 'vision tower and projector')}"
            f"{' and its cross-attention layers' if layers else ''} ({left} tensors) are not read (prompts are text)")
    return dataclasses.replace(source, hf_config=config, weights=weights, notes=[note, *notes, *source.notes])


def _mllama_as_llama(config: dict) -> tuple[dict, list[int], int]:
    """Llama 3.2 Vision's language model (its config) as the Llama its self-attention layers make: (that config, the
    layers read, the embedding rows read: the text's, before the image tokens')."""
    cross = set(config.get("cross_attention_layers") or [])
    layers = [i for i in range(config["num_hidden_layers"]) if i not in cross]
    llama = {k: v for k, v in config.items() if k != "cross_attention_layers"}
    return dict(llama, model_type="llama", num_hidden_layers=len(layers)), layers, config["vocab_size"]


def mllama_text_of(source: ModelSource) -> ModelSource:
    """Llama 3.2 Vision's language model saved alone (transformers' MllamaForCausalLM, model_type mllama_text_model):
    its self-attention layers read as a Llama (_mllama_as_llama), its cross-attention layers (which a text prompt
    skips) left unread; transformers' MllamaForCausalLM stays the reference (first in architectures)."""
    if source.hf_config.get("model_type") != "mllama_text_model" or source.format != "hf":
        return source
    config, layers, rows = _mllama_as_llama(source.hf_config)
    names = source.weights.names()
    head = "lm_head.weight" if "lm_head.weight" in names else None
    weights = TextWeights(source.weights, "model", head, [n for n in names if n != head], layers, rows)
    left = len(names) - len(weights.names())
    config = dict(config, architectures=["MllamaForCausalLM", "LlamaForCausalLM"],
                  tie_word_embeddings=head is None or bool(source.hf_config.get("tie_word_embeddings")))
    cross = sorted(source.hf_config.get("cross_attention_layers") or [])
    note = (f"Llama 3.2 Vision's language model: its cross-attention layers {cross} ({left} tensors) are not read (a "
            "text prompt skips them)")
    return dataclasses.replace(source, hf_config=config, weights=weights, notes=[note, *source.notes])


def _pruned_head(config: dict) -> int | None:
    """The LM head's rows where config.json prunes it below the embedding's (`output_vocab_size`: Apertus 1.5, whose
    embedding adds its image and audio codes' ids after the text's, which its head never predicts), else None."""
    rows = config.get("output_vocab_size")
    return int(rows) if rows is not None and int(rows) < int(config["vocab_size"]) else None


def _pruned_config(config: dict, rows: int) -> dict:
    return {**{k: v for k, v in config.items() if k != "output_vocab_size"}, "vocab_size": rows}


def _pruned_note(rows: int, embedded: int) -> str:
    return (f"the LM head predicts the vocabulary's first {rows} tokens (output_vocab_size); the embedding's "
            f"{embedded - rows} after them (image and audio codes, which no text holds) are not read, and a prompt "
            "holding one is refused")


def pruned_vocab_of(source: ModelSource) -> ModelSource:
    """A causal LM whose head is pruned below its embedding (_pruned_head) read as the model of the head's vocabulary:
    the embedding's first rows, the config's vocab_size the head's (what every kernel and the server take)."""
    rows = _pruned_head(source.hf_config) if source.format == "hf" else None
    if rows is None:
        return source
    names = source.weights.names()
    head = "lm_head.weight" if "lm_head.weight" in names else None
    weights = TextWeights(source.weights, "model", head, [n for n in names if n != head], rows=rows)
    return dataclasses.replace(source, hf_config=_pruned_config(source.hf_config, rows), weights=weights,
                               notes=[_pruned_note(rows, source.hf_config["vocab_size"]), *source.notes])


PHI4_MULTIMODAL = ("phi4_multimodal", "phi4mm")     # transformers' model type, the released one


def phi4_multimodal_of(source: ModelSource) -> ModelSource:
    """Phi-4-multimodal read as the Phi-4-mini it is on text (models/phi3.py): its image and audio embedders
    (`model.embed_tokens_extend.*`) unread, and in the released form (Phi4MMForCausalLM) each adapted Linear's
    base weights (`*.base_layer.weight`) read under their own names beside LoRA adapters left unread: the model runs
    its vision and speech adapters only on images and audio, a text prompt on the base weights."""
    if source.hf_config.get("model_type") not in PHI4_MULTIMODAL:
        return source
    names = source.weights.names()
    towers = [n for n in names if n.startswith("model.embed_tokens_extend.")]
    adapters = [n for n in names if re.search(r"\.lora_[AB]\.", n)]
    unread = set(towers) | set(adapters)
    weights = TextWeights.renamed(source.weights, {n.replace(".base_layer.", "."): n for n in names if n not in unread})
    note = (f"Phi-4-multimodal's language model only: its image and audio embedders ({len(towers)} tensors)"
            f"{f' and LoRA adapters ({len(adapters)})' if adapters else ''} are not read (prompts are text, which "
            "it runs on the base weights)")
    return dataclasses.replace(source, weights=weights, notes=[note, *source.notes])


def base_model_of(source: ModelSource) -> ModelSource:
    """A checkpoint saved as its base model (transformers' XModel: `embed_tokens`, `layers.*`, `norm` at the root,
    no LM head; decoder embedding models such as Qwen3-Embedding ship so) read as the causal LM its family's
    checkpoints are: its tensors under `model.`, the embedding table standing in as the head."""
    names = source.weights.names()
    held = set(names)
    if "embed_tokens.weight" not in held or "model.embed_tokens.weight" in held:
        return source
    head = "lm_head.weight" if "lm_head.weight" in held else None
    config = dict(source.hf_config, tie_word_embeddings=head is None or source.hf_config.get("tie_word_embeddings"))
    note = ("saved as its base model (no model. prefix" + (", no LM head: the embedding table stands in as the "
            "head, so its logits mean little; /v1/embeddings serves what it was trained for)" if head is None
                                                            else ")"))
    weights = TextWeights(source.weights, "", head, [n for n in names if n != head])
    return dataclasses.replace(source, hf_config=config, weights=weights, notes=[note, *source.notes])


class TextWeights:
    """The language model's tensors under the names its family's own checkpoint gives them (`model.*`, and
    `lm_head.weight` where the wrapper holds a head); every other method of the source it wraps (a stored
    type, stored codes) takes those names too. `layers`: the wrapper's layer index of each of the family's
    (the others unread); `rows`: the embedding rows read (its first); `renames`: (the wrapper's, the family's) parts
    of names replaced; `root`: the family's own root (`backbone` for Nemotron-H)."""

    _BY_NAME = ("tensor_type", "stored_form", "stored_codes", "get_raw")
    EMBEDDING = "model.embed_tokens.weight"

    def __init__(self, inner, prefix: str, head: str | None, names: list[str], layers: list[int] | None = None,
                 rows: int | None = None, renames: tuple[tuple[str, str], ...] = (), root: str = "model") -> None:
        self._inner, self._rows, self._to_inner = inner, rows, {}
        ours = {wrapper: i for i, wrapper in enumerate(layers)} if layers is not None else None
        for name in names:
            if prefix and not name.startswith(f"{prefix}."):
                continue
            rest = name[len(prefix) + 1:] if prefix else name       # "": every tensor, under model.
            if ours is not None and rest.startswith("layers."):
                index, _, tail = rest[len("layers."):].partition(".")
                if int(index) not in ours:
                    continue
                rest = f"layers.{ours[int(index)]}.{tail}"
            for theirs, family in renames:
                rest = rest.replace(theirs, family)
            self._to_inner[f"{root}.{rest}"] = name
        if head is not None:
            self._to_inner["output.weight" if head.endswith(".output.weight") else "lm_head.weight"] = head

    @classmethod
    def renamed(cls, inner, to_inner: dict[str, str]) -> "TextWeights":
        """The source's tensors under other names (name -> the source's)."""
        weights = cls(inner, "", None, [])
        weights._to_inner = dict(to_inner)
        return weights

    def names(self) -> list[str]:
        return list(self._to_inner)

    def inner_name(self, name: str) -> str:
        return self._to_inner.get(name, name)

    def get(self, name: str):
        data = self._inner.get(self.inner_name(name))
        return data[:self._rows] if name == self.EMBEDDING and self._rows is not None else data

    def __getattr__(self, attr: str):
        if attr.startswith("_"):
            raise AttributeError(attr)
        value = getattr(self._inner, attr)              # AttributeError where the source has no such method
        if attr in self._BY_NAME:
            return lambda name, *args, **kwargs: value(self.inner_name(name), *args, **kwargs)
        return value
