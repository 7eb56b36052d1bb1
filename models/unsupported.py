"""Families people reach for that kiln cannot run yet, each with what stands in the way, by config.json
model_type and by GGUF architecture: models/registry.py and models/gguf.py refuse a known one with its
reason rather than as an unknown architecture."""

from __future__ import annotations

_MAMBA = "Mamba state-space layers (a recurrent state, not a KV cache) among its attention layers"
_LINEAR = "linear-attention layers (a recurrent state, not a KV cache) among its full-attention ones"
_UNSUPPORTED = {
    "zamba": ("Zamba", _MAMBA + ", one shared attention block (Zamba 2 is supported)"),
    "minimax": ("MiniMax-Text-01", _LINEAR),
    "rwkv": ("RWKV", "recurrent time mixing instead of attention"),
    "rwkv6": ("RWKV-6", "recurrent time mixing instead of attention"),
    "rwkv7": ("RWKV-7", "recurrent time mixing instead of attention"),
    "xlstm": ("xLSTM", "recurrent xLSTM blocks instead of attention"),
    **{t: (name, "sparse attention (an indexer choosing the keys each query reads)") for t, name in (
        ("hy_v4", "Hy V4"),
        ("dots3_note", "dots3"), ("dots3_note_text", "dots3"), ("axk2", "A.X K2"), ("kolibri1_1", "Kolibri 1.1"))},
    **{t: ("DeepSeek-V4", "compressed sparse attention (keys compressed 4 or 128 to one, an indexer choosing the "
                          "compressed blocks each query reads) and hyper-connections (several residual streams)")
       for t in ("deepseek_v4", "deepseek4")},
    **{t: ("HY V4 VL", "language model's (HY V4's) sparse attention (an indexer choosing the keys each query reads)")
       for t in ("hy_v4_vl", "hy_v4_vl_text")},
    **{t: ("GLM-5-Next", "hyper-connections (several residual streams mixed by Sinkhorn-normalised matrices), "
                         "Kimi delta attention layers (a recurrent state) and pooled sparse attention")
       for t in ("glm5_next", "glm5_next_text")},
    **{t: ("Mistral Large 4", "layers that attend to an earlier layer's latent KV cache, a learned scale of its RoPE "
                              "frequencies, queries scaled by log(position) and sparse attention (an indexer)")
       for t in ("mistral_large4", "mistral_large4_text")},
    **{t: ("Gemma 4 assistant", "multi-token-prediction drafting over the target model's hidden states (not a "
                                "model of its own: compile the Gemma 4 it drafts for)")
       for t in ("gemma4_assistant", "gemma4_unified_assistant")},
    **{t: ("Qwen4-Exp", "hyper-connections (several residual streams mixed by learned matrices) and n-gram "
                        "embeddings beside its linear-attention layers")
       for t in ("qwen4_exp", "qwen4_exp_text", "qwen4exp")},
    **{t: ("Unlimited-OCR", "reference sliding-window attention (every prompt token kept, the generated ones in a "
                            "window of sliding_window after them)") for t in ("unlimited_ocr", "unlimited_ocr_text")},
    **{t: (name, "relative position bias (each query mixes learned bias-by-distance profiles; no RoPE) and short "
                 "convolutions on keys, values and each block's output (a state beside the KV cache)" + extra)
       for t, name, extra in (("inkling_text", "Inkling", ""), ("inkling_mm_model", "Inkling", ""),
                              ("inkling2", "Inkling 2", ", and attention residuals over earlier blocks"),
                              ("inkling2_text", "Inkling 2", ", and attention residuals over earlier blocks"),
                              ("inkling2_loop", "Inkling 2 Loop", ", attention residuals and layers run in loops"),
                              ("inkling2_loop_text", "Inkling 2 Loop", ", attention residuals and layers run in "
                                                                      "loops"))},
    "paligemma": ("PaliGemma", "prompt attended both ways (a prefix LM: the image and the prompt see each other), "
                               "where kiln's attention is causal"),
    "dory": ("Dory", "recurrent blocks of layers run in loops"),
    "xglm": ("XGLM", "sinusoidal position embeddings (kiln reads learned position tables or RoPE)"),
    "openai-gpt": ("GPT-1", "norms after each residual add (post-LN), where kiln's decoder norms before them or on "
                            "the branch"),
    "ctrl": ("CTRL", "sinusoidal position embeddings (kiln reads learned position tables or RoPE)"),
}

_DIFFUSION = "masked-diffusion decoding (a block's positions denoised together over steps, attending both ways), not " \
             "next-token prediction"
_ENCODER = "encoder (attention both ways, for embeddings), not a causal language model"
_SPEECH = "speech model (an audio codec or text-to-speech), not a text language model"
_DRAFT = "speculative-decoding draft head over another model's hidden states (not a model of its own)"
# llama.cpp's GGUF architectures of such families (general.architecture)
_UNSUPPORTED.update({
    **{arch: (name, _DIFFUSION) for arch, name in (("llada", "LLaDA"), ("llada-moe", "LLaDA-MoE"), ("dream", "Dream"),
                                                   ("rnd1", "RND1"))},
    **{arch: (name, _ENCODER) for arch, name in (
        ("bert", "BERT"), ("modern-bert", "ModernBERT"), ("nomic-bert", "Nomic BERT"),
        ("nomic-bert-moe", "Nomic BERT MoE"),
        ("neo-bert", "NeoBERT"), ("jina-bert-v2", "Jina BERT v2"), ("jina-bert-v3", "Jina BERT v3"),
        ("eurobert", "EuroBERT"), ("t5encoder", "T5 encoder"), ("gemma-embedding", "EmbeddingGemma"),
        ("llama-embed", "Llama embedding model"))},
    "t5": ("T5", "encoder-decoder layout (the decoder cross-attends to an encoder's output), where kiln runs "
                 "decoder-only models"),
    "clip": ("CLIP", "vision or text encoder, not a language model (a multimodal GGUF's projector file: load the "
                     "language model's GGUF)"),
    **{arch: (name, _SPEECH) for arch, name in (("wavtokenizer-dec", "WavTokenizer"), ("pockettts", "Pocket TTS"),
                                                ("qwen3tts", "Qwen3-TTS"))},
    **{arch: (name, _DRAFT) for arch, name in (("eagle3", "EAGLE-3"), ("dflash", "DFlash"))},
    **{arch: (name, "RWKV time mixing (a recurrent state) in place of attention")
       for arch, name in (("rwkv6qwen2", "RWKV-6 Qwen 2"), ("arwkv7", "ARWKV-7"))},
    # transformers' *ForCausalLM classes of encoders and of encoder-decoders' decoders (config.json model_type)
    **{t: (name, _ENCODER) for t, name in (
        ("bert", "BERT"), ("roberta", "RoBERTa"), ("xlm-roberta", "XLM-RoBERTa"), ("xlm-roberta-xl", "XLM-RoBERTa-XL"),
        ("roberta-prelayernorm", "RoBERTa-PreLayerNorm"), ("camembert", "CamemBERT"), ("electra", "ELECTRA"),
        ("ernie", "ERNIE"), ("megatron-bert", "Megatron-BERT"), ("rembert", "RemBERT"), ("roc_bert", "RoCBert"),
        ("roformer", "RoFormer"), ("data2vec-text", "Data2Vec text"), ("xmod", "X-MOD"), ("big_bird", "BigBird"),
        ("bert-generation", "BertGeneration"), ("xlm", "XLM"))},
    **{t: (name, "encoder-decoder layout (its decoder cross-attends to an encoder's output), where kiln runs "
                 "decoder-only models") for t, name in (
        ("bart", "BART"), ("mbart", "mBART"), ("marian", "Marian"), ("pegasus", "Pegasus"),
        ("blenderbot", "Blenderbot"),
        ("blenderbot-small", "Blenderbot Small"), ("bigbird_pegasus", "BigBird-Pegasus"), ("plbart", "PLBart"),
        ("mvp", "MVP"), ("prophetnet", "ProphetNet"), ("whisper", "Whisper"), ("trocr", "TrOCR"))},
    **{t: (name, "image-conditioned prompts: the Q-Former's query tokens from an image begin every one (a text prompt "
                 "alone is its language model's: compile that checkpoint, OPT, Vicuna or Flan-T5)")
       for t, name in (("blip-2", "BLIP-2"), ("instructblip", "InstructBLIP"),
                       ("instructblipvideo", "InstructBLIP Video"))},
    "blip": ("BLIP", "BERT decoder that cross-attends to the image in every layer"),
    **{t: (name, "encoder-decoder layout (its decoder cross-attends to an image or document encoder's output), where "
                 "kiln runs decoder-only models") for t, name in (
        ("florence2", "Florence-2"), ("pix2struct", "Pix2Struct"), ("udop", "UDOP"), ("t5gemma2", "T5Gemma 2"),
        ("vision-encoder-decoder", "VisionEncoderDecoder"), ("pp_formulanet", "PP-FormulaNet"))},
    "diffusion_gemma": ("DiffusionGemma", _DIFFUSION),
    "evolla": ("Evolla", "decoder that cross-attends to a protein encoder's output"),
    "git": ("GIT", "one BERT-style stack over image tokens and text (norms after the residual adds, the image attended "
                   "both ways)"),
    "idefics": ("IDEFICS", "gated cross-attention layers over image features between its Llama layers (Flamingo's)"),
    **{t: (name, "sinusoidal position embeddings (kiln reads learned position tables or RoPE)")
       for t, name in (("kosmos-2", "Kosmos-2"), ("kosmos-2.5", "Kosmos-2.5"))},
    **{t: (name, "vision-language-action policy: it decodes robot actions by flow matching, not text")
       for t, name in (("pi0", "pi0"), ("pi05", "pi0.5"))},
    "blt": ("Byte Latent Transformer", "byte-level local encoder and decoder around a latent transformer over "
                                       "dynamic patches"),
    **{t: (name, _SPEECH) for t, name in (("moshi", "Moshi"), ("musicgen", "MusicGen"),
                                          ("musicgen_melody", "MusicGen Melody"),
                                          ("moss_transcribe_diarize", "MOSS Transcribe-Diarize"))},
    "xlnet": ("XLNet", "permutation language modelling with two-stream relative attention"),
    "reformer": ("Reformer", "locality-sensitive hashing and chunked attention with reversible layers"),
    "cpmant": ("CPM-Ant", "a relative position bias by bucketed distance and segment (T5's kind; no RoPE) and prompt "
                          "embeddings before the text"),
    "minimax-01": _UNSUPPORTED["minimax"], "glm5-next": _UNSUPPORTED["glm5_next"],
    "gemma4-assistant": _UNSUPPORTED["gemma4_assistant"], "dots3note": _UNSUPPORTED["dots3_note"],
})


def unsupported_reason(name: str | None) -> str | None:
    """Why a known family (config.json model_type or GGUF architecture `name`) is refused, else None."""
    known = _UNSUPPORTED.get(name or "")
    if known is None:
        return None
    family, why = known
    return (f"{family} ({name}) is not supported yet: its {why}. `kiln models` lists the families kiln "
            "compiles")
