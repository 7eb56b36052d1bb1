"""The tokenizer a GGUF file describes, rebuilt as a `tokenizers.Tokenizer` plus tokenizer_config.json.

Two kinds: byte-level BPE (`tokenizer.ggml.model` "gpt2": Llama 3, Qwen, SmolLM, GPT-2) and
SentencePiece BPE ("llama": Llama 1/2, TinyLlama, Mistral, Gemma; "gemma4": Gemma 4). "llama" keeps no
merge list in the file; the merges are recovered from the vocabulary (see `_sentencepiece_merges`).
"gemma4" is the same BPE over `▁`-spelled text with byte fallback, its merge list written out (llama.cpp's
Gemma4Model reads the tokenizer.json's).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from .gguf_meta import meta as _meta
from .source import ModelLoadError

# Pre-tokenizer splits by tokenizer.ggml.pre, transcribed from llama.cpp's
# llama-vocab.cpp: the regexes run in order, each splitting the pieces the
# previous one made, before the byte-level mapping.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# o200k (GPT-4o, gpt-oss, MiniMax-M2): cased words apart, contractions kept, numbers in threes.
_O200K_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5: Qwen2's, with combining marks kept in words
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Splits llama.cpp's llama-vocab.cpp transcribes from each family's tokenizer.json (copied from it as written there)
_JAIS2 = [
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L"
    '}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\'
    's{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1'
    ',2}(?!\\S)|\\s{1}',
]
_DEEPSEEK_LLM = [
    '[\r\n]',
    '\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ'
    '-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ'
    '-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+',
    '\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+',
    '\\s+$',
    '[一-龥ࠀ-一가-\ud7ff]+',
    '\\p{N}+',
]
_DEEPSEEK_V3 = [
    '\\p{N}{1,3}',
    '[一-龥\u3040-ゟ゠-ヿ]+',
    '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}'
    ']+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+',
]
_SPARK2_5 = [
    '\\p{N}{1,3}',
    '[一-龥\u3040-ゟ゠-ヿ]+',
    '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}'
    ']+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+',
    '\\p{N}',
]
_YOUTU = [
    '[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥\u3040-ゟ゠-ヿ]+',
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'"
    "[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}"
    "\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV"
    "][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!"
    '\\S)|\\s+',
]
_DEEPSEEK_CODER = [
    '[\r\n]',
    '\\s?\\p{L}+',
    '\\s?\\p{P}+',
    '[一-龥ࠀ-一가-\ud7ff]+',
    '\\p{N}',
]
_FALCON = [
    '[\\p{P}\\$\\+<=>\\^~\\|`]+',
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    '[0-9][0-9][0-9]',
]
_BLOOM = [
    ' ?[^(\\s|.,!?…。，、।۔،)]+',
]
_VIKING = [
    ' ?[^(\\s|.,!?…。，、।۔،)]+',
    '\\p{N}',
]
_TINY_AYA = [
    '\\d{1,3}(?=(?:\\d{3})*\\b)',
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'"
    "[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}"
    "\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV"
    "][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\"
    's+(?!\\S)|\\s+',
]
_BAILINGMOE = [
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s"
    '\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+',
]
_SEED_CODER = [
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L"
    '}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+',
]
_UFAKZEKA = [
    '[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s'
    '+',
]
_EXAONE_MOE = [
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\"
    'p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\'
    'S)|\\s+',
]
# AFMoE's (Trinity): a run of digits as its first len % 3, then threes (llama.cpp's custom AFMoE_digits), CJK and
# other Asian scripts' runs (from U+8C48, as llama.cpp's source writes the compatibility ideographs' U+F900), then
# DeepSeek-V3's words
_AFMOE = [
    '\\p{N}{1,3}(?=(?:\\p{N}{3})*(?!\\p{N}))',
    '[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf'
    '\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af'
    '\u1100-\u11ff]+',
    _DEEPSEEK_V3[2],
]
# Kimi K2's and Kimi Linear's (tokenization_kimi.py's tiktoken pattern, as llama.cpp's custom kimi-k2 split runs
# it): Han runs, cased words without Han, digits in threes
KIMI_K2 = [
    "[\\p{Han}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&"
    "[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
]
# Laguna's: the text cut into lines and runs of newlines first, then GPT-4's words with single digits (llama.cpp's
# LAGUNA pre-tokenizer)
_LAGUNA = [
    '[^\\n]+|[\\n]+',
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}"
    '\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+',
]
_MINICPM5 = [
    '\\p{N}{1,3}',
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L"
    '}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+',
]
# Mistral's Tekken (Nemo, Small 3, Pixtral): o200k's cased words without contractions, single digits (its
# tokenizer.json's; llama.cpp approximates the case classes)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> its splits, as llama.cpp's llama_vocab::impl::load names them
_PRE_SPLITS = {
    **dict.fromkeys(["default", "gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling",
                     "exaone4", "a.x-4.0", "mellum", "gigachat", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de",
                     "jina-v1-en", "jina-v2-code", "roberta-bpe", "modern-bert"], [_GPT2_SPLIT]),
    # Single digits first (SmolLM's own tokenizer.json: Digits(individual_digits) + ByteLevel).
    **dict.fromkeys(["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva", "minerva-7b",
                     "mellum2"], [r"\p{N}", _GPT2_SPLIT]),
    **dict.fromkeys(["llama-bpe", "llama3", "llama-v3", "smaug-bpe", "falcon3", "dbrx", "lfm2", "falcon-h1", "pixtral",
                     "midm-2.0", "jina-v5-nano", "chatglm-bpe", "glm4", "glm5"], [_LLAMA3_SPLIT]),
    **dict.fromkeys(["qwen2", "stablelm2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "hunyuan", "solar-open",
                     "grok-2"], [_QWEN2_SPLIT]),
    **dict.fromkeys(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], [_O200K_SPLIT]),
    "qwen35": [_QWEN35_SPLIT],
    "tekken": [_TEKKEN_SPLIT],
    "deepseek-llm": _DEEPSEEK_LLM,
    "deepseek-coder": _DEEPSEEK_CODER,
    **dict.fromkeys(["deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"], _DEEPSEEK_V3),
    "spark2_5": _SPARK2_5,
    "youtu": _YOUTU,
    "falcon": _FALCON,
    **dict.fromkeys(["bloom", "poro-chat", "gpt3-finnish"], _BLOOM),
    "viking": _VIKING,
    "jais-2": _JAIS2,
    **dict.fromkeys(["tiny_aya", "cohere2moe"], _TINY_AYA),
    **dict.fromkeys(["bailingmoe", "bailingmoe2", "llada-moe"], _BAILINGMOE),
    "seed-coder": _SEED_CODER,
    "ufakzeka": _UFAKZEKA,
    "exaone-moe": _EXAONE_MOE,
    "minicpm5": _MINICPM5,
    "laguna": _LAGUNA,
    "afmoe": _AFMOE,
    "kimi-k2": KIMI_K2,
}
# Pre-tokenizers whose vocabularies llama.cpp reads with ignore_merges (a whole split that is a token is that token,
# as these tokenizer.json's BPE says)
_IGNORE_MERGES = {"llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                  "jina-v5-nano", "glm4", "glm5", "tekken", "youtu", "minicpm5"}
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values
_SENTENCEPIECE = ("llama", "gemma4")  # tokenizer.ggml.model values of SentencePiece-style BPE
# Turn and message ends llama.cpp's vocabulary loader also stops at (its end-of-generation set), by their text
_END_OF_TURN = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<turn|>", "<|tool_response>", "<|endoftext|>",
                "<|return|>", "<|call|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<｜end▁of▁sentence｜>")
_SPACE = "\u2581"  # SentencePiece's visible space


def _check_tokenizer(reader: gguf.GGUFReader) -> None:
    """Raise when the file's tokenizer is one we cannot rebuild."""
    model = _meta(reader, "tokenizer.ggml.model")
    if model in _SENTENCEPIECE:
        return
    if model != "gpt2":
        raise ModelLoadError(
            f"GGUF tokenizer model {model!r} is not supported yet; supported: 'gpt2' (byte-level BPE), "
            "'llama' and 'gemma4' (SentencePiece BPE)"
        )
    pre = _meta(reader, "tokenizer.ggml.pre", "default")
    if pre not in _PRE_SPLITS:
        supported = ", ".join(sorted(_PRE_SPLITS))
        raise ModelLoadError(f"GGUF pre-tokenizer {pre!r} is not supported; supported: {supported}")


def build_gguf_tokenizer(reader: gguf.GGUFReader) -> Tokenizer:
    """A `tokenizers.Tokenizer` equal to the one the GGUF metadata describes."""
    _check_tokenizer(reader)
    if _meta(reader, "tokenizer.ggml.model") in _SENTENCEPIECE:
        return _sentencepiece_tokenizer(reader)
    return _byte_level_tokenizer(reader)


def _byte_level_tokenizer(reader: gguf.GGUFReader) -> Tokenizer:
    tokens = _meta(reader, "tokenizer.ggml.tokens")
    types = _meta(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in _meta(reader, "tokenizer.ggml.merges")]
    added = {i for i, ty in enumerate(types) if ty in (_CONTROL, _USER_DEFINED)}
    vocab = {_byte_level_spelling(tok) if i not in added else tok: i for i, tok in enumerate(tokens)}

    pre = _meta(reader, "tokenizer.ggml.pre", "default")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                               ignore_merges=pre in _IGNORE_MERGES))
    tok.pre_tokenizer = byte_level_splits(_PRE_SPLITS[pre])
    tok.decoder = decoders.ByteLevel()
    # Control tokens are special (skipped by decode(skip_special_tokens=True));
    # user-defined ones (like <think>) are matched whole but decoded as text.
    control = [i for i in sorted(added) if types[i] == _CONTROL]
    user = [i for i in sorted(added) if types[i] == _USER_DEFINED]
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in control])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in user])
    tok.post_processor = _post_processor(reader, tokens) or processors.ByteLevel(trim_offsets=False)
    return tok


def byte_level_splits(splits: list[str]) -> pre_tokenizers.PreTokenizer:
    """Each regex of `splits` cutting the text's pieces in turn (its matches and what lies between them), then the
    pieces in the byte-level alphabet: the pre-tokenizer of a byte-level BPE (also models/bpe_files.py's tiktoken)."""
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits]
                                   + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _sentencepiece_tokenizer(reader: gguf.GGUFReader, each_piece: bool = True) -> Tokenizer:
    """SentencePiece BPE with byte fallback, laid out as transformers lays out the same file.

    Gemma (no prefix space) replaces spaces by `▁` in a normalizer and stores runs of spaces as
    user-defined tokens spelled with real spaces; those are respelled as `▁` runs so that BPE reaches
    them, and its merges rank by position in the file. Llama-style vocabularies prefix `▁` to the
    text and to the text after each added token (tokenizer.ggml.add_space_prefix, default on; as llama.cpp and
    Llama's own tokenizer.json do) and rank merges by score (by position where the file has no scores: XVERSE's).
    Gemma 4's file
    ("gemma4") writes its merges: those are taken as they are. `each_piece` False: the prefix at the text's start
    only, as sentencepiece itself adds it (models/sp_tokenizer.py's tokenizer.model).
    """
    arch = _meta(reader, "general.architecture")
    gemma = arch.startswith("gemma")
    tokens = list(_meta(reader, "tokenizer.ggml.tokens"))
    types = _meta(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    respelled = {i for i, t in enumerate(tokens) if gemma and t and not t.strip(" ")}
    if gemma:
        tokens = [_SPACE * len(t) if i in respelled else t for i, t in enumerate(tokens)]
    scores = None if gemma else _meta(reader, "tokenizer.ggml.scores", None)
    # without scores (Gemma's; XVERSE's, a BPE vocabulary written as llama's), merges rank by the tokens' order,
    # which is a BPE vocabulary's merge order
    priority = {t: -float(i) for i, t in enumerate(tokens)} if scores is None else dict(zip(tokens, map(float, scores)))
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = _meta(reader, "tokenizer.ggml.unknown_token_id", None)
    gemma4 = _meta(reader, "tokenizer.ggml.model") == "gemma4"
    written = _meta(reader, "tokenizer.ggml.merges", None) if gemma4 else None
    merges = [_merge_pair(m) for m in written] if written is not None else _sentencepiece_merges(vocab, priority)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True,
                               byte_fallback=True, unk_token=tokens[unk_id] if unk_id is not None else None))
    prefix = not gemma and bool(_meta(reader, "tokenizer.ggml.add_space_prefix", True))
    if prefix and not each_piece:        # sentencepiece's dummy prefix: the text's start only
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SPACE, prepend_scheme="first", split=False)
    else:
        # llama.cpp prefixes a space to the text at the start and after every special or user-defined token (as
        # transformers' Llama tokenizer.json does: a normalizer on each piece between added tokens), even where
        # the text starts with one (" Hello" -> "▁▁Hello")
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(_SPACE), normalizers.Replace(" ", _SPACE)]) \
            if prefix else normalizers.Replace(" ", _SPACE)
    steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(content=" ", left=1)] if prefix else []))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == _CONTROL])
    # Runs of spaces respelled above are plain vocabulary now; every other user-defined token
    # (newline runs, HTML tags) is matched whole, as llama.cpp does.
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for i, (t, ty) in enumerate(zip(tokens, types)) if ty == _USER_DEFINED and i not in respelled])
    post = _post_processor(reader, tokens)
    if post is not None:
        tok.post_processor = post
    return tok


def _sentencepiece_merges(vocab: dict[str, int], priority: dict[str, float]) -> list[tuple[str, str]]:
    """SentencePiece BPE merges two adjacent pieces when the joined piece is in the vocabulary,
    best-ranked joined piece first. So every split of a token into two tokens is a merge, ranked by
    the token's priority, then the longer left piece first, then token order."""
    found = []
    for token, rank in priority.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                found.append((-rank, -cut, vocab[token], left, right))
    found.sort(key=lambda m: m[:3])
    return [(left, right) for *_, left, right in found]


def _merge_pair(merge: str) -> tuple[str, str]:
    """A written merge "left right": split at the first space after the first character (llama.cpp's rule)."""
    cut = merge.find(" ", 1)
    if cut < 0:
        raise ModelLoadError(f"GGUF tokenizer merge {merge!r} has no space between its two pieces; re-convert the "
                             "model")
    return merge[:cut], merge[cut + 1:]


def _byte_level_spelling(token: str) -> str:
    """A vocabulary entry in the byte-level alphabet; llama.cpp stores them that way already."""
    if all(c in _UNICODE_ALPHABET for c in token):
        return token
    return "".join(_BYTE_TO_UNICODE[b] for b in token.encode("utf-8"))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from bytes to printable characters (the byte-level BPE alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(extra)}}


_BYTE_TO_UNICODE = _bytes_to_unicode()
_UNICODE_ALPHABET = frozenset(_BYTE_TO_UNICODE.values())


def _add_bos(reader: gguf.GGUFReader) -> bool:
    """tokenizer.ggml.add_bos_token; absent, llama.cpp adds BOS for SentencePiece, not for byte-level BPE."""
    return bool(_meta(reader, "tokenizer.ggml.add_bos_token", _meta(reader, "tokenizer.ggml.model") in _SENTENCEPIECE))


def _post_processor(reader: gguf.GGUFReader, tokens: list[str]):
    """Prepend BOS when the file says to; None when it does not."""
    bos_id = _meta(reader, "tokenizer.ggml.bos_token_id", None)
    if not _add_bos(reader) or bos_id is None:
        return None
    bos = tokens[bos_id]
    return processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
    )


def gguf_tokenizer_config(reader: gguf.GGUFReader) -> dict:
    """tokenizer_config.json contents: special tokens, BOS policy, chat template."""
    tokens = _meta(reader, "tokenizer.ggml.tokens")
    config: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding"), ("unk_token", "unknown")):
        token_id = _meta(reader, f"tokenizer.ggml.{key}_token_id", None)
        if token_id is not None and token_id < len(tokens):
            config[name] = tokens[token_id]
    stops = {_meta(reader, f"tokenizer.ggml.{key}_token_id", None) for key in ("eot", "eom")}
    types = _meta(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    stops |= {i for i, (t, ty) in enumerate(zip(tokens, types))
              if t in _END_OF_TURN and ty in (_CONTROL, _USER_DEFINED)}
    if stops - {None}:
        config["eos_token_ids"] = sorted(stops - {None})       # end of generation beside eos_token
    config["add_bos_token"] = _add_bos(reader)
    config["add_eos_token"] = bool(_meta(reader, "tokenizer.ggml.add_eos_token", False))
    arch = _meta(reader, "general.architecture")
    config["model_max_length"] = _meta(reader, f"{arch}.context_length", None)
    template = _meta(reader, "tokenizer.chat_template", None)
    if template is not None:
        config["chat_template"] = template
    return config


def write_gguf_tokenizer(reader: gguf.GGUFReader, dest: Path) -> list[str]:
    """Write tokenizer.json and tokenizer_config.json for the GGUF's tokenizer into `dest`."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    build_gguf_tokenizer(reader).save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps(gguf_tokenizer_config(reader), indent=2, ensure_ascii=False))
    return ["tokenizer.json", "tokenizer_config.json"]
