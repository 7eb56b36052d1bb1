"""Perplexity of a text under a compiled artifact, shared by the numerics tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kiln.runtime import Artifact
from kiln.runtime.model_runner import ModelRunner

PERPLEXITY_TEXT = Path(__file__).parent / "data" / "perplexity.txt"


def perplexity(art: Path, text: str) -> float:
    """exp(mean NLL) of text's tokens under the artifact, from verify's per-position logits."""
    from tokenizers import Tokenizer
    runner = ModelRunner(Artifact.load(art))
    ids = Tokenizer.from_file(str(art / "tokenizer.json")).encode(text).ids
    runner.add_sequence(0)
    step = runner.prefill_chunk
    logits = np.concatenate([runner.verify(0, ids[i:i + step]) for i in range(0, len(ids), step)])[:-1]
    logits = logits.astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))
