"""targets/cpu/argmax.py: greedy_tokens' chunk argmax vectorised for a CPU. Built from the function
models/causal_lm.py emits, for this machine's CPU: the winners bit for bit those of the reduction the
generic CPU rules schedule, and the row tokens numpy's argmax (ties inside and across chunks, a tie
over a whole tail, an all -inf row, the last logit); a chunk size with a scalar tail; the match."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te, tirx
from tvm.s_tir import dlight as dl

from kiln.models.causal_lm import _argmax_chunks, _argmax_te, _chunk_argmax_te
from kiln.targets import get_profile
from kiln.targets.cpu.argmax import ChunkArgmax

pytestmark = pytest.mark.compiler


def _function(vocab: int, chunks: int):
    x = te.placeholder((tirx.Var("batch_size", "int64"), tirx.IntImm("int64", 1), tirx.IntImm("int64", vocab)),
                       "float32", name="logits")
    return te.create_prim_func([x, _chunk_argmax_te(x, chunks)])


def _logits(vocab: int) -> np.ndarray:
    x = np.random.default_rng(vocab).normal(0, 4, (6, 1, vocab)).astype(np.float32)
    x[1, 0, [7, 9, vocab // 2 + 3]] = x[1].max() + 1            # ties in the first chunk and a later one
    x[2, 0, :] = -1e30
    x[2, 0, vocab // 3:] = 2.5                                  # a tie from inside a chunk to the end
    x[3, 0, :] = -np.inf                                        # nothing allowed: numpy says 0
    x[4, 0, vocab - 1] = 1e9                                    # the very last logit
    return x


# SmolLM2's (32 x 1536); 2 x 1030 (a 6-logit tail); GPT-2's (29 x 1733, no power of two divides it)
@pytest.mark.parametrize("vocab", [49152, 2060, 50257])
def test_winners_equal_the_reductions_and_tokens_numpys(vocab):
    chunks = _argmax_chunks(vocab)
    assert chunks > 1
    func = _function(vocab, chunks)
    profile = get_profile("cpu")
    target = profile.tvm_target()
    rules = profile.tuning_space().rules()
    assert any(isinstance(r, ChunkArgmax) for r in rules)
    with target:
        generic = dl.ApplyDefaultSchedule(*[r for r in rules if not isinstance(r, ChunkArgmax)])(
            tvm.IRModule({"main": func}))
    mine = ChunkArgmax().apply(func, target, False)
    assert mine is not None
    x = _logits(vocab)
    got = {}
    for name, mod in (("generic", generic), ("vectorised", tvm.IRModule({"main": mine.mod["main"]}))):
        winners = tvm.runtime.tensor(np.zeros((len(x), chunks, 2), np.float32))
        tvm.compile(mod, target=target)["main"](tvm.runtime.tensor(x), winners)
        got[name] = winners.numpy()
    np.testing.assert_array_equal(got["vectorised"], got["generic"])
    # The second kernel's rule (_argmax_of_chunks_te): the first chunk holding the row's maximum.
    w = got["vectorised"]
    tokens = [max(int(w[r, int(np.argmax(w[r, :, 1])), 0]), 0) for r in range(len(x))]
    np.testing.assert_array_equal(tokens, np.argmax(x[:, 0], axis=1))
    assert tokens[3] == 0 and tokens[4] == vocab - 1


def test_match_takes_only_the_chunk_argmax():
    target = get_profile("cpu").tvm_target()
    assert ChunkArgmax().apply(_function(49152, 32), target, False) is not None
    x = te.placeholder((tirx.Var("batch_size", "int64"), 1, 512), "float32", name="logits")
    assert ChunkArgmax().apply(te.create_prim_func([x, _argmax_te(x)]), target, False) is None   # one kernel a row
    assert ChunkArgmax().apply(_function(49152, 32), get_profile("cuda-sm90").tvm_target(), False) is None
