"""PLM (models/deepseek.py PLMConfig; PLM-Team's PLM-1.8B, its own code's PLMForCausalLM, which transformers does not
ship) q0f32 on the CPU. Its attention is Youtu-LLM's (multi-head latent attention, queries by one q_proj, RoPE on
interleaved pairs) and its MLP a squared ReLU without a gate: the reference is transformers' Youtu model with each
layer's MLP replaced by that one; test_gguf_converter.py checks llama.cpp's GGUF of the same checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import kiln
from kiln.models import ModelLoadError, build, load
from tiny_models import assert_prefill_and_decode_match, widen, write_tokenizer

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(16).integers(0, 500, size=17).tolist()
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
              v_head_dim=16, rms_norm_eps=1e-2, rope_theta=100000.0, max_position_embeddings=256,
              tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)


class SquaredReLU(torch.nn.Module):
    """PLM's MLP: down_proj(relu(up_proj x)^2)."""

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.up_proj = torch.nn.Linear(hidden, width, bias=False)
        self.down_proj = torch.nn.Linear(width, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(torch.relu(self.up_proj(x)) ** 2)


def write_plm(dest):
    """A tiny PLM checkpoint (its names: Youtu's attention, mlp.up_proj / mlp.down_proj; its config.json) with a
    tokenizer; returns the reference over its weights."""
    import transformers
    from safetensors.torch import save_file
    torch.manual_seed(5)
    model = transformers.YoutuForCausalLM(transformers.YoutuConfig(**CONFIG, attn_implementation="eager"))
    for layer in model.model.layers:
        layer.mlp = SquaredReLU(CONFIG["hidden_size"], CONFIG["intermediate_size"])
    widen(model)
    dest.mkdir(parents=True)
    weights = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}   # tied
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(dict(CONFIG, architectures=["PLMForCausalLM"], model_type="plm",
                                                      hidden_act="relu2", rope_interleave=True)))
    write_tokenizer(dest, CONFIG["vocab_size"])
    return model.eval()


def test_plm_matches_youtus_attention_with_its_mlp(tmp_path):
    ref = write_plm(tmp_path / "hf")
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)


def test_plm_with_another_activation_is_refused(tmp_path):
    write_plm(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), hidden_act="silu")))
    with pytest.raises(ModelLoadError, match="PLM's MLP is a squared ReLU"):
        build(load(tmp_path / "hf"))
