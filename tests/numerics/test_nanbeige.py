"""Nanbeige 4.2 (models/nanbeige.py): a Llama whose layers run num_loops times, the final norm between loops unless
skip_loop_final_norm, each run of a layer at its own KV-cache slots. Its own code (NanbeigeForCausalLM) is not in
transformers: the reference is transformers' Llama layers run in those loops (as llama.cpp's nanbeige
graph; compiler/golden.py looped, `kiln check`'s). q0f32 on the CPU gives its logits at every prefill position, the
last-token prefill and decode steps; test_gguf_converter.py checks llama.cpp's GGUF of the same checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kiln.compiler.golden import looped
from kiln.models import ModelLoadError, build, load
from tiny_models import compiles_to_match, write_widened

pytestmark = pytest.mark.numerics
QUICK_LLVM = True
IDS = np.random.default_rng(8).integers(0, 500, size=17).tolist()
CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=0.05, eos_token_id=2, bos_token_id=1, tie_word_embeddings=False)


def write_nanbeige(hf, loops: int = 2, skip: bool = False):
    """A tiny Llama saved as Nanbeige's checkpoint (its config: architectures, model_type, num_loops,
    skip_loop_final_norm); returns the reference: its layers run in those loops (compiler/golden.py looped, what
    `kiln check` compares with)."""
    llama = write_widened("LlamaForCausalLM", "LlamaConfig", CONFIG, hf, seed=2)
    path = hf / "config.json"
    config = dict(json.loads(path.read_text()), architectures=["NanbeigeForCausalLM"], model_type="nanbeige",
                  num_loops=loops, skip_loop_final_norm=skip)
    path.write_text(json.dumps(config))
    return looped(llama, config, torch).eval()


@pytest.mark.parametrize("loops, skip", [(2, False), (3, True), (1, False)])
def test_nanbeige_matches_its_looped_llama(loops, skip, tmp_path):
    ref = write_nanbeige(tmp_path / "hf", loops, skip)
    config = compiles_to_match(tmp_path / "hf", ref, tmp_path / "art", IDS, 1e-4)     # `kiln check`: transformers'
    assert config.model.config["num_hidden_layers"] == 2 * loops                       # Llama in those loops


def test_nanbeige_without_a_whole_loop_count_is_refused(tmp_path):
    write_nanbeige(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), num_loops=0)))
    with pytest.raises(ModelLoadError, match="num_loops must be a whole number from 1"):
        build(load(tmp_path / "hf"))
