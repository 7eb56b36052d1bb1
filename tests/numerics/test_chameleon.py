"""Chameleon (models/chameleon.py) q0f32 on the CPU against transformers' ChameleonForConditionalGeneration on a text
prompt: q/k LayerNormed a head (each head its weight and bias), the norms before attention and MLP or, where
swin_norm (Chameleon 30B), after them; the image tokens' logits the lowest, as its forward gives them; `kiln check`
against transformers; its VQ-VAE unread, with a note."""

from __future__ import annotations

import numpy as np
import pytest

from tiny_models import compiles_to_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(10).integers(0, 500, size=19).tolist()
IMAGE_TOKENS = range(400, 480)
VOCABULARY = {**{f"tok{i}": i for i in range(512) if i not in IMAGE_TOKENS},
              **{"IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(i)) + "Z": i for i in IMAGE_TOKENS}}
VQ = dict(embed_dim=8, num_embeddings=16, base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1,
          latent_channels=8, resolution=32, attn_resolutions=[], in_channels=3, out_channels=3)


@pytest.mark.parametrize("swin_norm", [False, True])
def test_chameleon_matches_transformers(swin_norm, tmp_path):
    ref = write_widened("ChameleonForConditionalGeneration", "ChameleonConfig", dict(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=1, swin_norm=swin_norm,
        vocabulary_map=VOCABULARY, vq_config=VQ), tmp_path / "hf")
    config = compiles_to_match(tmp_path / "hf", ref, tmp_path / "art", IDS, 1e-4)
    assert any("80 image tokens get the lowest logit" in n for n in config.notes), config.notes


def write_for_the_converter(dest):
    """A Chameleon as released: each layer's q/k norms one row for every head (the released checkpoints repeat the
    original's; llama.cpp's converter keeps head 0's), the image tokens named in its tokenizer (IMGIMG*, added after
    the text's) as vocabulary_map names them, multi-head attention (the converter's q/k-norm permutation assumes it,
    as the released models have it); saved by transformers, returned."""
    import shutil

    import torch
    from tokenizers import Tokenizer

    from tiny_models import write_tokenizer
    staging = dest.parent / f"{dest.name}-tokenizer"
    staging.mkdir(parents=True)
    write_tokenizer(staging, 512)
    tok = Tokenizer.from_file(str(staging / "tokenizer.json"))
    tok.add_tokens(["IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(i)) + "Z" for i in range(8)])
    ref = write_widened("ChameleonForConditionalGeneration", "ChameleonConfig", dict(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=256, eos_token_id=2, bos_token_id=1,
        vocabulary_map=tok.get_vocab(), vq_config=VQ), dest)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith(("q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias")):
                p.copy_(p[:1].expand_as(p))
    ref.save_pretrained(dest)
    tok.save(str(dest / "tokenizer.json"))
    shutil.copy(staging / "tokenizer_config.json", dest / "tokenizer_config.json")
    return ref
