"""batch_prefill_gemm: a profile's library_gemm builds batch_prefill again with the prompt's matmuls
through the device's BLAS (compiler/passes/library_gemm.py, runtime/library_gemm.py).

On this CPU the same path runs on torch's CPU matmul: the tiny Llama compiled with library_gemm has
the entry, its token matmuls (4 a layer, not the logits') call kiln.gemm_nt, the runner takes it
from MIN_TOKENS tokens a forward, and its logits are batch_prefill's up to summation order; the
same for batch_decode_gemm from MIN_DECODE_ROWS sequences a decode step. The
quantized weights reach the BLAS dequantized once, at load (batch_prefill_gemm_weights): equal to
the dequantize kernel's values, none computed in a forward, and left off where memory is short.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kiln import targets
from kiln.runtime import Artifact, library_gemm
from kiln.runtime import model_runner
from kiln.runtime.contract import GEMM_PACKED_FUNC, LIBRARY_GEMM_COPIES, LIBRARY_GEMM_ENTRY, LIBRARY_GEMM_WEIGHTS
from kiln.runtime.memory_budget import DeviceMemory
from kiln.runtime.model_runner import ModelRunner

LAYERS = 2
PROMPTS = [list(range(3, 70)), list(range(5, 40))]


@pytest.fixture(scope="module")
def gemm_calls():
    """Every kiln.gemm_nt call of this module's runners, counted (registered before the runtime's)."""
    import tvm
    calls = []
    if tvm.get_global_func(GEMM_PACKED_FUNC, allow_missing=True) is not None:
        pytest.skip(f"{GEMM_PACKED_FUNC} is registered already in this process")

    def counted(x, w, out):
        calls.append(tuple(w.shape))
        library_gemm._gemm_nt(x, w, out)

    tvm.register_global_func(GEMM_PACKED_FUNC, counted)
    yield calls


@pytest.fixture(scope="module", params=["q4f16", "q0f32"])
def gemm_artifact(request, tiny_dirs, tmp_path_factory, gemm_calls):
    import kiln
    make = targets._PROFILES["cpu"]
    targets._PROFILES["cpu"] = lambda: dataclasses.replace(make(), library_gemm=True)
    try:
        return kiln.compile(str(tiny_dirs["untied"]), target="cpu", quant=request.param, golden=False,
                            output=tmp_path_factory.mktemp("gemm") / request.param)
    finally:
        targets._PROFILES["cpu"] = make


def _prefill(runner: ModelRunner, then_decode: bool = False) -> np.ndarray:
    """The prompts' last-token logits; or, then_decode, the logits of one decode step after them."""
    ids = [0, 1]
    for i in ids:
        runner.add_sequence(i)
    try:
        logits = runner.prefill(ids, PROMPTS)
        return runner.decode(ids, [5, 6]) if then_decode else logits
    finally:
        for i in ids:
            runner.remove_sequence(i)


def _close(routed: np.ndarray, plain: np.ndarray, artifact) -> None:
    tol = 1e-5 if "q0f32" in artifact.name else 5e-3          # float16 activations: rounding order
    np.testing.assert_allclose(routed, plain, atol=tol * np.abs(plain).max(), rtol=0)
    assert (routed.argmax(-1) == plain.argmax(-1)).all()


def test_long_forwards_take_the_blas_entry_with_batch_prefills_logits(gemm_artifact, gemm_calls, monkeypatch):
    runner = ModelRunner(Artifact.load(gemm_artifact), max_num_seqs=4)
    assert LIBRARY_GEMM_ENTRY in runner.artifact.config.entry_functions and runner.gemm_unusable is None
    tokens = sum(map(len, PROMPTS))
    monkeypatch.setattr(library_gemm, "MIN_TOKENS", tokens + 1)
    del gemm_calls[:]
    plain = _prefill(runner)                                   # one token short: batch_prefill
    assert gemm_calls == []
    monkeypatch.setattr(library_gemm, "MIN_TOKENS", tokens)
    routed = _prefill(runner)
    # qkv, o, gate-up and down of each layer; not the logits of the gathered positions.
    assert len(gemm_calls) == 4 * LAYERS and all(rows != runner.vocab_size for rows, _ in gemm_calls)
    _close(routed, plain, gemm_artifact)


def test_decode_steps_of_many_sequences_take_the_blas_entry(gemm_artifact, gemm_calls, monkeypatch):
    runner = ModelRunner(Artifact.load(gemm_artifact), max_num_seqs=4)
    monkeypatch.setattr(library_gemm, "MIN_TOKENS", 10**6)              # prefills through batch_prefill
    monkeypatch.setattr(library_gemm, "MIN_DECODE_ROWS", 3)
    monkeypatch.setattr(library_gemm, "DECODE_CALL_VALUES", 0)           # the crossover not scaled
    del gemm_calls[:]
    plain = _prefill(runner, then_decode=True)                           # 2 sequences: batch_decode
    assert gemm_calls == []
    monkeypatch.setattr(library_gemm, "MIN_DECODE_ROWS", 2)
    routed = _prefill(runner, then_decode=True)
    # qkv, o, gate-up and down of each layer; the LM head too where the logits have the weights' dtype
    # (float32 weights; float16 ones sum their logits into float32).
    head = [rows for rows, _ in gemm_calls if rows == runner.vocab_size]
    assert len(gemm_calls) - len(head) == 4 * LAYERS and len(head) == ("q0f32" in gemm_artifact.name)
    _close(routed, plain, gemm_artifact)
    # The compile counted what those calls multiply, the mean a call: the crossover's scale.
    values = [rows * cols for rows, cols in gemm_calls]
    assert runner.artifact.config.library_gemm_call_values == sum(values) // len(values)


def test_the_decode_crossover_scales_with_the_matmuls(gemm_artifact, monkeypatch):
    """A model whose matmuls are a fraction of the 8B's takes the BLAS decode entry from
    proportionally more sequences (runtime/library_gemm.py min_decode_rows); the tiny model's from
    more than it serves, which its load message says."""
    cfg = Artifact.load(gemm_artifact).config
    values = cfg.library_gemm_call_values
    assert 0 < values < library_gemm.DECODE_CALL_VALUES
    rows = library_gemm.min_decode_rows(cfg)
    assert rows == -(-library_gemm.MIN_DECODE_ROWS * library_gemm.DECODE_CALL_VALUES // values) > cfg.max_batch_size
    assert "no decode step" in library_gemm.note(cfg, None)
    at_8b = dataclasses.replace(cfg, library_gemm_call_values=library_gemm.DECODE_CALL_VALUES, max_batch_size=256)
    assert library_gemm.min_decode_rows(at_8b) == library_gemm.MIN_DECODE_ROWS
    assert f"decode steps of {library_gemm.MIN_DECODE_ROWS}+ sequences" in library_gemm.note(at_8b, None)
    older = dataclasses.replace(cfg, library_gemm_call_values=0)            # an artifact from before the count
    assert library_gemm.min_decode_rows(older) == library_gemm.MIN_DECODE_ROWS
    monkeypatch.setattr(library_gemm, "DECODE_CALL_VALUES", 2 * values)
    assert library_gemm.min_decode_rows(cfg) == 2 * library_gemm.MIN_DECODE_ROWS


def test_the_blas_weights_are_made_once_at_load(gemm_artifact, gemm_calls):
    """q4f16: each routed matmul's weight is a float16 tensor the runner made at load, equal to
    dequantizing its planes as the forward's kernels do (reference: the q4 scheme's numpy
    dequantization); q0f32 stores float weights, so nothing is lifted and nothing is kept."""
    from kiln.compiler.quant_modules import QuantFormat
    from kiln.compiler.quant_pack import dequantize
    runner = ModelRunner(Artifact.load(gemm_artifact), max_num_seqs=4)
    cfg = runner.artifact.config
    assert LIBRARY_GEMM_WEIGHTS in cfg.entry_functions and runner.gemm_unusable is None
    assert f"{library_gemm.MIN_TOKENS}+ tokens" in runner.library_gemm_note()
    weights = [w.numpy() for w in runner.gemm_weights]
    assert cfg.library_gemm_bytes == sum(w.nbytes for w in weights)
    if "q0f32" in gemm_artifact.name:
        assert weights == []
        return
    assert len(weights) == 4 * LAYERS and all(w.dtype == np.float16 for w in weights)
    params = dict(zip(cfg.params, runner.params))
    qkv = "model.layers.0.self_attn.qkv_proj"                    # the first routed matmul
    planes = {plane: params[f"{qkv}.{plane}"].numpy() for plane in ("qweight", "scale")}
    np.testing.assert_array_equal(weights[0], dequantize(QuantFormat("q4", 32), planes, "float16"))


def test_short_memory_leaves_the_entry_off(gemm_artifact, monkeypatch):
    monkeypatch.setattr(library_gemm, "device_memory", lambda *_: DeviceMemory(free=2**20, total=2**30))
    runner = ModelRunner(Artifact.load(gemm_artifact), max_num_seqs=4, max_total_tokens=256)
    if runner.artifact.config.library_gemm_bytes == 0:          # q0f32: nothing to keep, always fits
        assert runner.gemm_unusable is None
        return
    assert "do not fit beside a KV cache of" in runner.gemm_unusable
    assert runner.library_gemm_note() == f"the BLAS entries unused: {runner.gemm_unusable}"
    assert runner.gemm_weights is None and not set(LIBRARY_GEMM_COPIES) & set(runner._fn)


def test_weights_that_fail_to_be_made_leave_the_entries_off(gemm_artifact, monkeypatch):
    """Out of device memory while the float weights are made (or any TVM error): the runner loads
    without the BLAS entries and says why."""

    class FailingVM(model_runner.VirtualMachine):
        def __getitem__(self, name):
            if name != LIBRARY_GEMM_WEIGHTS:
                return super().__getitem__(name)

            def fail(*_):
                raise RuntimeError("CUDA: out of memory\nCheck failed: allocation of 14 GB")
            return fail

    monkeypatch.setattr(model_runner, "VirtualMachine", FailingVM)
    runner = ModelRunner(Artifact.load(gemm_artifact), max_num_seqs=4)
    assert runner.gemm_unusable == "making its float weights failed (Check failed: allocation of 14 GB)"
    assert runner.gemm_weights is None and not set(LIBRARY_GEMM_COPIES) & set(runner._fn)
    assert _prefill(runner).shape == (2, runner.vocab_size)                  # batch_prefill serves


def test_artifacts_without_the_entry_never_take_it(tiny_artifacts):
    runner = ModelRunner(Artifact.load(tiny_artifacts["untied"]))
    assert runner.gemm_unusable == "not in this artifact" and LIBRARY_GEMM_ENTRY not in runner._fn
    assert runner.library_gemm_note() is None


def test_unusable_says_why():
    assert library_gemm.unusable("cpu") is None
    assert "metal" in library_gemm.unusable("metal")
