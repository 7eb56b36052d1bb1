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
        return None, f"{kind or f'{model_type} (no tokenizer_class)'}'s vocab.json and merges.txt"
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


KIMI_RESERVED = 256                         # special ids after the ranks: the config's names, else reserved_token_<id>


def build_tiktoken(folder: Path, config: dict):
    """(a tokenizers.Tokenizer, None) from the folder's tiktoken.model (a base64 token and its rank a line) where its
    split pattern is known (Kimi's: tokenization_kimi.py beside it), or (None, why not): byte-level BPE whose merges
    are those tiktoken's ranks make, a whole piece in the vocabulary taken as it is (tiktoken's rule), the
    KIMI_RESERVED special tokens after the ranks matched whole."""
    import base64

    from tokenizers import AddedToken, Tokenizer, decoders, models

    from .gguf_tokenizer import _BYTE_TO_UNICODE as spell
    from .gguf_tokenizer import KIMI_K2, byte_level_splits
    if not (folder / "tokenization_kimi.py").is_file():
        return None, "a tiktoken.model whose split pattern lives in remote code kiln does not know"
    try:
        ranks = {base64.b64decode(token): int(rank) for token, rank in
                 (line.split() for line in (folder / "tiktoken.model").read_text(encoding="utf-8").splitlines()
                  if line.strip())}
    except (OSError, ValueError) as e:
        return None, f"an unreadable tiktoken.model ({type(e).__name__}: {e})"
    if sorted(ranks.values()) != list(range(len(ranks))):
        return None, "a tiktoken.model whose ranks are not 0..n-1"
    vocab = {"".join(spell[b] for b in token): rank for token, rank in ranks.items()}
    try:
        merges = [tuple("".join(spell[b] for b in part) for part in _tiktoken_pair(ranks, token, rank))
                  for token, rank in sorted(ranks.items(), key=lambda item: item[1]) if len(token) > 1]
    except ValueError as e:
        return None, f"a tiktoken.model kiln cannot read as BPE ({e})"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=True))
    tok.pre_tokenizer = byte_level_splits(KIMI_K2)         # tokenization_kimi.py's split (llama.cpp's kimi-k2)
    tok.decoder = decoders.ByteLevel()
    named = {int(i): entry["content"] for i, entry in (config.get("added_tokens_decoder") or {}).items()}
    tok.add_special_tokens([AddedToken(named.get(i, f"<|reserved_token_{i}|>"), special=True, normalized=False)
                            for i in range(len(ranks), len(ranks) + KIMI_RESERVED)])
    return tok, None


def _tiktoken_pair(ranks: dict[bytes, int], token: bytes, rank: int) -> tuple[bytes, bytes]:
    """The two tokens tiktoken merges last into `token`: its bytes merged lowest rank first, by ranks below its own."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best = min(((ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1)))
        if best[0] >= rank:
            break
        parts[best[1]:best[1] + 2] = [parts[best[1]] + parts[best[1] + 1]]
    if len(parts) != 2:
        raise ValueError(f"tiktoken token {token!r} is not two lower-ranked tokens merged")
    return parts[0], parts[1]
