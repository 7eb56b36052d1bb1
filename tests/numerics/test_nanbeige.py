"""Nanbeige 4.2 (models/nanbeige.py): a Llama whose layers run num_loops times, the final norm between loops unless
skip_loop_final_norm, each run of a layer at its own KV-cache slots. Its own code (NanbeigeForCausalLM) is not in
transformers: the reference is transformers' Llama layers run in those loops (LoopedLlama, llama.cpp's nanbeige
graph). q0f32 on the CPU gives its logits at every prefill position, the last-token prefill and decode steps;
test_gguf_converter.py checks llama.cpp's GGUF of the same checkpoint."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import kiln
from kiln.models import ModelLoadError, build, load
from tiny_models import assert_prefill_and_decode_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(8).integers(0, 500, size=17).tolist()
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=0.05, eos_token_id=2, bos_token_id=1, tie_word_embeddings=False)


class LoopedLlama(torch.nn.Module):
    """transformers' Llama (`llama`) with its layers run `loops` times, normed between loops unless `skip`."""

    def __init__(self, llama, loops: int, skip: bool):
        super().__init__()
        self.llama, self.loops, self.skip = llama, loops, skip

    def forward(self, ids):
        m = self.llama.model
        x = m.embed_tokens(ids)
        positions = torch.arange(ids.shape[1])[None]
        rope = m.rotary_emb(x, positions)
        mask = torch.full((ids.shape[1],) * 2, float("-inf")).triu(1)[None, None]
        for j in range(self.loops):
            if j and not self.skip:
                x = m.norm(x)
            for layer in m.layers:
                x = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rope)
        return SimpleNamespace(logits=self.llama.lm_head(m.norm(x)))


def write_nanbeige(hf, loops: int = 2, skip: bool = False) -> LoopedLlama:
    """A tiny Llama saved as Nanbeige's checkpoint (its config: architectures, model_type, num_loops,
    skip_loop_final_norm); returns the reference."""
    llama = write_widened("LlamaForCausalLM", "LlamaConfig", CONFIG, hf, seed=2)
    path = hf / "config.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), architectures=["NanbeigeForCausalLM"],
                                    model_type="nanbeige", num_loops=loops, skip_loop_final_norm=skip)))
    return LoopedLlama(llama, loops, skip).eval()


@pytest.mark.parametrize("loops, skip", [(2, False), (3, True), (1, False)])
def test_nanbeige_matches_its_looped_llama(loops, skip, tmp_path):
    ref = write_nanbeige(tmp_path / "hf", loops, skip)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    assert_prefill_and_decode_match(art, ref, IDS, 1e-4)


def test_nanbeige_without_a_whole_loop_count_is_refused(tmp_path):
    write_nanbeige(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), num_loops=0)))
    with pytest.raises(ModelLoadError, match="num_loops must be a whole number from 1"):
        build(load(tmp_path / "hf"))
