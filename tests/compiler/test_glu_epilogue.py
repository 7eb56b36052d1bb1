"""The gate-up projection's gated activation as its matmul's epilogue (profile `glu_epilogue`):
the graph pattern (compiler/passes/fuse_dequantize_matmul.py), the MMA GEMV's epilogue
(targets/mma_gemv.py) in its serial form on this CPU against the unfused kernels' arithmetic, the
matcher (targets/dequant_match.py), the head and tail the function splits into above the GEMV's
rows (targets/glu_epilogue.py) run on this CPU, and the CUDA the row dispatch builds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import relax, te, tirx

from kiln.compiler.quant_modules import QuantFormat
from kiln.compiler.quant_pack import quantize
from kiln.targets import get_profile
from kiln.targets.dequant_match import has_epilogue, match_dequant_matmul, silu_glu
from kiln.targets.glu_epilogue import apart, joined
from kiln.targets.mma_gemv import MMAGEMV, mma_gemv

from gpu_kernels import nvcc_compiles
from test_q4_gemv import q4_matmul_te

pytestmark = pytest.mark.compiler

FORMATS = {4: QuantFormat("q4", 32, "float16"), 8: QuantFormat("q8", 32, "float16")}


def _fused_glu_matmul(n: int, k: int, fmt: QuantFormat = FORMATS[4], rows=None, act=silu_glu):
    """A function shaped as the fused gate-up projection: dequantize -> NT_matmul (float32 sums) ->
    cast to float16 -> split in halves, sigmoid and two multiplies (the stages the legalized ops
    have), over `rows` activation rows (default: symbolic, decode's). `act`: how gate and up
    combine (silu_glu's; another to see the matcher refuse it)."""
    words, scale, x, sums = q4_matmul_te(n, k, fmt, rows)
    cast = te.compute(sums.shape, lambda a, b, r: sums[a, b, r].astype("float16"), name="compute")
    half = (sums.shape[0], sums.shape[1], tirx.IntImm("int64", n // 2))
    gate = te.compute(half, lambda a, b, r: cast[a, b, r], name="T_split_sections")
    up = te.compute(half, lambda a, b, r: cast[a, b, r + n // 2], name="T_split_sections_1")
    if act is silu_glu:
        sig = te.compute(half, lambda a, b, r: tirx.sigmoid(gate[a, b, r]), name="compute_1")
        silu = te.compute(half, lambda a, b, r: gate[a, b, r] * sig[a, b, r], name="T_multiply")
        out = te.compute(half, lambda a, b, r: silu[a, b, r] * up[a, b, r], name="T_multiply_1")
    else:
        out = te.compute(half, lambda a, b, r: act(gate[a, b, r], up[a, b, r]), name="T_multiply_1")
    return te.create_prim_func([words, scale, x, out])


def _run_cpu(func, arrays):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")
    args = [tvm.runtime.tensor(a, tvm.cpu()) for a in arrays]
    lib["main"](*args)
    return [a.numpy() for a in args]


def _silu_glu_cpu(sums: np.ndarray) -> np.ndarray:
    """silu_glu over float16 sums [rows, 1, n], TVM's arithmetic built for this CPU."""
    rows, _, n = sums.shape
    c = te.placeholder(sums.shape, "float16", name="c")
    o = te.compute((rows, 1, n // 2), lambda a, b, r: silu_glu(c[a, b, r], c[a, b, r + n // 2]), name="o")
    return _run_cpu(te.create_prim_func([c, o]), [sums, np.zeros((rows, 1, n // 2), np.float16)])[1]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n, k, warps, unroll, count, groups, pipeline", [
    (64, 512, 2, 2, None, 1, False), (32, 1024, 2, 2, 3, 1, True), (32, 512, 2, 1, 13, 2, False)])
def test_epilogue_writes_the_unfused_activation(bits, n, k, warps, unroll, count, groups, pipeline):
    """The serial form with the epilogue (tile j: gate rows 8j.. and the same outputs' up rows; each
    lane's gate and up sums combined after the block's reduction) against the same kernel without it
    (float16 sums of all n rows) followed by TVM's silu_glu on this CPU: equal bit for bit, for one
    static row and 3 or 13 symbolic rows (one MMA a step, two), q4 and q8, pipelined too; the rows
    past the count left alone."""
    fmt = FORMATS[bits]
    rows = None if count is None else tirx.Var("batch_size", "int64")
    c = count or 1
    rng = np.random.default_rng(n + k + bits)
    planes = quantize(fmt, rng.normal(0, 0.05, (n, k)).astype(np.float32))
    x = rng.normal(0, 1, (c, 1, k)).astype(np.float16)
    kw = dict(threads=False, count=rows, groups=groups, pipeline=pipeline)
    fused = mma_gemv(n, k, "float16", bits, warps, unroll, epilogue="silu_glu", **kw)
    plain = mma_gemv(n, k, "float16", bits, warps, unroll, **kw)
    got = _run_cpu(fused, [planes["qweight"], planes["scale"], x, np.full((c, 1, n // 2), 7, np.float16)])[3]
    sums = _run_cpu(plain, [planes["qweight"], planes["scale"], x, np.zeros((c, 1, n), np.float16)])[3]
    want = _silu_glu_cpu(sums)
    np.testing.assert_array_equal(got, want)
    assert np.abs(want).max() > 0.1                            # the activations are not all ~0


def test_matcher_takes_the_epilogue_only_where_asked():
    """match_dequant_matmul sees the gated activation after the cast (its output the function's) only
    when the caller computes it; has_epilogue says so whatever the caller; another combination of
    gate and up (up * silu(gate) is the same; gate * sigmoid(up) is not) is not silu_glu."""
    func = _fused_glu_matmul(256, 512)
    assert match_dequant_matmul(func, "float16") is None
    m = match_dequant_matmul(func, "float16", epilogues=("silu_glu",))
    assert m is not None and m.epilogue == "silu_glu" and m.n == 256 and m.k == 512
    assert m.out.same_as(func.params[-1]) and [int(d) for d in m.out.shape[1:]] == [1, 128]
    assert has_epilogue(func)
    other = _fused_glu_matmul(256, 512, act=lambda g, u: g * tirx.sigmoid(u))
    assert not has_epilogue(other) and match_dequant_matmul(other, "float16", epilogues=("silu_glu",)) is None
    cuda = get_profile("cuda-sm90").tvm_target()
    assert MMAGEMV(batch=8).apply(func, cuda, False) is not None
    assert MMAGEMV(batch=8).apply(other, cuda, False) is None


def test_head_and_tail_compute_the_function_on_the_cpu():
    """`apart`: the head (dequantize, matmul, cast: the float16 sums its output) and the tail (the
    activation from them); `joined` of the two (unscheduled here, built for this CPU), the sums a
    trailing workspace parameter: the same outputs as the fused function, bit for bit, and the
    workspace holds the sums."""
    n, k, rows = 64, 256, 3
    func = _fused_glu_matmul(n, k, rows=rows)
    head, tail, sums = apart(func)
    assert [int(d) for d in sums.shape] == [rows, 1, n] and sums.dtype == "float16"
    assert head.params[-1].same_as(sums) and tail.params[0].same_as(sums) and tail.params[-1].same_as(func.params[-1])
    both = joined(func, head, tail, sums)
    assert int(both.attrs["kiln.workspace_outputs"]) == 1 and both.params[-1].same_as(sums)
    rng = np.random.default_rng(0)
    planes = quantize(FORMATS[4], rng.normal(0, 0.05, (n, k)).astype(np.float32))
    x = rng.normal(0, 1, (rows, 1, k)).astype(np.float16)
    ins = [planes["qweight"], planes["scale"], x]
    want = _run_cpu(func, [*ins, np.zeros((rows, 1, n // 2), np.float16)])[3]
    got = _run_cpu(both.without_attr("tirx.is_scheduled"), [*ins, np.zeros((rows, 1, n // 2), np.float16),
                                                            np.zeros((rows, 1, n), np.float16)])
    np.testing.assert_array_equal(got[3], want)
    np.testing.assert_array_equal(_silu_glu_cpu(got[4]), want)
    from test_q4_gemv import _fused_q4_matmul
    assert apart(_fused_q4_matmul(n, k)) is None                     # no epilogue: nothing to split


def test_row_dispatch_builds_for_cuda(tmp_path):
    """LowBatchGEMV on the 8B's gate-up projection with the epilogue (4096 -> 2 x 14336): the MMA
    GEMV with the epilogue at 1-16 rows (one kernel, the activation written), above them the head's
    usual branches and the tail's elementwise kernel, the sums a workspace output; nvcc compiles it."""
    from kiln.targets.gpu import LowBatchGEMV
    profile = get_profile("cuda-sm90")
    func = _fused_glu_matmul(28672, 4096).with_attr("global_symbol", "gemv")
    with profile.tvm_target():
        merged = LowBatchGEMV()(tvm.IRModule({"gemv": func}))["gemv"]
    assert int(merged.attrs["kiln.workspace_outputs"]) >= 1
    assert [int(d) for d in merged.params[-1].shape[1:]] == [1, 28672]          # the sums, last
    source = tvm.compile(tvm.IRModule({"gemv": merged}), target=profile.tvm_target()).mod.imports[0].inspect_source()
    kernels = source.split('extern "C" __global__')
    mma = [k for k in kernels if "mma.sync.aligned.m16n8k16" in k and "T_multiply_1" in k]
    assert mma, "no MMA GEMV writes the activation"
    assert any("T_multiply_1" in k and "mma.sync" not in k and "wmma" not in k for k in kernels)   # the tail
    nvcc_compiles(source, tmp_path)


def test_graph_pattern_groups_batch_decode_alone(tiny_dirs):
    """The graph phase of a cuda-sm90 q4f16 build of the tiny Llama with `glu_epilogue`: batch_decode
    calls one grouped function for the gate-up projection and its gated activation (no split left in
    it), prefill keeps its split; without the flag batch_decode keeps it too."""
    from kiln.compiler.build import CompileOptions, export_model
    from kiln.compiler.passes.fuse_dequantize_matmul import GLU_PATTERN_NAME
    from kiln.compiler.pipeline import phases
    ex = export_model(CompileOptions(model=str(tiny_dirs["tied"]), target="cuda-sm90", quant="q4f16"))

    def graph(profile):
        with profile.tvm_target():
            return tvm.transform.Sequential(phases(profile)[0][1])(ex.mod)

    def splits(mod, name):
        found = []
        relax.analysis.post_order_visit(mod[name].body, lambda e: found.append(e) if isinstance(
            e, relax.Call) and getattr(e.op, "name", "") == "relax.split" else None)
        return len(found)

    profile = get_profile("cuda-sm90")
    plain, fused = graph(profile), graph(dataclasses.replace(profile, glu_epilogue=True))
    layers = splits(plain, "batch_decode")
    assert layers > 0 and splits(fused, "batch_decode") == 0
    assert splits(fused, "prefill") == splits(plain, "prefill") == layers
    grouped = [gv for gv, f in fused.functions_items() if isinstance(f, relax.Function) and f.attrs is not None
               and f.attrs.get("Composite") == GLU_PATTERN_NAME]
    assert len(grouped) >= 1


def cuda_artifact_ir(tmp_path, monkeypatch, **fields) -> tuple[str, str]:
    """`kiln compile` for cuda-sm90 (q4f16) of a Llama wide enough for the MMA GEMV (hidden 256,
    intermediate 512) with the profile's `fields` set: the artifact written, its lowered batch_decode
    and prefill (dump_ir's text)."""
    import kiln
    from kiln import targets
    from tiny_models import write_tiny_llama
    src = write_tiny_llama(tmp_path / "hf", tied=True, hidden_size=256, intermediate_size=512)
    make = targets._PROFILES["cuda-sm90"]
    monkeypatch.setitem(targets._PROFILES, "cuda-sm90", lambda: dataclasses.replace(make(), **fields))
    art = kiln.compile(str(src), target="cuda-sm90", quant="q4f16", output=tmp_path / "art", dump_ir=tmp_path / "ir")
    assert art.is_dir() and any(art.iterdir())
    lowered = (tmp_path / "ir" / "3-lower.py").read_text()

    def body(name):
        start = lowered.index(f"    def {name}(")
        return lowered[start:lowered.index("@R.function", start)]
    return body("batch_decode"), body("prefill")
