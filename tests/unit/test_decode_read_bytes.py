"""decode_read_bytes (runtime/bench.py): the weight bytes a batch-1 decode step streams, the
bandwidth floor's divisor. An untied model's embedding table is gathered a row a step, not read."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.runtime.bench import decode_read_bytes
from kiln.runtime.contract import PARAMS_DIR, ParamWriter

pytestmark = pytest.mark.unit

VOCAB, HIDDEN = 64, 16


def _artifact(tmp_path, lm_head: bool):
    writer = ParamWriter(tmp_path / PARAMS_DIR)
    tensors = {"model.embed_tokens.qweight": np.zeros((VOCAB, HIDDEN // 8), np.uint32),
               "model.embed_tokens.scale": np.zeros((VOCAB, 1), np.float16),
               "model.layers.0.mlp.down_proj.qweight": np.zeros((HIDDEN, HIDDEN // 8), np.uint32),
               "model.norm.weight": np.zeros(HIDDEN, np.float16)}
    if lm_head:
        tensors["lm_head.qweight"] = np.zeros((VOCAB, HIDDEN), np.int8)
    for name, array in tensors.items():
        writer.add(name, array)
    writer.close()
    return tmp_path, {name: a.nbytes for name, a in tensors.items()}


def test_an_lm_head_of_its_own_leaves_the_embedding_table_out(tmp_path):
    art, sizes = _artifact(tmp_path, lm_head=True)
    table = sizes["model.embed_tokens.qweight"] + sizes["model.embed_tokens.scale"]
    assert decode_read_bytes(art) == sum(sizes.values()) - table
    assert decode_read_bytes(art) < sum(f.stat().st_size for f in (art / PARAMS_DIR).glob("*.bin"))


def test_a_tied_model_reads_its_table_as_its_lm_head(tmp_path):
    art, sizes = _artifact(tmp_path, lm_head=False)
    assert decode_read_bytes(art) == sum(sizes.values())
