"""Perplexity of a text under a compiled artifact, shared by the numerics tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kiln.runtime import Artifact
from kiln.runtime.model_runner import ModelRunner

PERPLEXITY_TEXT = Path(__file__).parent / "data" / "perplexity.txt"


def perplexity(art: Path, text: str) -> float:
    """exp(mean NLL) of text's tokens under the artifact, from verify's per-position logits."""
    runner = ModelRunner(Artifact.load(art))
    ids = text_ids(art, text)
    runner.add_sequence(0)
    step = runner.prefill_chunk
    return _perplexity(np.concatenate([runner.verify(0, ids[i:i + step]) for i in range(0, len(ids), step)]), ids)


def reference_perplexity(model, ids: list[int]) -> float:
    """exp(mean NLL) of `ids` under a transformers causal LM (one forward, float64 log-softmax)."""
    import torch
    with torch.no_grad():
        return _perplexity(model(torch.tensor([ids])).logits[0].float().numpy(), ids)


def text_ids(art: Path, text: str) -> list[int]:
    """`text` in the artifact's own tokenizer's ids."""
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(art / "tokenizer.json")).encode(text).ids


def _perplexity(logits: np.ndarray, ids: list[int]) -> float:
    """exp(mean NLL) of ids[1:] given each position's logits [len(ids), vocab]."""
    logp = logits[:-1].astype(np.float64)
    logp -= logp.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))


@dataclass
class ReferenceGreedy:
    """A transformers model's greedy continuation of a prompt: before each of its tokens, its float32
    logits at the last position; it ends at `steps` tokens or where its top two came within the
    near-tie (that step's logits kept, its token not taken)."""
    ids: list[int]
    logits: list[np.ndarray]
    tokens: list[int]


def reference_greedy(model, ids: list[int], steps: int, near_tie: float) -> ReferenceGreedy:
    """Greedy decoding of `ids` on a transformers causal LM through its own KV cache (a token a
    forward, as generate runs it), every argmax taken, EOS included."""
    import torch
    logits, tokens = [], []
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        for _ in range(steps):
            last = out.logits[0, -1].float().numpy()
            logits.append(last)
            top2 = np.sort(last)[-2:]
            if top2[1] - top2[0] < near_tie:
                break
            tokens.append(int(np.argmax(last)))
            out = model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return ReferenceGreedy(list(ids), logits, tokens)


def greedy_against(art: Path, reference: ReferenceGreedy, atol: float | None = None) -> int:
    """Greedy decode of the reference's prompt on the artifact: each step's argmax must be the
    reference's token, and the logits within `atol` of its when given, until the reference's
    near-tie. Returns how many tokens were compared."""
    runner = ModelRunner(Artifact.load(art))
    runner.add_sequence(0)
    logits = runner.prefill([0], [reference.ids])[0]
    for compared, (expected, token) in enumerate(zip(reference.logits, reference.tokens)):
        if atol is not None:
            np.testing.assert_allclose(logits, expected, atol=atol, rtol=0)
        assert int(np.argmax(logits)) == token, (compared, reference.tokens[:compared])
        logits = runner.decode([0], [token])[0]
    return len(reference.tokens)
