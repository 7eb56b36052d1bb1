"""The residual add + RMSNorm computed by the matmul that reads it (profile `norm_prologue`): the graph
rewrite (compiler/passes/fuse_norm_matmul.py), the MMA GEMV's prologue (targets/mma_gemv.py `norm`)
in its serial form on this CPU against the norm kernel's order of arithmetic, the matcher and the
split (targets/norm_prologue.py), the row dispatch built for CUDA, and whole builds with the rewrite:
a CPU one against the build without it, a cuda-sm90 one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import relax, te, tirx

from kiln.compiler.passes.fuse_add_rms_norm import add_rms_norm_te
from kiln.compiler.quant_modules import QuantFormat
from kiln.compiler.quant_pack import quantize
from kiln.targets import get_profile
from kiln.targets.add_rms_norm import gpu_row_split
from kiln.targets.glu_epilogue import joined
from kiln.targets.mma_gemv import MMAGEMV, mma_gemv
from kiln.targets.norm_prologue import match_norm

from gpu_kernels import nvcc_compiles
from test_glu_epilogue import _run_cpu, cuda_artifact_ir
from test_q4_gemv import q4_matmul_te

pytestmark = pytest.mark.compiler

FORMATS = {4: QuantFormat("q4", 32, "float16"), 8: QuantFormat("q8", 32, "float16")}
EPS = 1e-5


def _norm_matmul(n: int, k: int, fmt: QuantFormat = FORMATS[4], rows=None, eps: float = EPS, scale_first=False):
    """A function shaped as the grouped add + norm and matmul after FuseTIR: y = x + r, rms_norm(y, w)
    (fuse_add_rms_norm's stages), dequantize -> NT_matmul -> cast of the norm; params x, r, w, codes,
    scale, y, out over `rows` (default symbolic: decode's). `scale_first`: the norm's product in
    another order (w * y * rsqrt), which is not the kernel's."""
    i64 = lambda v: tirx.IntImm("int64", v)                                  # noqa: E731
    rows = tirx.Var("batch_size", "int64") if rows is None else i64(rows)
    x = te.placeholder((rows, i64(1), i64(k)), "float16", name="x")
    r = te.placeholder((rows, i64(1), i64(k)), "float16", name="r")
    w = te.placeholder((i64(k),), "float16", name="w")
    y, normed = add_rms_norm_te(x, r, w, eps)
    if scale_first:
        j = te.reduce_axis((i64(0), i64(k)), name="j")
        ss = te.compute((rows, i64(1)), lambda a, b: te.sum(y[a, b, j].astype("float32") * y[a, b, j].astype("float32"),
                                                          axis=j), name="T_multiply_red")
        inv = te.compute((rows, i64(1)), lambda a, b: tirx.rsqrt(ss[a, b] / tirx.const(float(k), "float32")
                                                                  + tirx.const(eps, "float32")), name="rsqrt")
        normed = te.compute(y.shape, lambda a, b, c: (w[c].astype("float32") * y[a, b, c].astype("float32")
                                                      * inv[a, b]).astype("float16"), name="T_rms_norm")
    words, scale, _, sums = q4_matmul_te(n, k, fmt, x=normed)
    out = te.compute(sums.shape, lambda a, b, c: sums[a, b, c].astype("float16"), name="compute")
    return te.create_prim_func([x, r, w, words, scale, y, out])


def _gpu_norm(x, r, w, threads: int, vec: int):
    """(y, norm) in numpy float32 steps in the order the AddRMSNorm CUDA kernel takes (targets/gpu.py):
    thread t sums the squares of values (o * threads + t) * vec + lane in order, each warp's sums meet
    by shuffles down 16..1 into lane 0, the warps' as a tree of halves; rsqrt(ss / k + eps) * y * w."""
    y = x + r
    out = np.zeros_like(y)
    k = y.shape[-1]
    for b in range(y.shape[0]):
        yy = y[b, 0].astype(np.float32)
        sums = np.zeros(threads, np.float32)
        for t in range(threads):
            for o in range(k // (threads * vec)):
                for lane in range(vec):
                    v = yy[(o * threads + t) * vec + lane]
                    sums[t] = np.float32(sums[t] + np.float32(v * v))
        warps = []
        for first in range(0, threads, 32):
            s = sums[first:first + 32].copy()
            for d in (16, 8, 4, 2, 1):
                s = np.array([np.float32(s[i] + s[i + d if i + d < 32 else i]) for i in range(32)], np.float32)
            warps.append(s[0])
        tree, half = np.array(warps, np.float32), len(warps)
        while half > 1:
            half //= 2
            for i in range(half):
                tree[i] = np.float32(tree[i] + tree[i + half])
        inv = np.float32(1) / np.sqrt(np.float32(tree[0] / np.float32(k) + np.float32(EPS)), dtype=np.float32)
        out[b, 0] = ((inv * yy).astype(np.float32) * w.astype(np.float32)).astype(np.float16)
    return y, out


@pytest.mark.parametrize("bits, count, norm_rows, k, warps, unroll, split, pipeline", [
    (4, None, 1, 1024, 2, 2, (256, 4), False), (4, 3, 4, 1024, 2, 2, (128, 4), False),
    (8, 2, 2, 512, 2, 1, (64, 4), False), (4, 2, 2, 512, 2, 2, (64, 2), False),
    (4, None, 1, 1024, 2, 1, (64, 4), True)])
def test_prologue_gives_the_norm_kernels_values(bits, count, norm_rows, k, warps, unroll, split, pipeline):
    """The serial form with `norm` (the block's threads playing the norm kernel's: 1 to 4 each) against
    the unfused arithmetic: y = x + r bit for bit, and the outputs equal bit for bit to the same kernel
    without the prologue run on the norm computed in the AddRMSNorm kernel's order (numpy, float32
    steps), for one static row and 2-3 symbolic ones, pipelined too; rows past the count left alone."""
    fmt, n = FORMATS[bits], 64
    rows = None if count is None else tirx.Var("batch_size", "int64")
    c = count or 1
    rng = np.random.default_rng(k + bits + c)
    planes = quantize(fmt, rng.normal(0, 0.05, (n, k)).astype(np.float32))
    x, r = (rng.normal(0, 1, (c, 1, k)).astype(np.float16) for _ in range(2))
    w = rng.normal(1, 0.2, (k,)).astype(np.float16)
    kw = dict(threads=False, count=rows, pipeline=pipeline)
    fused = mma_gemv(n, k, "float16", bits, warps, unroll, norm=EPS, norm_rows=norm_rows, norm_split=split, **kw)
    plain = mma_gemv(n, k, "float16", bits, warps, unroll, **kw)
    got = _run_cpu(fused, [planes["qweight"], planes["scale"], x, np.full((c, 1, n), 7, np.float16), r, w,
                           np.zeros((c, 1, k), np.float16)])
    y, normed = _gpu_norm(x, r, w, *split)
    want = _run_cpu(plain, [planes["qweight"], planes["scale"], normed, np.zeros((c, 1, n), np.float16)])[3]
    np.testing.assert_array_equal(got[6], y)
    np.testing.assert_array_equal(got[3], want)
    assert np.abs(want).max() > 0.5


def test_matcher_and_rule():
    """match_norm finds the add + norm (its epsilon, the split after it) and refuses the norm's product
    taken in another order; the MMA GEMV takes the function at 1 and 4 rows on CUDA (its add + norm's
    split of a row copied from the AddRMSNorm rule's), not at 8 (NORM_ROWS), nor the other order."""
    func = _norm_matmul(256, 512, eps=1e-6)
    found = match_norm(func)
    assert found is not None and found.eps == pytest.approx(1e-6) and found.y.same_as(func.params[5])
    assert found.x.same_as(func.params[0]) and found.w.same_as(func.params[2])
    assert found.tail.params[0].same_as(found.normed) and found.head.params[-1].same_as(found.normed)
    assert match_norm(_norm_matmul(256, 512, scale_first=True)) is None
    cuda = get_profile("cuda-sm90").tvm_target()
    assert gpu_row_split(4096, 16, 1024) == (256, 4)
    with cuda:
        assert MMAGEMV(batch=4).apply(func, cuda, False) is not None
        assert MMAGEMV(batch=8).apply(func, cuda, False) is None
        assert MMAGEMV(batch=4).apply(_norm_matmul(256, 512, scale_first=True), cuda, False) is None


def test_norm_and_matmul_apart_compute_the_function_on_the_cpu():
    """The split (head: the add + norm, tail: the matmul of the norm) joined again as two parts, the norm
    a trailing workspace parameter, built for this CPU: the fused function's outputs bit for bit."""
    n, k, rows = 64, 256, 3
    func = _norm_matmul(n, k, rows=rows)
    found = match_norm(func)
    both = joined(func, found.head, found.tail, found.normed)
    assert int(both.attrs["kiln.workspace_outputs"]) == 1
    rng = np.random.default_rng(0)
    planes = quantize(FORMATS[4], rng.normal(0, 0.05, (n, k)).astype(np.float32))
    x, r = (rng.normal(0, 1, (rows, 1, k)).astype(np.float16) for _ in range(2))
    w = rng.normal(1, 0.2, (k,)).astype(np.float16)
    ins = [x, r, w, planes["qweight"], planes["scale"]]
    outs = [np.zeros((rows, 1, k), np.float16), np.zeros((rows, 1, n), np.float16)]
    want = _run_cpu(func, [*ins, *outs])
    got = _run_cpu(both.without_attr("tirx.is_scheduled"), [*ins, *outs, np.zeros((rows, 1, k), np.float16)])
    np.testing.assert_array_equal(got[5], want[5])
    np.testing.assert_array_equal(got[6], want[6])


def test_row_dispatch_builds_for_cuda(tmp_path):
    """LowBatchGEMV on the 8B's QKV projection after its norm (4096 -> 6144): the MMA GEMV with the
    prologue at 1, 2 and 4 rows (its rows staged in shared memory), above them the norm kernel and the
    matmul's usual branches, the norm a workspace output; nvcc compiles it."""
    from kiln.targets.gpu import LowBatchGEMV
    profile = get_profile("cuda-sm90")
    func = _norm_matmul(6144, 4096).with_attr("global_symbol", "gemv")
    with profile.tvm_target():
        merged = LowBatchGEMV()(tvm.IRModule({"gemv": func}))["gemv"]
    assert [int(d) for d in merged.params[-1].shape[1:]] == [1, 4096]          # the norm, last
    source = tvm.compile(tvm.IRModule({"gemv": merged}), target=profile.tvm_target()).mod.imports[0].inspect_source()
    kernels = source.split('extern "C" __global__')
    staged = [k for k in kernels if "mma.sync.aligned.m16n8k16" in k and "stage" in k]
    assert len(staged) == 3, "the 1-, 2- and 4-row branches"
    assert any("red_buf" in k and "mma" not in k for k in kernels)              # the norm kernel above
    nvcc_compiles(source, tmp_path)


def test_graph_groups_batch_decode_alone(tiny_dirs):
    """The graph phase of a cuda-sm90 q4f16 build of the tiny Llama with norm_prologue (and
    glu_epilogue): batch_decode calls a group for each add + norm with the matmul after it (the second
    layer's QKV, both gate-ups, the LM head: 4), no fuse_add_rms_norm apart; prefill keeps its 4."""
    from kiln.compiler.build import CompileOptions, export_model
    from kiln.compiler.passes.fuse_norm_matmul import NORM_PATTERN_NAME
    from kiln.compiler.pipeline import phases
    ex = export_model(CompileOptions(model=str(tiny_dirs["tied"]), target="cuda-sm90", quant="q4f16"))
    profile = dataclasses.replace(get_profile("cuda-sm90"), norm_prologue=True, glu_epilogue=True)
    with profile.tvm_target():
        mod = tvm.transform.Sequential(phases(profile)[0][1])(ex.mod)
    relax.analysis.well_formed(mod)

    def calls(name):
        found = []
        relax.analysis.post_order_visit(mod[name].body,
                                        lambda e: found.append(e) if isinstance(e, relax.Call) else None)
        named = [getattr(c.op, "name_hint", "") for c in found] + [
            c.args[0].name_hint for c in found if getattr(c.op, "name", "") == "relax.call_tir"]
        return named
    decode = calls("batch_decode")
    groups = [c for c in decode if c.startswith("fused_add_norm_")]
    assert len(groups) == 4
    assert all((mod[c].attrs or {}).get("Composite") == NORM_PATTERN_NAME for c in set(groups))
    assert not any(c.startswith("fuse_add_rms_norm") for c in decode)
    assert sum(c.startswith("fuse_add_rms_norm") for c in calls("prefill")) == 4


def _decode_logits(art, prompts, steps=3):
    from kiln.runtime.artifact import Artifact
    from kiln.runtime.model_runner import ModelRunner
    runner = ModelRunner(Artifact.load(art), max_num_seqs=len(prompts))
    for s in range(len(prompts)):
        runner.add_sequence(s)
    logits, out = runner.prefill(list(range(len(prompts))), prompts), []
    for _ in range(steps):
        logits = runner.decode(list(range(len(prompts))), logits.argmax(-1).tolist())
        out.append(logits)
    return out


def test_a_cpu_build_with_the_rewrite_decodes_as_without(tmp_path, monkeypatch):
    """The rewrite is the model's arithmetic: a q4f16 CPU build of a 256-wide Llama with norm_prologue
    (the groups scheduled by the CPU's generic rules) decodes 1 and 3 sequences with the logits of
    the build without it, within the float16 rounding of a norm's sums taken in another order, and
    the same greedy tokens."""
    import kiln
    from kiln import targets
    from tiny_models import write_tiny_llama
    src = write_tiny_llama(tmp_path / "hf", tied=True, hidden_size=256, intermediate_size=512)
    plain = kiln.compile(str(src), target="cpu", quant="q4f16", output=tmp_path / "plain")
    make = targets._PROFILES["cpu"]
    monkeypatch.setitem(targets._PROFILES, "cpu", lambda: dataclasses.replace(make(), norm_prologue=True))
    fused = kiln.compile(str(src), target="cpu", quant="q4f16", output=tmp_path / "norm", dump_ir=tmp_path / "ir")
    assert (tmp_path / "ir" / "3-lower.py").read_text().count("fused_add_norm_") > 0
    rng = np.random.default_rng(3)
    for batch in (1, 3):
        prompts = [rng.integers(3, 512, size=int(rng.integers(2, 20))).tolist() for _ in range(batch)]
        for g, w in zip(_decode_logits(fused, prompts), _decode_logits(plain, prompts)):
            np.testing.assert_allclose(g, w, atol=1e-2, rtol=0)
            np.testing.assert_array_equal(g.argmax(-1), w.argmax(-1))


def test_a_cuda_artifact_builds_with_the_prologue_and_the_epilogue(tmp_path, monkeypatch):
    """`kiln compile` for cuda-sm90 (q4f16) of a Llama wide enough for the MMA GEMV (hidden 256, intermediate 512)
    with norm_prologue and glu_epilogue: the artifact is written; batch_decode (lowered) calls 4 groups and no norm
    apart, prefill 4 norms; batch_decode calls one kernel function for each layer's gate-up projection and activation
    and no activation kernel apart, prefill still one. (One build for both rewrites: each test built its own.)"""
    decode, prefill = cuda_artifact_ir(tmp_path, monkeypatch, norm_prologue=True, glu_epilogue=True)
    assert decode.count("fused_add_norm_") == 4 and "fuse_add_rms_norm" not in decode
    assert prefill.count("fuse_add_rms_norm") == 4
    assert decode.count("relax_split_relax_nn_silu_relax_multiply(") == 2      # 2 layers
    assert "split_silu_multiply" not in decode.replace("relax_split_relax_nn_silu_relax_multiply", "")
    assert "split" in prefill and "silu" in prefill
