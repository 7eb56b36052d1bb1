"""Apple's OpenELM against a PyTorch reference built from transformers' own Qwen3 modules (its q and k RMS-normed a
head before RoPE, as OpenELM's; the checkpoints' modeling_openelm.py is remote code, not in transformers): each
layer its own query heads, KV heads and MLP width, q / k / v one Linear, gate and up one, the embedding tied."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import kiln
from kiln.runtime import Artifact

from tiny_models import assert_prefill_and_decode_match, widen, write_tokenizer

pytestmark = pytest.mark.numerics

QUICK_LLVM = True
TOL = 1e-4
IDS = np.random.default_rng(12).integers(0, 512, size=17).tolist()
# OpenELM-270M's shape in little: heads and widths growing with depth
CONFIG = dict(model_type="openelm", architectures=["OpenELMForCausalLM"], vocab_size=512, model_dim=64, head_dim=16,
              num_transformer_layers=3, num_query_heads=[2, 4, 6], num_kv_heads=[1, 2, 3],
              ffn_multipliers=[0.5, 2.0, 4.0], ffn_dim_divisor=32, ffn_with_glu=True, activation_fn_name="swish",
              normalize_qk_projections=True, share_input_output_layers=True, rope_freq_constant=10000,
              rope_max_length=512, max_context_length=256, qkv_multipliers=[0.5, 1.0], num_gqa_groups=2,
              bos_token_id=1, eos_token_id=2)


def width(mult: float, hidden: int, divisor: int) -> int:
    """modeling_openelm.py's make_divisible(mult * hidden, divisor), written here apart from kiln's."""
    v = mult * hidden
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def reference(config: dict):
    """OpenELMForCausalLM as modeling_openelm.py builds it, from transformers' Qwen3Attention (q / k norms a head
    before RoPE), Qwen3MLP, Qwen3RMSNorm and Qwen3RotaryEmbedding, each layer with its own Qwen3Config; random weights
    widened so a 1e-4 tolerance bites. Its state dict is written in OpenELM's names (state_dict below)."""
    import torch
    from transformers import Qwen3Config
    from transformers.models.qwen3 import modeling_qwen3 as mq

    n, hidden = config["num_transformer_layers"], config["model_dim"]
    base = Qwen3Config(vocab_size=config["vocab_size"], hidden_size=hidden, num_hidden_layers=n,
                       head_dim=config["head_dim"], rms_norm_eps=1e-6, rope_theta=config["rope_freq_constant"],
                       max_position_embeddings=config["max_context_length"], layer_types=["full_attention"] * n,
                       attention_bias=False, attn_implementation="eager", num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=64)

    class Layer(torch.nn.Module):
        def __init__(self, i: int):
            super().__init__()
            own = copy.copy(base)
            own.num_attention_heads, own.num_key_value_heads = config["num_query_heads"][i], config["num_kv_heads"][i]
            own.intermediate_size = width(config["ffn_multipliers"][i], hidden, config["ffn_dim_divisor"])
            self.attn_norm, self.ffn_norm = mq.Qwen3RMSNorm(hidden, 1e-6), mq.Qwen3RMSNorm(hidden, 1e-6)
            self.attn, self.ffn = mq.Qwen3Attention(own, i), mq.Qwen3MLP(own)

        def forward(self, x, rope, mask):
            x = x + self.attn(self.attn_norm(x), rope, mask)[0]
            return x + self.ffn(self.ffn_norm(x))

    class ForCausalLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.token_embeddings = torch.nn.Embedding(config["vocab_size"], hidden)
            self.layers = torch.nn.ModuleList([Layer(i) for i in range(n)])
            self.norm = mq.Qwen3RMSNorm(hidden, 1e-6)
            self.rotary = mq.Qwen3RotaryEmbedding(base)

        def forward(self, ids):
            x = self.token_embeddings(ids)
            s = ids.shape[1]
            rope = self.rotary(x, torch.arange(s)[None])
            mask = torch.full((s, s), float("-inf")).triu(1)[None, None]
            for layer in self.layers:
                x = layer(x, rope, mask)
            return type("Output", (), {"logits": self.norm(x) @ self.token_embeddings.weight.T})

        def state_dict_as_openelm(self) -> dict:
            out = {"transformer.token_embeddings.weight": self.token_embeddings.weight,
                   "transformer.norm.weight": self.norm.weight}
            for i, layer in enumerate(self.layers):
                k, a, f = f"transformer.layers.{i}", layer.attn, layer.ffn
                out.update({
                    f"{k}.attn_norm.weight": layer.attn_norm.weight, f"{k}.ffn_norm.weight": layer.ffn_norm.weight,
                    f"{k}.attn.qkv_proj.weight": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                    f"{k}.attn.q_norm.weight": a.q_norm.weight, f"{k}.attn.k_norm.weight": a.k_norm.weight,
                    f"{k}.attn.out_proj.weight": a.o_proj.weight,
                    f"{k}.ffn.proj_1.weight": torch.cat([f.gate_proj.weight, f.up_proj.weight]),
                    f"{k}.ffn.proj_2.weight": f.down_proj.weight})
            return {name: t.detach().contiguous() for name, t in out.items()}

    torch.manual_seed(0)
    model = ForCausalLM()
    widen(model)
    return model.eval()


def write_openelm(dest, config: dict = CONFIG, tokenizer=write_tokenizer):
    from safetensors.torch import save_file
    model = reference(config)
    dest.mkdir(parents=True)
    save_file(model.state_dict_as_openelm(), str(dest / "model.safetensors"))
    (dest / "config.json").write_text(json.dumps(config))
    if tokenizer is not None:
        tokenizer(dest, config["vocab_size"])
    return model


def test_openelm_matches_its_reference(tmp_path):
    ref = write_openelm(tmp_path / "hf")
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, TOL)
    config = Artifact.load(art).config
    assert config.kv_cache.owner == "kiln" and [tuple(s) for s in config.kv_cache.layer_kv] == [(1, 16), (2, 16),
                                                                                                  (3, 16)]


def test_openelm_widths_and_refusals():
    """The MLP widths OpenELM-270M's config makes (model_dim 1280, divisor 256), and configs kiln cannot run refused by
    name."""
    from kiln.models.openelm import OpenELMConfig, make_divisible
    mults = [0.5, 0.73, 0.97, 1.2, 1.43, 1.67, 1.9, 2.13, 2.37, 2.6, 2.83, 3.07, 3.3, 3.53, 3.77, 4.0]
    assert [make_divisible(m * 1280, 256) for m in mults] == [width(m, 1280, 256) for m in mults]
    assert make_divisible(0.5 * 1280, 256) == 768 and make_divisible(4.0 * 1280, 256) == 5120
    c = OpenELMConfig.from_hf(CONFIG)
    assert (c.query_heads, c.kv_heads, c.widths) == ((2, 4, 6), (1, 2, 3), (32, 128, 256))
    assert c.tie_word_embeddings and c.norm_eps == 1e-6 and c.context_window_size == 256
    for change, message in ((dict(num_kv_heads=[1, 2]), "num_kv_heads must list one positive int a layer"),
                            (dict(num_kv_heads=[1, 3, 3]), "layer 1: 4 query heads do not group over 3"),
                            (dict(ffn_multipliers=[1.0]), "ffn_multipliers must list one positive number a layer"),
                            (dict(ffn_with_glu=False), "ffn_with_glu False"),
                            (dict(activation_fn_name="gelu"), "activation_fn_name 'gelu'")):
        with pytest.raises(ValueError, match=message):
            OpenELMConfig.from_hf(dict(CONFIG, **change))
