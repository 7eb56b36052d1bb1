"""Tiny random-init Hugging Face models (and a tiny tokenizer) written to disk for tests."""

from __future__ import annotations

import json
from pathlib import Path

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Compilers turn programs into fast code.",
    "Paged attention keeps the KV cache in fixed-size pages; batching shares the weights.",
    "Numbers 0123456789 and symbols: {}[]()<>+-*/=!?.,;:'\" and spaces   and\nnewlines.",
    "Emoji 🙂🚀 and 中文字符 测试 and café naïve résumé.",
]


def write_tokenizer(dest: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer with ChatML special tokens, trained on CORPUS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHATML, "bos_token": None, "eos_token": "<|im_end|>", "add_bos_token": False,
        "model_max_length": 256}))


def write_tiny_llama(dest: Path, tied: bool, seed: int = 0, vocab_size: int = 512, **overrides) -> Path:
    """A 2-layer GQA Llama (4 query heads, 2 KV heads) with random weights, saved as safetensors."""
    import torch
    import transformers
    cfg = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
               tie_word_embeddings=tied, rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=None,
               eos_token_id=2)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    with torch.no_grad():   # random-init Llama has tiny logits; widen them so numerics tests bite
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.08)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    write_tokenizer(dest, vocab_size)
    return dest
