"""targets/owned_kv.py's attention kernel (what GPUs run over the KV cache kiln owns; its CPU form shares
the row's arithmetic) against numpy in float64: ragged rows of two sequences across pages, full and
sliding, with and without sinks, with ALiBi's slopes."""

from __future__ import annotations

import numpy as np
import pytest

from attention_reference import owned_attention_reference
from kiln.targets.owned_kv import NO_SINK, owned_attention

pytestmark = pytest.mark.numerics
H_KV, H_Q, D, P, SCALE = 2, 4, 16, 4, 0.25


@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("with_sinks", [False, True, "alibi"])
def test_attention_by_position_matches_numpy(window, with_sinks):
    import tvm
    alibi = with_sinks == "alibi"
    func = owned_attention(H_KV, H_Q, D, "float32", P, SCALE, window=window, alibi=alibi)
    lib = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target({"kind": "llvm"}))
    rng = np.random.default_rng(window + 2 * (with_sinks is True) + 4 * alibi)
    pages_of = [[3, 0], [5, 1, 2]]                          # sequence 0: 7 tokens; 1: 10
    pages = rng.standard_normal((6, 2, H_KV, P, D)).astype(np.float32)
    rows = [(0, 4), (0, 5), (0, 6), (1, 9), (1, 0)]          # (sequence, position)
    q = rng.standard_normal((len(rows), H_Q, D)).astype(np.float32)
    sinks = rng.standard_normal(H_Q).astype(np.float32) if with_sinks is True else np.full(H_Q, NO_SINK, np.float32)
    slopes = (2.0 ** -np.arange(1, H_Q + 1)).astype(np.float32) if alibi else None
    tables = [np.array([0, 2, 5], np.int32), np.array([3, 0, 5, 1, 2], np.int32),
              np.array([r[0] for r in rows], np.int32), np.array([r[1] for r in rows], np.int32)]
    out = tvm.runtime.tensor(np.zeros_like(q))
    lib["main"](*(tvm.runtime.tensor(a) for a in (q, pages, *tables, sinks, slopes if alibi else sinks)), out)
    want = owned_attention_reference(q, pages, pages_of, rows, sinks, window, SCALE, slopes)
    np.testing.assert_allclose(out.numpy(), want, atol=1e-6, rtol=0)
