"""A tokenizer.json for a checkpoint that ships GPT-2's slow tokenizer files alone (vocab.json and merges.txt, no
tokenizer.json: OPT's, many GPT-2 fine-tunes'), built as transformers' GPT2Tokenizer builds it: byte-level BPE over
the vocabulary and merges, ByteLevel pre-tokenization (add_prefix_space as the config says) and decoding, the config's
special and added tokens matched whole, BOS prepended where add_bos_token."""

from __future__ import annotations

import json
from pathlib import Path

# tokenizer_config.json's tokenizer_class values built here; where it names none, the model types transformers gives
# GPT2Tokenizer
GPT2_CLASSES = ("GPT2Tokenizer", "GPT2TokenizerFast")
GPT2_MODEL_TYPES = ("gpt2", "opt", "gpt_neo", "gptj", "gpt_bigcode")


def build_byte_level_bpe(folder: Path, config: dict, model_type: str | None):
    """(a tokenizers.Tokenizer, None) from the folder's vocab.json and merges.txt, or (None, why not)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    kind = config.get("tokenizer_class")
    if kind not in GPT2_CLASSES and not (kind is None and model_type in GPT2_MODEL_TYPES):
        return None, f"{kind or model_type + ' (no tokenizer_class)'}'s vocab.json and merges.txt"
    try:
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"an unreadable vocab.json or merges.txt ({type(e).__name__}: {e})"
    merges = [tuple(line.split(" ", 1)) for line in lines if line and not line.startswith("#version")]
    if not isinstance(vocab, dict) or any(len(m) != 2 for m in merges):
        return None, "a vocab.json or merges.txt not in GPT-2's form"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space", False)))
    tok.decoder = decoders.ByteLevel()
    added = config.get("added_tokens_decoder") or {}
    for token_id in sorted(added, key=int):             # at their ids: past the vocabulary, in order
        entry = added[token_id]
        tok.add_special_tokens([AddedToken(entry["content"], special=bool(entry.get("special", True)),
                                           normalized=bool(entry.get("normalized", False)))])
    specials = [_text(config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials if t])
    bos = _text(config.get("bos_token", "<|endoftext|>"))
    if config.get("add_bos_token") and bos is not None and tok.token_to_id(bos) is not None:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 $B:1",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok, None


def _text(value) -> str | None:
    """A special token as tokenizer_config.json gives it: a string or an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value
