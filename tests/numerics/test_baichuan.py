"""Baichuan / Baichuan 2 (their own code: BaichuanForCausalLM, which transformers does not ship) q0f32 on the CPU
against a PyTorch reference of that code: Llama's layers with q, k, v as W_pack's rows; the 13B form's ALiBi (its
_gen_alibi_mask: slope_h * j over the keys, _get_interleave's slopes) in place of RoPE, the 7B form's RoPE on halves
(transformers' Llama computes it); Baichuan 2's NormHead (its head's rows normalised at inference). Each form as its
config.json has it: Baichuan-7B's BaiChuanForCausalLM, the 13B models' BaichuanForCausalLM, Baichuan 2 by its
125,696-token vocabulary."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import kiln
from kiln.runtime import Artifact
from tiny_models import assert_prefill_and_decode_match, write_tokenizer

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(10).integers(0, 500, size=19).tolist()
HIDDEN, HEADS, LAYERS, FFN = 96, 6, 2, 128         # 6 heads: ALiBi's slopes past the closest power of two


def _slopes(n: int) -> list[float]:
    """Baichuan's _get_interleave, as its code has it."""
    def power_of_2(m):
        start = 2 ** (-2 ** -(math.log2(m) - 3))
        return [start * start ** i for i in range(m)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _slopes(2 * closest)[0::2][:n - closest]


def causal_alibi(n: int, alibi: bool = True) -> torch.Tensor:
    """[heads, n, n]: ALiBi's slope_h * j over the keys (Baichuan's _gen_alibi_mask; nothing where not `alibi`) plus
    the causal mask."""
    slopes = torch.tensor(_slopes(HEADS)) if alibi else torch.zeros(HEADS)
    return slopes[:, None, None] * torch.arange(n, dtype=torch.float32)[None, None, :] + \
        torch.full((n, n), float("-inf")).triu(1)


class Reference:
    """Baichuan's forward over the tensors (float32): ALiBi or RoPE, NormHead where Baichuan 2."""

    def __init__(self, w: dict, alibi: bool, norm_head: bool):
        self.w = {k: torch.from_numpy(v) for k, v in w.items()}
        self.alibi, self.norm_head = alibi, norm_head

    def __call__(self, ids: torch.Tensor):
        w, d, n = self.w, HIDDEN // HEADS, ids.shape[1]
        rms = lambda x, g: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g     # noqa: E731
        x = w["model.embed_tokens.weight"][ids[0]]
        pos = torch.arange(n, dtype=torch.float32)
        bias = causal_alibi(n, self.alibi)
        inv = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        angles = torch.cat([pos[:, None] * inv[None]] * 2, -1)

        def rope(t):                                        # [heads, n, d], on halves
            half = torch.cat([-t[..., d // 2:], t[..., :d // 2]], -1)
            return t * angles.cos() + half * angles.sin()

        for i in range(LAYERS):
            p = f"model.layers.{i}."
            h = rms(x, w[p + "input_layernorm.weight"])
            q, k, v = (h @ w[p + "self_attn.W_pack.weight"].T).view(n, 3, HEADS, d).permute(1, 2, 0, 3)
            if not self.alibi:
                q, k = rope(q), rope(k)
            scores = q @ k.transpose(-1, -2) / math.sqrt(d) + bias
            o = (scores.softmax(-1) @ v).permute(1, 0, 2).reshape(n, HIDDEN)
            x = x + o @ w[p + "self_attn.o_proj.weight"].T
            h = rms(x, w[p + "post_attention_layernorm.weight"])
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        head = w["lm_head.weight"]
        head = torch.nn.functional.normalize(head) if self.norm_head else head
        return SimpleNamespace(logits=(rms(x, w["model.norm.weight"]) @ head.T)[None])


def write_baichuan(dest, arch: str, vocab: int) -> dict:
    """Random Baichuan tensors under its checkpoints' names with its config.json (as released: model_max_length,
    no rope_theta), and a tokenizer; the tensors returned."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(0)
    normal = lambda *shape, s=0.15: rng.normal(0, s, shape).astype(np.float32)      # noqa: E731
    w = {"model.embed_tokens.weight": normal(vocab, HIDDEN, s=1.0), "model.norm.weight": 1 + normal(HIDDEN, s=0.3),
         "lm_head.weight": normal(vocab, HIDDEN, s=0.3 if vocab < 1000 else 3.0)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": 1 + normal(HIDDEN, s=0.3),
                  p + "post_attention_layernorm.weight": 1 + normal(HIDDEN, s=0.3),
                  p + "self_attn.W_pack.weight": normal(3 * HIDDEN, HIDDEN), p + "self_attn.o_proj.weight":
                  normal(HIDDEN, HIDDEN), p + "mlp.gate_proj.weight": normal(FFN, HIDDEN),
                  p + "mlp.up_proj.weight": normal(FFN, HIDDEN), p + "mlp.down_proj.weight": normal(HIDDEN, FFN)})
    dest.mkdir(parents=True)
    save_file(w, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps({
        "architectures": [arch], "model_type": "baichuan", "hidden_size": HIDDEN, "intermediate_size": FFN,
        "num_attention_heads": HEADS, "num_hidden_layers": LAYERS, "vocab_size": vocab, "model_max_length": 256,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        "tie_word_embeddings": False, "auto_map": {"AutoModelForCausalLM": "modeling_baichuan.BaichuanForCausalLM"}}))
    write_tokenizer(dest, 512)
    return w


@pytest.mark.parametrize("arch, vocab, alibi", [
    ("BaiChuanForCausalLM", 512, False),            # Baichuan-7B: RoPE
    ("BaichuanForCausalLM", 512, True),             # Baichuan-13B: ALiBi
    ("BaichuanForCausalLM", 125696, True)])         # Baichuan 2 13B: ALiBi, NormHead
def test_baichuan_matches_its_code(arch, vocab, alibi, tmp_path):
    w = write_baichuan(tmp_path / "hf", arch, vocab)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, Reference(w, alibi, vocab == 125696), IDS, 1e-4)
    notes = Artifact.load(art).config.notes
    assert any(("ALiBi" if alibi else "RoPE") in n and ("NormHead" in n) == (vocab == 125696) for n in notes), notes


def test_the_reference_is_sensitive_to_what_it_checks(tmp_path):
    """The reference's NormHead and ALiBi change its logits (so the test above can fail)."""
    w = write_baichuan(tmp_path / "hf", "BaichuanForCausalLM", 125696)
    ids = torch.tensor([IDS])
    base = Reference(w, True, True)(ids).logits
    assert (base - Reference(w, True, False)(ids).logits).abs().max() > 1.0
    assert (base - Reference(w, False, True)(ids).logits).abs().max() > 1e-3


@pytest.mark.parametrize("layers", [2, 32])
def test_baichuan_gguf(layers, tmp_path, monkeypatch):
    """Baichuan's GGUF (arch baichuan, as BaichuanModel writes it: W_pack as q, k and v, q and k permuted; written
    by tests/gguf_writer.py, as this llama.cpp's converter recurses without end on it): ALiBi off 32 layers, RoPE at
    32 (llama.cpp's rule), Baichuan 2's head normalised as the model does; its code's logits."""
    from gguf_writer import write_gguf
    monkeypatch.setattr(__import__(__name__), "LAYERS", layers)
    w = write_baichuan(tmp_path / "hf", "BaichuanForCausalLM", 125696 if layers == 2 else 512)
    path = write_gguf(tmp_path / "hf", tmp_path / "baichuan.gguf")
    art = kiln.compile(str(path), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, Reference(w, layers != 32, layers == 2), IDS, 1e-4)


REFACT_FF = 256         # Refact's MLP width: 2/3 of 4 x hidden, up to a multiple of 256 (what the converter computes)


class RefactReference:
    """Refact's forward (GPTRefactForCausalLM, as llama.cpp's refact graph runs it) over its tensors (float32): Llama's
    layers without RoPE, ALiBi (the standard slopes), one KV head (attn.kv: k's rows, then v's), the MLP's gate and up
    as one gate_up_proj."""

    def __init__(self, w: dict):
        self.w = {k: torch.from_numpy(v) for k, v in w.items()}

    def __call__(self, ids: torch.Tensor):
        w, d, n = self.w, HIDDEN // HEADS, ids.shape[1]
        rms = lambda x, g: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g     # noqa: E731
        x = w["transformer.wte.weight"][ids[0]]
        bias = causal_alibi(n)
        for i in range(LAYERS):
            p = f"transformer.h.{i}."
            h = rms(x, w[p + "ln_1.weight"])
            q = (h @ w[p + "attn.q.weight"].T).view(n, HEADS, d).transpose(0, 1)
            k, v = (h @ w[p + "attn.kv.weight"].T).split(d, dim=-1)
            o = ((q @ k.T / math.sqrt(d) + bias).softmax(-1) @ v).transpose(0, 1).reshape(n, HIDDEN)
            x = x + o @ w[p + "attn.c_proj.weight"].T
            gate, up = (rms(x, w[p + "ln_2.weight"]) @ w[p + "mlp.gate_up_proj.weight"].T).split(REFACT_FF, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.c_proj.weight"].T
        return SimpleNamespace(logits=(rms(x, w["transformer.ln_f.weight"]) @ w["lm_head.weight"].T)[None])


def write_refact(dest) -> RefactReference:
    """Random Refact tensors under its checkpoints' names with its config.json (n_embd, n_head, n_layer,
    n_positions, layer_norm_epsilon), and a tokenizer; the reference over them returned."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(1)
    normal = lambda *shape, s=0.15: rng.normal(0, s, shape).astype(np.float32)      # noqa: E731
    d = HIDDEN // HEADS
    w = {"transformer.wte.weight": normal(512, HIDDEN, s=1.0), "transformer.ln_f.weight": 1 + normal(HIDDEN, s=0.3),
         "lm_head.weight": normal(512, HIDDEN, s=0.3)}
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        w.update({p + "ln_1.weight": 1 + normal(HIDDEN, s=0.3), p + "ln_2.weight": 1 + normal(HIDDEN, s=0.3),
                  p + "attn.q.weight": normal(HIDDEN, HIDDEN), p + "attn.kv.weight": normal(2 * d, HIDDEN),
                  p + "attn.c_proj.weight": normal(HIDDEN, HIDDEN),
                  p + "mlp.gate_up_proj.weight": normal(2 * REFACT_FF, HIDDEN),
                  p + "mlp.c_proj.weight": normal(HIDDEN, REFACT_FF)})
    dest.mkdir(parents=True)
    save_file(w, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps({
        "architectures": ["GPTRefactForCausalLM"], "model_type": "gpt_refact", "n_embd": HIDDEN, "n_head": HEADS,
        "n_layer": LAYERS, "n_positions": 256, "layer_norm_epsilon": 1e-5, "vocab_size": 512, "bos_token_id": 1,
        "eos_token_id": 2, "tie_word_embeddings": False}))
    write_tokenizer(dest, 512)
    return RefactReference(w)
