"""SmallThinker (models/smallthinker.py; its own code, SmallThinkerForCausalLM, which transformers does not ship) q0f32
on the CPU against a PyTorch reference of that code: Llama attention (NoPE where rope_layout says 0, a window where
sliding_window_layout says 1), every MLP ReGLU experts whose router reads the layer's input, top k by logit weighted by
their softmax or their sigmoids renormalised; test_gguf_converter.py checks llama.cpp's GGUF of the same checkpoint."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import kiln
from kiln.models import ModelLoadError, build, load
from tiny_models import assert_prefill_and_decode_match, write_tokenizer

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(15).integers(0, 500, size=19).tolist()
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS, EXPERTS, TOP_K, WIDTH, VOCAB = 64, 4, 2, 16, 4, 8, 3, 32, 512
# the 21B's layout (three sliding RoPE layers to each full NoPE one, the full one first), its window shorter than IDS
RELEASED_21B = dict(rope_layout=[0, 1, 1, 1], sliding_window_layout=[0, 1, 1, 1], sliding_window_size=6)


class SmallThinkerReference:
    """SmallThinkerForCausalLM's forward over its tensors (float32)."""

    def __init__(self, w: dict, config: dict):
        self.w, self.c = {k: torch.from_numpy(v) for k, v in w.items()}, config

    def __call__(self, ids: torch.Tensor):
        w, c, n = self.w, self.c, ids.shape[1]

        def rms(x, name):
            return w[name] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["rms_norm_eps"]))

        def rotated(x):                                                  # rotate-half RoPE, [heads, n, d]
            inv = 1.0 / c["rope_theta"] ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
            angles = torch.cat([torch.outer(torch.arange(n).float(), inv)] * 2, dim=-1)
            half = torch.cat([-x[..., HEAD_DIM // 2:], x[..., :HEAD_DIM // 2]], dim=-1)
            return x * angles.cos() + half * angles.sin()
        q_at, k_at = torch.arange(n)[:, None], torch.arange(n)[None, :]
        x = w["model.embed_tokens.weight"][ids[0]]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = rms(x, p + "input_layernorm.weight")
            q, k, v = ((h @ w[f"{p}self_attn.{t}_proj.weight"].T).view(n, -1, HEAD_DIM).transpose(0, 1) for t in "qkv")
            if c["rope_layout"][i]:
                q, k = rotated(q), rotated(k)
            k, v = (t.repeat_interleave(HEADS // KV_HEADS, dim=0) for t in (k, v))
            hidden = k_at > q_at
            if c["sliding_window_layout"][i]:
                hidden = hidden | (q_at - k_at >= c["sliding_window_size"])
            scores = (q @ k.transpose(-1, -2) * HEAD_DIM ** -0.5).masked_fill(hidden, float("-inf"))
            o = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, -1) @ w[p + "self_attn.o_proj.weight"].T
            after = x + o
            m = rms(after, p + "post_attention_layernorm.weight")
            logits, chosen = torch.topk(x @ w[p + "block_sparse_moe.primary_router.weight"].T, TOP_K, dim=-1)
            if c["moe_primary_router_apply_softmax"]:
                weights = logits.softmax(-1)
            else:
                weights = logits.sigmoid() / logits.sigmoid().sum(-1, keepdim=True)
            y = torch.zeros_like(m)
            for t in range(n):
                for j in range(TOP_K):
                    e = f"{p}block_sparse_moe.experts.{int(chosen[t, j])}."
                    hid = (m[t] @ w[e + "up.weight"].T) * torch.relu(m[t] @ w[e + "gate.weight"].T)
                    y[t] += weights[t, j] * (hid @ w[e + "down.weight"].T)
            x = after + y
        head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
        return SimpleNamespace(logits=(rms(x, "model.norm.weight") @ head.T)[None])


def write_smallthinker(dest, softmax: bool = False, tied: bool = True, **layout) -> SmallThinkerReference:
    """Random SmallThinker tensors under its checkpoints' names with its config.json (RELEASED_21B's layout unless
    `layout` says otherwise), and a tokenizer; the reference over them returned."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(4)
    normal = lambda *shape, s=0.15: rng.normal(0, s, shape).astype(np.float32)      # noqa: E731
    w = {"model.embed_tokens.weight": normal(VOCAB, HIDDEN, s=0.3), "model.norm.weight": 1 + normal(HIDDEN, s=0.3)}
    if not tied:
        w["lm_head.weight"] = normal(VOCAB, HIDDEN, s=0.3)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for name, rows in (("q", HEADS * HEAD_DIM), ("k", KV_HEADS * HEAD_DIM), ("v", KV_HEADS * HEAD_DIM)):
            w[f"{p}self_attn.{name}_proj.weight"] = normal(rows, HIDDEN)
        w[f"{p}self_attn.o_proj.weight"] = normal(HIDDEN, HEADS * HEAD_DIM)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            w[f"{p}{norm}.weight"] = 1 + normal(HIDDEN, s=0.3)
        w[f"{p}block_sparse_moe.primary_router.weight"] = normal(EXPERTS, HIDDEN, s=0.6)   # sharp: tokens differ
        for j in range(EXPERTS):
            e = f"{p}block_sparse_moe.experts.{j}."
            w.update({e + "gate.weight": normal(WIDTH, HIDDEN, s=0.2), e + "up.weight": normal(WIDTH, HIDDEN, s=0.2),
                      e + "down.weight": normal(HIDDEN, WIDTH, s=0.2)})
    dest.mkdir(parents=True)
    save_file(w, str(dest / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["SmallThinkerForCausalLM"], "model_type": "smallthinker", "hidden_size": HIDDEN,
              "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
              "head_dim": HEAD_DIM, "vocab_size": VOCAB, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "max_position_embeddings": 256, "moe_num_primary_experts": EXPERTS,
              "moe_num_active_primary_experts": TOP_K, "moe_ffn_hidden_size": WIDTH,
              "moe_primary_router_apply_softmax": softmax, "moe_layer_layout": [1] * LAYERS,
              "moe_shared_primary_experts": 0, "moe_enable_secondary_experts": False, "use_qk_norm": False,
              "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": tied, **RELEASED_21B, **layout}
    config["sliding_window"] = config["sliding_window_size"]        # as its config class saves it
    (dest / "config.json").write_text(json.dumps(config))
    write_tokenizer(dest, VOCAB)
    return SmallThinkerReference(w, config)


@pytest.mark.parametrize("softmax, tied, layout", [
    (False, True, {}),                                          # the 21B's layout, sigmoid routing
    (True, False, dict(rope_layout=[1] * LAYERS, sliding_window_layout=[0] * LAYERS)),   # the 4B's, softmax
])
def test_smallthinker_matches_its_code(softmax, tied, layout, tmp_path):
    ref = write_smallthinker(tmp_path / "hf", softmax, tied, **layout)
    x = ref.w["model.embed_tokens.weight"][IDS]              # the first layer's picks differ from token to token
    assert len({tuple(sorted(t)) for t in torch.topk(x @ ref.w["model.layers.0.block_sparse_moe.primary_router."
                                                               "weight"].T, TOP_K).indices.tolist()}) > 5
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)


def test_smallthinker_with_a_bad_layout_is_refused(tmp_path):
    write_smallthinker(tmp_path / "hf", rope_layout=[1, 1])
    with pytest.raises(ModelLoadError, match="rope_layout must hold 1 or 0 for each of the 4 layers"):
        build(load(tmp_path / "hf"))
