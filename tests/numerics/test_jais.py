"""JAIS (models/alibi.py JaisConfig; its own code, JAISLMHeadModel, which transformers does not ship) q0f32 on the CPU
against a PyTorch reference of that code: GPT-2's layers (LayerNorms, biases, Conv1D weights [in, out]) with a SwiGLU
MLP (c_fc times silu(c_fc2)), ALiBi, scores over head_dim, the embeddings times mup_embeddings_scale and the logits
times mup_output_alpha x mup_width_scale; test_gguf_converter.py checks llama.cpp's GGUF of the same checkpoint
(muP's scales folded into its tensors)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import kiln
from test_baichuan import HEADS, HIDDEN, causal_alibi
from tiny_models import assert_prefill_and_decode_match, write_tokenizer

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(14).integers(0, 500, size=19).tolist()
LAYERS, FFN = 2, 160           # HIDDEN, HEADS: test_baichuan's (causal_alibi's slopes a head)
SCALES = dict(mup_embeddings_scale=3.0, mup_output_alpha=0.5, mup_width_scale=0.25)


class JaisReference:
    """JAISLMHeadModel's forward over its tensors (float32)."""

    def __init__(self, w: dict):
        self.w = {k: torch.from_numpy(v) for k, v in w.items()}

    def __call__(self, ids: torch.Tensor):
        w, d, n = self.w, HIDDEN // HEADS, ids.shape[1]

        def norm(x, name):
            return torch.nn.functional.layer_norm(x, (HIDDEN,), w[f"{name}.weight"], w[f"{name}.bias"], 1e-5)

        def conv1d(x, name):                        # GPT-2's Conv1D: x @ W + b, W [in, out]
            return x @ w[f"{name}.weight"] + w[f"{name}.bias"]
        x = w["transformer.wte.weight"][ids[0]] * SCALES["mup_embeddings_scale"]
        bias = causal_alibi(n)
        for i in range(LAYERS):
            p = f"transformer.h.{i}."
            q, k, v = (t.view(n, HEADS, d).transpose(0, 1)
                       for t in conv1d(norm(x, p + "ln_1"), p + "attn.c_attn").split(HIDDEN, dim=-1))
            o = ((q @ k.transpose(-1, -2) / d + bias).softmax(-1) @ v).transpose(0, 1).reshape(n, HIDDEN)
            x = x + conv1d(o, p + "attn.c_proj")
            h = norm(x, p + "ln_2")
            x = x + conv1d(conv1d(h, p + "mlp.c_fc") * torch.nn.functional.silu(conv1d(h, p + "mlp.c_fc2")),
                           p + "mlp.c_proj")
        width = SCALES["mup_output_alpha"] * SCALES["mup_width_scale"]
        return SimpleNamespace(logits=(norm(x, "transformer.ln_f") @ w["lm_head.weight"].T * width)[None])


def write_jais(dest) -> JaisReference:
    """Random JAIS tensors under its checkpoints' names with its config.json, and a tokenizer; the reference over
    them returned."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(2)
    normal = lambda *shape, s=0.15: rng.normal(0, s, shape).astype(np.float32)      # noqa: E731
    w = {"transformer.wte.weight": normal(512, HIDDEN, s=0.5), "transformer.ln_f.weight": 1 + normal(HIDDEN, s=0.3),
         "transformer.ln_f.bias": normal(HIDDEN, s=0.3), "lm_head.weight": normal(512, HIDDEN, s=0.5)}
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        for name, (rows, cols) in (("attn.c_attn", (HIDDEN, 3 * HIDDEN)), ("attn.c_proj", (HIDDEN, HIDDEN)),
                                   ("mlp.c_fc", (HIDDEN, FFN)), ("mlp.c_fc2", (HIDDEN, FFN)),
                                   ("mlp.c_proj", (FFN, HIDDEN))):
            w.update({f"{p}{name}.weight": normal(rows, cols), f"{p}{name}.bias": normal(cols, s=0.3)})
        for ln in ("ln_1", "ln_2"):
            w.update({f"{p}{ln}.weight": 1 + normal(HIDDEN, s=0.3), f"{p}{ln}.bias": normal(HIDDEN, s=0.3)})
    dest.mkdir(parents=True)
    save_file(w, str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps({
        "architectures": ["JAISLMHeadModel"], "model_type": "jais", "n_embd": HIDDEN, "n_head": HEADS,
        "n_layer": LAYERS, "n_inner": FFN, "n_positions": 256, "layer_norm_epsilon": 1e-5, "vocab_size": 512,
        "activation_function": "swiglu", "position_embedding_type": "alibi", "mup_scale_qk_dot_by_d": True,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, **SCALES}))
    write_tokenizer(dest, 512)
    return JaisReference(w)


def test_jais_matches_its_code(tmp_path):
    ref = write_jais(tmp_path / "hf")
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)
