"""A random-weight mixture-of-experts model of a real one's layer shape, as a Q4_0 GGUF both engines run,
for tools/compare_llamacpp.py (no MoE GGUF ships on PyPI). Default: Qwen3-30B-A3B's layer shape (hidden
2048, 16 q / 4 kv heads of 128, 128 experts of 768, top 8) over --layers layers and a 32k vocabulary.

    python tools/synthetic_moe.py --out /tmp/moe            # writes /tmp/moe/hf and /tmp/moe/moe-q4_0.gguf
    python tools/compare_llamacpp.py --gguf /tmp/moe/moe-q4_0.gguf --no-transformers --prompt-len 64 --gen-len 64

compare_llamacpp's floor counts every weight; a token reads only its experts', so this prints the floor of
the bytes one decode step reads (attention, router, top-k experts, head) at a read bandwidth you give.
The GGUF is laid out as llama.cpp's converter writes it (tests/gguf_writer.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/moe"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--expert-size", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--read-gbs", type=float, default=None, help="read bandwidth for the active-bytes floor")
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT / "tests"))
    import torch
    import transformers
    from gguf_writer import write_gguf
    from tiny_models import write_tokenizer

    start, hf = time.time(), args.out / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    heads, kv_heads, head_dim = args.hidden // 128, max(1, args.hidden // 512), 128
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        num_experts=args.experts, num_experts_per_tok=args.top_k, moe_intermediate_size=args.expert_size,
        norm_topk_prob=True, max_position_embeddings=4096, tie_word_embeddings=False, eos_token_id=2)
    torch.manual_seed(0)
    with torch.no_grad():
        model = transformers.Qwen3MoeForCausalLM(cfg)
        for _, p in model.named_parameters():
            p.normal_(0.0, 0.02) if p.ndim > 1 else p.fill_(1.0)
    model.save_pretrained(hf, max_shard_size="100GB")           # one model.safetensors, as the writer reads
    write_tokenizer(hf, args.vocab)
    gguf = write_gguf(hf, args.out / "moe-q4_0.gguf", default="Q4_0")
    print(f"wrote {gguf} in {time.time() - start:.0f} s")

    q4 = 18 / 32                                                # Q4_0: 18 bytes a block of 32
    attention = args.hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * args.hidden
    experts = args.top_k * 3 * args.hidden * args.expert_size
    step = args.layers * ((attention + experts) * q4 + 4 * args.experts * args.hidden) + args.vocab * args.hidden * q4
    print(f"one decode step reads {step / 1e6:.1f} MB of weights (of {gguf.stat().st_size / 1e6:.0f} MB)")
    if args.read_gbs:
        print(f"active-bytes floor at {args.read_gbs} GB/s: {args.read_gbs * 1e9 / step:.0f} tok/s batch-1 decode")


if __name__ == "__main__":
    main()
