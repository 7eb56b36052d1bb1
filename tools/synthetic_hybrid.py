"""A random-weight recurrent hybrid at a released model's sizes, for tools/bench_vs_transformers.py (no such
checkpoint ships on PyPI). Shapes (from the released configs, random weights):

    granite-h-350m   Granite-4.0-H-350M-like: 32 layers (attention at 9, 17, 25, 31), hidden 768, 48 Mamba-2
                     heads of 32 over a 128-wide state, shared MLP 2048, vocabulary 100,352 tied, no RoPE
    falcon-h1-0.5b   Falcon-H1-0.5B-like: 36 layers of attention and Mamba-2 side by side, hidden 1024, 8 / 2
                     heads of 64, 24 Mamba heads of 64 over 128, MLP 2048, vocabulary 32,784
    qwen3.5-0.8b     Qwen3.5-0.8B-like (approximate): 24 layers (every 4th full attention: 8 / 2 heads of 256, gated),
                     18 gated DeltaNet layers of 16 key and 16 value heads of 128, MLP 3584, vocabulary 248,320 tied
    mamba-130m       state-spaces/mamba-130m-like: 24 Mamba-1 layers, hidden 768, state 16, vocabulary 50,280

    python tools/synthetic_hybrid.py granite-h-350m --out /tmp/bench/granite-h-350m
    python tools/bench_vs_transformers.py /tmp/bench/granite-h-350m --prompt-len 128 --gen-len 32 --runs 3

Measured 2026-12-05 (2 vCPUs, AMD EPYC Zen 4, q0f32, prompt 128, 32 tokens; kiln vs transformers 5.25 fp32,
prefill / decode tok/s; the floor at numpy's read bandwidth measured in the same run, which moved between runs):
granite-h-350m 265.6 / 30.7 vs 71.7 / 6.7 (77% of 40 tok/s at 54.4 GB/s); falcon-h1-0.5b 166.7 / 16.0 vs
76.0 / 4.8 (87% of 18 tok/s at 35.8 GB/s); mamba-130m 380.8 / 74.4 vs 204.6 / 17.1 (107% of 70 tok/s at 36.0
GB/s: that bandwidth reading was low).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "granite-h-350m": ("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", dict(
        vocab_size=100352, hidden_size=768, num_hidden_layers=32, num_attention_heads=12, num_key_value_heads=4,
        max_position_embeddings=32768, num_local_experts=0, num_experts_per_tok=0, intermediate_size=2048,
        shared_intermediate_size=2048,
        layer_types=["attention" if i in (9, 17, 25, 31) else "mamba" for i in range(32)], mamba_n_heads=48,
        mamba_d_head=32, mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2,
        position_embedding_type="nope", tie_word_embeddings=True, embedding_multiplier=12.0,
        attention_multiplier=0.0078125, residual_multiplier=0.246, logits_scaling=3.0)),
    "falcon-h1-0.5b": ("FalconH1ForCausalLM", "FalconH1Config", dict(
        vocab_size=32784, hidden_size=1024, intermediate_size=2048, num_hidden_layers=36, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=16384, mamba_d_ssm=1536, mamba_n_heads=24,
        mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128, rope_theta=1e11, tie_word_embeddings=False)),
    "qwen3.5-0.8b": ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", dict(
        vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
        num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
        max_position_embeddings=262144, tie_word_embeddings=True)),
    "mamba-130m": ("MambaForCausalLM", "MambaConfig", dict(
        vocab_size=50280, hidden_size=768, num_hidden_layers=24, state_size=16, expand=2, conv_kernel=4)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=list(SHAPES))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT / "tests"))
    import torch
    import transformers
    from tiny_models import write_tokenizer
    model_cls, config_cls, cfg = SHAPES[args.shape]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**cfg, eos_token_id=2, bos_token_id=1, pad_token_id=0)
    model = getattr(transformers, model_cls)(config).eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    write_tokenizer(args.out, cfg["vocab_size"])
    print(f"{args.shape}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters -> {args.out}")


if __name__ == "__main__":
    main()
