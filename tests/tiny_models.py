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


def write_tokenizer(dest: Path, vocab_size: int, specials: tuple[str, ...] = ()) -> None:
    """A byte-level BPE tokenizer with ChatML special tokens (and `specials` after them), trained on CORPUS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", *specials],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHATML, "bos_token": None, "eos_token": "<|im_end|>", "add_bos_token": False,
        "model_max_length": 256}))


GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
GEMMA_CHAT = ("{{ bos_token }}{% for message in messages %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' "
              "else message['role'] }}\n{{ message['content'] }}<end_of_turn>\n{% endfor %}"
              "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def write_gemma_tokenizer(dest: Path, vocab_size: int) -> None:
    """A Gemma-style tokenizer (SentencePiece BPE as tokenizer.json writes it: spaces normalised to `▁`,
    no pre-tokenizer, byte fallback through <0x00>..<0xFF>, BOS prepended) of exactly `vocab_size` tokens:
    Gemma's specials, the 256 byte tokens, then pieces trained on CORPUS (padded with <unused*> pieces)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors, trainers
    space = "\u2581"
    learner = Tokenizer(models.BPE())
    learner.normalizer = normalizers.Replace(" ", space)
    learned = vocab_size - len(GEMMA_SPECIALS) - 256
    learner.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(vocab_size=learned, show_progress=False))
    trained = json.loads(learner.to_str())["model"]
    pieces = sorted(trained["vocab"], key=trained["vocab"].get)[:learned]
    pieces += [f"<unused{i}>" for i in range(learned - len(pieces))]
    vocab = {t: i for i, t in enumerate([*GEMMA_SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), *pieces])}
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    merges = [m for m in merges if m[0] + m[1] in vocab]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", space)
    tok.decoder = decoders.Sequence([decoders.Replace(space, " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GEMMA_SPECIALS])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos>:1 $B:1",
                                                       special_tokens=[("<bos>", vocab["<bos>"])])
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": GEMMA_CHAT, "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "unk_token": "<unk>", "add_bos_token": True, "model_max_length": 256}))


_TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
             bos_token_id=None, eos_token_id=2)


def write_tiny_llama(dest: Path, tied: bool, seed: int = 0, vocab_size: int = 512, **overrides) -> Path:
    """A 2-layer GQA Llama (4 query heads, 2 KV heads) with random weights, saved as safetensors."""
    return write_tiny("Llama", dest, tied, seed, vocab_size, **overrides)


def write_tiny_qwen2(dest: Path, tied: bool, seed: int = 0, vocab_size: int = 512, **overrides) -> Path:
    """The same shape as a Qwen2 (q/k/v biases, randomised like the weights)."""
    return write_tiny("Qwen2", dest, tied, seed, vocab_size, **overrides)


def write_tiny(family: str, dest: Path, tied: bool, seed: int = 0, vocab_size: int = 512, **overrides) -> Path:
    """transformers' <family>ForCausalLM at the tiny shape above, random weights, saved as safetensors."""
    import torch
    import transformers
    cfg = dict(_TINY, vocab_size=vocab_size, tie_word_embeddings=tied, **overrides)
    torch.manual_seed(seed)
    config = getattr(transformers, f"{family}Config")(**cfg)
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    with torch.no_grad():   # random-init models have tiny logits; widen them so numerics tests bite
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.08)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.5)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    write_tokenizer(dest, vocab_size)
    return dest


def reference_logits(model, ids: list[int]):
    """transformers' logits at every position [seq, vocab] (numpy)."""
    import torch
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy tokens, each from a full forward over the whole sequence (no cache)."""
    import numpy as np
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(reference_logits(model, seq)[-1])))
    return seq[len(prompt):]


def compiles_to_match(src: Path, reference, dest: Path, ids: list[int], tol: float):
    """`src` compiled q0f32 for the CPU at `dest` matches `reference` (assert_prefill_and_decode_match) and passes
    `kiln check` against transformers; returns the artifact's config."""
    import kiln
    from kiln.runtime import Artifact
    art = kiln.compile(str(src), target="cpu", quant="q0f32", output=dest)
    assert_prefill_and_decode_match(art, reference, ids, tol)
    report = kiln.check(art)
    assert report.ok and report.reference.startswith("transformers"), report.table()
    return Artifact.load(art).config


def assert_prefill_and_decode_match(artifact: Path, reference, ids: list[int], tol: float, steps: int = 5) -> None:
    """The compiled model's logits equal the reference's: every prefill position (batch_verify; in the chunks a
    sliding window over TVM's cache allows), the last-token prefill, then `steps` greedy decode steps."""
    import numpy as np

    from kiln.runtime.artifact import Artifact
    from kiln.runtime.model_runner import ModelRunner
    runner = ModelRunner(Artifact.load(artifact))
    expected = reference_logits(reference, ids)
    runner.add_sequence(0)                     # every prefill position (batch_verify)
    got, pos = [], 0
    while pos < len(ids):
        n = runner.window.max_chunk(runner.sequence_length(0)) if runner.window else len(ids)
        got.append(runner.verify(0, ids[pos:pos + n]))
        pos += n
    np.testing.assert_allclose(np.concatenate(got), expected, atol=tol, rtol=0)
    runner.add_sequence(1)                     # last-token prefill, then greedy decode steps
    logits = runner.prefill([1], [ids])[0]
    np.testing.assert_allclose(logits, expected[-1], atol=tol, rtol=0)
    seq = list(ids)
    for _ in range(steps):
        seq.append(int(np.argmax(logits)))
        logits = runner.decode([1], [seq[-1]])[0]
        np.testing.assert_allclose(logits, reference_logits(reference, seq)[-1], atol=tol, rtol=0)
    assert np.abs(expected).max() > 0.5, "logits too small for the tolerance to mean anything"


def widen(model) -> None:
    """`model`'s parameters drawn again so a 1e-4 tolerance bites: matrices N(0, 0.08), vectors N(0, 0.3) (norm
    weights around 1, biases around 0)."""
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.08 if p.ndim == 2 else 0.3).add_(1.0 if p.ndim == 1 and "bias" not in name else 0.0)


def write_widened(model_cls: str, config_cls: str, cfg: dict, dest: Path, seed: int = 0):
    """A transformers model (class names as strings) with random weights widened so a 1e-4 tolerance
    bites (norm weights around 1), saved to dest with a tokenizer; returned in eval mode."""
    import torch
    import transformers
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**cfg, attn_implementation="eager"))
    widen(model)
    with torch.no_grad():
        for name, b in model.named_buffers():       # a router's choice bias (DeepSeek-V3's), zeros at init;
            if name.endswith(("e_score_correction_bias", ".expert_bias",      # Gemma 4's layer scalars, ones
                              "balancing_biases")):                           # (ZAYA's: zeros, its skip's -1)
                b.normal_(0.0, 0.3)
            elif name.endswith("layer_scalar"):
                b.normal_(1.0, 0.3)
    dest.mkdir(parents=True)
    model.save_pretrained(dest)
    write_tokenizer(dest, cfg.get("vocab_size", 512))
    return model.eval()


def assert_recurrent_engine(artifact: Path) -> None:
    """An artifact with recurrent layers (state slots) in the engine: chunked prefill (16-token steps), a batch of 4,
    n = 3 (the choices forking the first's state where its prompt's last token is left) and slots freed and reused
    give the tokens a plain run gives; a conversation's next turn continues its
    cached state (the prefix cache's whole entries), a conversation that begins as two others did starts at the
    state cached where they parted (a checkpoint), each giving a cold run's tokens; speculation refused."""
    import numpy as np
    import pytest

    from kiln import Engine, EngineConfig, SamplingParams
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(3, 500, size=int(rng.integers(2, 60))).tolist() for _ in range(4)]
    plain = Engine(artifact)
    alone = [plain.generate(p, greedy).token_ids for p in prompts]
    engine = Engine(artifact, EngineConfig(max_tokens_per_step=16))           # prompts cut into chunks, batched
    assert engine.scheduler.prefix_cache.whole and not engine.runner.shares_kv
    assert [o.token_ids for o in engine.generate(prompts, greedy)] == alone
    turn = prompts[1] + alone[1] + [7, 8, 9]                 # the next turn: the cached entry, then new tokens
    cold = Engine(artifact, EngineConfig(enable_prefix_cache=False)).generate(turn, greedy).token_ids
    hits = engine.stats().prefix_cache_hit_tokens
    assert engine.generate(turn, greedy).token_ids == cold
    assert engine.stats().prefix_cache_hit_tokens - hits == len(prompts[1]) + len(alone[1]) - 1
    system = rng.integers(3, 500, size=70).tolist()          # conversations that begin alike: a checkpoint at 70
    chats = [system + rng.integers(3, 500, size=k).tolist() for k in (5, 9, 4)]
    cold = [Engine(artifact, EngineConfig(enable_prefix_cache=False)).generate(c, greedy).token_ids for c in chats]
    hits = engine.stats().prefix_cache_hit_tokens
    assert [engine.generate(c, greedy).token_ids for c in chats] == cold
    assert engine.stats().prefix_cache_hit_tokens - hits == 70  # the third started at the second's checkpoint
    hits = engine.stats().prefix_cache_hit_tokens
    n = engine.generate(prompts[0], SamplingParams(max_tokens=6, temperature=0.0, n=3, ignore_eos=True))
    assert [o.token_ids for o in n] == [alone[0][:6]] * 3
    assert engine.stats().prefix_cache_hit_tokens - hits == 2 * (len(prompts[0]) - 1)   # the parent's checkpoint
    again = [engine.generate(p, greedy).token_ids for p in prompts[:2]]       # slots freed and reused
    assert again == alone[:2]
    with pytest.raises(ValueError, match="recurrent layers"):
        Engine(artifact, EngineConfig(speculative_tokens=3))
