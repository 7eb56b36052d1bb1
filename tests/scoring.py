"""Perplexity of a text under a compiled artifact, shared by the numerics tests."""

from __future__ import annotations

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


def greedy_against(art: Path, model, ids: list[int], steps: int, near_tie: float,
                   atol: float | None = None) -> int:
    """Greedy decode of `ids` on the artifact against a transformers model recomputing the whole
    sequence each step: each step's argmax must agree, and the logits within `atol` when given,
    until the model's top two come within `near_tie`. Returns how many tokens were compared."""
    runner = ModelRunner(Artifact.load(art))
    runner.add_sequence(0)
    logits = runner.prefill([0], [ids])[0]
    seq, compared = list(ids), 0
    for _ in range(steps):
        expected = last_logits(model, seq)
        top2 = np.sort(expected)[-2:]
        if top2[1] - top2[0] < near_tie:
            break
        if atol is not None:
            np.testing.assert_allclose(logits, expected, atol=atol, rtol=0)
        assert int(np.argmax(logits)) == int(np.argmax(expected)), (compared, seq[len(ids):])
        compared += 1
        seq.append(int(np.argmax(expected)))
        logits = runner.decode([0], [seq[-1]])[0]
    return compared


def last_logits(model, seq: list[int]) -> np.ndarray:
    """A transformers causal LM's float32 logits at the last position of `seq`."""
    import torch
    with torch.no_grad():
        return model(torch.tensor([seq])).logits[0, -1].float().numpy()
