"""models/sp_tokenizer.py: a SentencePiece tokenizer.model (BPE, identity normalizer: Llama's kind) read without
protobuf or sentencepiece and rebuilt as tokenizer.json encodes as sentencepiece does (BOS first, byte fallback,
user-defined symbols, runs of spaces, tabs and newlines, unicode) and decodes back; tokenizer_config.json's tokens
past the model's pieces come at their ids; a Unigram model, or an NFKC / whitespace-collapsing normalizer, is
left alone with a note naming why; a Hugging Face folder with tokenizer.model only gets tokenizer.json written."""

from __future__ import annotations

import json

import pytest

from kiln.models.sp_tokenizer import build_tokenizer, read_model

spm = pytest.importorskip("sentencepiece")
pytestmark = pytest.mark.unit
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "kiln", "compiler", "über", "naïve",
         "日本語", "测试", "hello", "world", "  spaces", "tabs\there", "123", "4567", "line\nbreak"]
TEXTS = ["the quick brown fox", "Hello world!", "multiple   spaces here", "über naïve 日本語 测试",
         "emoji 🙂 unknown ☃", "say <|im_start|>user\nhi<|im_end|>", "tabs\tand\nnewlines", "1234567890", "trailing  "]


def _train(tmp_path, name: str, vocab_size: int = 420, **options):
    import random
    rng = random.Random(0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(400)))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / name), vocab_size=vocab_size,
                                   byte_fallback=True, character_coverage=1.0, minloglevel=2,
                                   user_defined_symbols=["<|im_start|>", "<|im_end|>"], **options)
    return tmp_path / f"{name}.model"


def test_a_llama_style_model_encodes_as_sentencepiece(tmp_path):
    path = _train(tmp_path, "llama", model_type="bpe", normalization_rule_name="identity",
                  remove_extra_whitespaces=False)
    sp = spm.SentencePieceProcessor(model_file=str(path))
    tok, why = build_tokenizer(path, {})
    assert why is None
    for text in TEXTS:
        ids = tok.encode(text).ids
        assert ids == [sp.bos_id()] + sp.encode(text), text
        assert tok.decode(ids, skip_special_tokens=True) == sp.decode(sp.encode(text)), text
    assert tok.encode("x", add_special_tokens=True).ids[0] == sp.bos_id()
    assert build_tokenizer(path, {"add_bos_token": False})[0].encode("the fox").ids == sp.encode("the fox")
    added = {"420": {"content": "<|tool|>", "special": True}, "421": {"content": "<|end_tool|>", "special": True}}
    extended, _ = build_tokenizer(path, {"added_tokens_decoder": added})
    ids = extended.encode("a <|tool|> b <|end_tool|>").ids
    assert 420 in ids and 421 in ids and extended.token_to_id("<|end_tool|>") == 421


def test_models_kiln_does_not_rebuild_are_named(tmp_path):
    unigram = _train(tmp_path, "unigram", 320, model_type="unigram", normalization_rule_name="identity",
                     remove_extra_whitespaces=False)
    assert read_model(unigram)["model_type"] == 1 and build_tokenizer(unigram, {}) == (None, "a Unigram model")
    nfkc = _train(tmp_path, "nfkc", model_type="bpe")
    assert build_tokenizer(nfkc, {}) == (None, "normalizer nmt_nfkc, whitespace runs collapsed")


def test_a_folder_with_tokenizer_model_only_gets_tokenizer_json(tmp_path):
    import shutil

    from kiln.models.hf import tokenizer_files
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(_train(tmp_path, "llama", model_type="bpe", normalization_rule_name="identity",
                       remove_extra_whitespaces=False), folder / "tokenizer.model")
    (folder / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "chat_template": "{{ x }}"}))
    write, notes = tokenizer_files(folder)
    assert notes == ["tokenizer.json built from tokenizer.model (SentencePiece BPE, as transformers' fast conversion "
                     "does)"]
    out = tmp_path / "out"
    out.mkdir()
    assert set(write(out)) == {"tokenizer.json", "tokenizer_config.json"} and (out / "tokenizer.json").is_file()
    (folder / "tokenizer.model").write_bytes(_train(tmp_path, "nfkc", model_type="bpe").read_bytes())
    _, notes = tokenizer_files(folder)
    assert notes[0].startswith("no tokenizer.json (its tokenizer.model is normalizer nmt_nfkc")


@pytest.mark.parametrize("add_bos, prefix, named", [(True, False, True), (False, True, False)])
def test_a_folder_with_gpt2s_slow_files_only_gets_tokenizer_json(tmp_path, add_bos, prefix, named):
    """vocab.json and merges.txt without tokenizer.json (OPT's checkpoints, GPT-2 fine-tunes): a tokenizer.json
    built as transformers' GPT2Tokenizer builds it (its class named in tokenizer_config.json, or by config.json's
    model type) gives its ids (OPT's BOS prepended, add_prefix_space, the config's special tokens whole, an added token
    past the vocabulary) and decodes them back; another tokenizer class's files are named in the note."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers
    import transformers

    from kiln.models.hf import tokenizer_files
    from kiln.runtime.tokenizer import Tokenizer
    from tiny_models import CORPUS
    folder = tmp_path / "model"
    folder.mkdir()
    bpe = HFTokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "<pad>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    bpe.model.save(str(folder))
    (folder / "config.json").write_text(json.dumps({"model_type": "opt"}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        **({"tokenizer_class": "GPT2Tokenizer"} if named else {}), "bos_token": "</s>", "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "</s>", "add_bos_token": add_bos, "add_prefix_space": prefix, "added_tokens_decoder": {
            "400": {"content": "<|tool|>", "special": True}}}))
    out = _built(folder, tmp_path / "out", "tokenizer.json built from vocab.json and merges.txt (byte-level BPE, as "
                 "transformers' GPT2Tokenizer builds it)", model_type="opt")
    ours, theirs = Tokenizer.from_dir(out), transformers.AutoTokenizer.from_pretrained(folder)
    for text in ["The quick brown fox", " spaces   and\nnewlines.", "</s>a<pad>b<|tool|>c", "Compilers 0123!"]:
        ids = ours.encode(text)
        assert ids == theirs(text)["input_ids"], text
        assert ours.decode(ids) == theirs.decode(ids)
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer"}))
    _, notes = tokenizer_files(folder)
    assert notes[0].startswith("no tokenizer.json (its tokenizer is Qwen2Tokenizer's vocab.json and merges.txt")
    (folder / "tokenizer_config.json").write_text("{}")              # no class, no model type: named as such
    _, notes = tokenizer_files(folder)
    assert notes[0].startswith("no tokenizer.json (its tokenizer is None (no tokenizer_class)'s vocab.json")


def test_a_folder_with_tokenizer_json_alone_gets_a_config_to_match(tmp_path):
    """tokenizer.json without tokenizer_config.json (transformers loads such a folder): the artifact gets an empty
    config beside it (an artifact holds both), the note says what is missing, and text encodes as transformers does."""
    import transformers

    from kiln.models.hf import tokenizer_files
    from kiln.runtime.tokenizer import Tokenizer
    from tiny_models import write_tokenizer
    folder, out = tmp_path / "model", tmp_path / "out"
    folder.mkdir()
    out.mkdir()
    write_tokenizer(folder, 300)
    (folder / "tokenizer_config.json").unlink()
    write, notes = tokenizer_files(folder)
    assert notes == ["no tokenizer_config.json: special tokens as tokenizer.json and config.json give them (no chat "
                     "template)"]
    assert set(write(out)) == {"tokenizer.json", "tokenizer_config.json"}
    text = "The quick <|im_start|>brown fox"
    assert Tokenizer.from_dir(out).encode(text) == transformers.AutoTokenizer.from_pretrained(folder)(text)["input_ids"]


def test_a_kimi_folders_tiktoken_model_gets_tokenizer_json(tmp_path):
    """Kimi K2's and Kimi Linear's checkpoints ship tiktoken.model and tokenization_kimi.py, no tokenizer.json: a
    tokenizer.json built from the ranks gives tiktoken's own ids under Kimi's split (English, Chinese, digits, a
    contraction, special tokens whole) and decodes them back; without Kimi's code beside it the note names the file."""
    import base64

    tiktoken = pytest.importorskip("tiktoken")
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    from kiln.models.gguf_tokenizer import _BYTE_TO_UNICODE, KIMI_K2
    from kiln.models.hf import tokenizer_files
    from kiln.runtime.tokenizer import Tokenizer
    from tiny_models import CORPUS
    bpe = HFTokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = CORPUS + ["你好世界，编译器把程序变成快速的代码。", "HELLOthere World's 1234567 日本語テキスト"]
    bpe.train_from_iterator(corpus * 20, trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    unspell = {c: b for b, c in _BYTE_TO_UNICODE.items()}
    ranks = {bytes(unspell[c] for c in token): i for token, i in bpe.get_vocab().items()}
    folder = tmp_path / "kimi"
    folder.mkdir()
    (folder / "tiktoken.model").write_text("".join(f"{base64.b64encode(t).decode()} {r}\n"
                                                   for t, r in sorted(ranks.items(), key=lambda x: x[1])))
    n = len(ranks)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "TikTokenTokenizer", "bos_token": "[BOS]", "eos_token": "[EOS]",
        "added_tokens_decoder": {str(n): {"content": "[BOS]", "special": True},
                                 str(n + 1): {"content": "[EOS]", "special": True},
                                 str(n + 2): {"content": "<|im_end|>", "special": True}}}))
    (folder / "tokenization_kimi.py").write_text("# Kimi's TikTokenTokenizer (remote code: not run)\n")
    out = _built(folder, tmp_path / "out", "tokenizer.json built from tiktoken.model (byte-level BPE with the merges "
                 "tiktoken's ranks make, Kimi's split)")
    specials = {"[BOS]": n, "[EOS]": n + 1, "<|im_end|>": n + 2,
                **{f"<|reserved_token_{i}|>": i for i in range(n + 3, n + 256)}}
    reference = tiktoken.Encoding("kimi-test", pat_str=KIMI_K2[0], mergeable_ranks=ranks, special_tokens=specials)
    ours = Tokenizer.from_dir(out)
    for text in ["The quick brown fox jumps over the lazy dog.", "你好世界，编译器把程序变成快速的代码。",
                 "HELLOthere World's 1234567 日本語テキスト", "a<|im_end|>b[EOS]\n\n  code()  ", "Zebras' qux 42!"]:
        ids = ours.encode(text)
        assert ids == reference.encode(text, allowed_special="all"), text
        assert ours.decode(ids) == text
    (folder / "tokenization_kimi.py").unlink()
    _, notes = tokenizer_files(folder)
    assert notes[0].startswith("no tokenizer.json (its tokenizer is a tiktoken.model whose split pattern lives in "
                               "remote code kiln does not know")


def _built(folder, out, note: str, model_type: str | None = None):
    """`out`, where tokenizer_files wrote the folder's tokenizer built (its one note `note`) beside the copied files."""
    from kiln.models.hf import tokenizer_files
    write, notes = tokenizer_files(folder, model_type)
    assert notes == [note]
    out.mkdir()
    assert "tokenizer.json" in write(out)
    return out
