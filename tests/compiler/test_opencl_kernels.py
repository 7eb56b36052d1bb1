"""The android-opencl artifact's kernels, built and run by a real OpenCL implementation on this CPU
(pocl, through pyopencl) against numpy: the 4-bit GEMV (decode), a 4-bit matmul (prefill) and
the paged decode attention kernel. The source run is the one the artifact's library carries; kiln's
own decode attention kernel (targets/decode_attention.py, what CUDA builds carry) is built alone.

pocl's CPU device has no half precision, so the model is built with q4f32 (float32 activations);
the q4f16 kernels differ only in their element type.
"""

from __future__ import annotations

import functools
import struct
import tarfile

import numpy as np
import pytest
import tvm
from tvm import te

from kiln.compiler.passes.fuse_add_rms_norm import add_rms_norm_te
from kiln.compiler.quant_modules import QuantFormat
from kiln.compiler.quant_pack import dequantize, quantize
from kiln.models.causal_lm import _argmax_chunks, _argmax_of_chunks_te, _chunk_argmax_te
from kiln.models.sampling import sample_kernel
from kiln.targets.gpu import gpu_phase_passes

from gpu_kernels import (branch_kernel, build, build_prim_func, buffers, host_launches, host_values, is_q4_matmul,
                         kernel_args, kernel_chunk, launch, reference_attention, reference_prefill, row_branches,
                         shape_values)
from sampling_cases import host_tokens, sampling_case

pytestmark = pytest.mark.compiler
cl = pytest.importorskip("pyopencl", reason="pyopencl is not installed (pip install pyopencl)")

_CL_TYPES = {"int": np.int32, "long": np.int64, "uint": np.uint32, "float": np.float32}


@pytest.fixture(scope="module")
def queue():
    try:
        devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error:
        devices = []
    if not devices:
        pytest.skip("no OpenCL platform here (apt-get install pocl-opencl-icd ocl-icd-libopencl1)")
    return cl.CommandQueue(cl.Context(devices[:1]))


@pytest.fixture(scope="module")
def built(tiny_dirs, tmp_path_factory):
    b = build(tiny_dirs["tied"], "android-opencl", "q4f32")
    lib = tmp_path_factory.mktemp("opencl") / "lib.tar"
    b.profile.export(b.executable, lib)
    b.artifact_source = _source_in_artifact(lib)
    return b


@pytest.fixture(scope="module")
def built_narrow(tiny_dirs):
    """The same preset with the row-dispatched matmuls indexed in int32, as the ROCm presets build
    them (targets/rocm.py); run here because no ROCm device is."""
    b = build(tiny_dirs["tied"], "android-opencl", "q4f32", functools.partial(gpu_phase_passes, narrow_index=True))
    b.artifact_source = b.device_source()
    return b


def _source_in_artifact(lib) -> str:
    """The OpenCL source inside lib.tar's packed device module (a length-prefixed string)."""
    with tarfile.open(lib) as tar:
        blob = tar.extractfile("devc.o").read()
    start = blob.index(b"// Function: ")
    (length,) = struct.unpack("<Q", blob[start - 8:start])
    return blob[start:start + length].decode()


def _run(queue, built, name: str, arrays: dict[str, np.ndarray], scalars: dict[str, float | int] | None = None):
    """Build PrimFunc NAME's kernel from the artifact's source on the OpenCL device (for a kernel
    that branches on its rows, the branch the host code would pick), launch it as that branch's
    thread bindings say, and return every buffer afterwards (by PrimFunc buffer name)."""
    func = built.func(name)
    values = {**shape_values(func, arrays), **(scalars or {})}
    rows = _rows(func, values)
    index, branch = next((i, f) for i, (bound, f) in enumerate(row_branches(func)) if bound is None or rows <= bound)
    blocks, threads = launch(branch, values)
    kernel_name = branch_kernel(name, index)
    values = host_values(built, name, values)
    args = [n if kind == "buffer" else values[n] for kind, n in kernel_args(built.artifact_source, kernel_name)]
    return _execute(queue, built.artifact_source, arrays, [(kernel_name, args, blocks, threads)])


def _execute(queue, source: str, arrays: dict[str, np.ndarray], launches: list) -> dict[str, np.ndarray]:
    """`arrays` on the OpenCL device, then each launch in order: (kernel in `source`, its arguments
    in order, a buffer name or a number, blocks and threads per axis x, y, z); every buffer afterwards."""
    mf = cl.mem_flags
    device = {n: cl.Buffer(queue.context, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a))
              for n, a in arrays.items()}
    for kernel, args, blocks, threads in launches:
        program = cl.Program(queue.context, kernel_chunk(source, kernel)).build()
        cl_args = [device[a] if kind == "buffer" else _CL_TYPES[kind](a)
                   for (kind, _), a in zip(kernel_args(source, kernel), args)]
        getattr(program, kernel)(queue, tuple(b * t for b, t in zip(blocks, threads)), threads, *cl_args)
    out = {n: np.empty_like(a) for n, a in arrays.items()}
    for n in arrays:
        cl.enqueue_copy(queue, out[n], device[n])
    queue.finish()
    return out


def _rows(func, values: dict[str, int]) -> int:
    """The rows of the output (all dims but the last), as the call's sizes make them."""
    rows = 1
    for dim in buffers(func)[-1].shape[:-1]:
        rows *= int(dim) if isinstance(dim, tvm.tirx.IntImm) else values[str(dim)]
    return rows


def _q4_case(func, rows: int, seed: int):
    """Random weights quantized as kiln stores them, inputs of `rows` rows (x [1, rows, K] or
    [rows, 1, K], whichever dim is symbolic), and numpy's x @ W^T with W dequantized."""
    qweight, scale, x, out = buffers(func)
    n, k = int(qweight.shape[0]), int(qweight.shape[1]) * 8
    rng = np.random.default_rng(seed)
    fmt = QuantFormat("q4", k // int(scale.shape[1]), "float32")
    planes = quantize(fmt, rng.normal(0, 0.5, (n, k)).astype(np.float32))
    lead = (rows, 1) if not isinstance(x.shape[0], tvm.tirx.IntImm) else (1, rows)
    xs = rng.normal(0, 1, (*lead, k)).astype(np.float32)
    arrays = {qweight.name: planes["qweight"], scale.name: planes["scale"], x.name: xs,
              out.name: np.zeros((*lead, n), np.float32)}
    return arrays, out.name, xs.reshape(rows, k) @ dequantize(fmt, planes).T


def test_artifact_carries_the_built_opencl_source(built):
    assert built.artifact_source == built.device_source()
    assert built.artifact_source.count("__kernel void batch_decode_paged_kv_kernel(") >= 1


@pytest.mark.parametrize("kind, rows", [("one", 1), ("seq", 1), ("seq", 3), ("seq", 13), ("seq", 40),
                                        ("batch", 1), ("batch", 2), ("batch", 3), ("batch", 13), ("narrow", 1),
                                        ("narrow", 2), ("narrow", 4), ("narrow", 40)])
def test_q4_matmul_on_opencl(queue, request, kind, rows):
    """Each 4-bit matmul kernel, and each branch of those that pick a schedule by their rows
    (GEMV for 1, 2 and 3-4 rows, tiled above: targets/gpu.py), against numpy; "narrow": the
    batch_decode matmul with int32 indices."""
    built = request.getfixturevalue("built_narrow" if kind == "narrow" else "built")
    kind = "batch" if kind == "narrow" else kind
    name = next(n for n, f in sorted(built.prim_funcs().items()) if is_q4_matmul(f, kind))
    if request.node.callspec.params["kind"] == "narrow":
        assert "int64" not in built.func(name).script().split("):", 1)[1]
    arrays, out, expected = _q4_case(built.func(name), rows, seed=len(name) + rows)
    got = _run(queue, built, name, arrays)[out]
    np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-4, atol=1e-4)


def test_batch_decode_matmuls_branch_on_rows(built):
    """batch_decode's matmuls (what every decode step runs) get the GEMV branches: without them
    the tiled matmul schedule took them at one row (issue 10)."""
    names = [n for n, f in built.prim_funcs().items() if is_q4_matmul(f, "batch")]
    assert names
    for name in names:
        bounds = [bound for bound, _ in row_branches(built.func(name))]
        assert bounds == [1, 2, 4, None], name                # no tensor cores here: no 64-row branch
        assert all(f"__kernel void {branch_kernel(name, i)}(" in built.artifact_source for i in range(4))


def test_decode_attention_on_opencl(queue, built):
    func = built.func("batch_decode_paged_kv")
    q_buf, pages_buf = buffers(func)[:2]
    h_qo, d = int(q_buf.shape[1]), int(q_buf.shape[2])
    h_kv, page_size = int(pages_buf.shape[2]), int(pages_buf.shape[3])
    rng = np.random.default_rng(0)
    indptr = np.array([0, 2, 3, 6], np.int32)                 # 3 sequences: 2, 1 and 3 pages
    values = np.array([3, 0, 5, 1, 6, 2], np.int32)
    last_len = np.array([4, 16, 1], np.int32)                 # 20, 16 and 33 tokens
    q = rng.normal(0, 1, (3, h_qo, d)).astype(np.float32)
    pages = rng.normal(0, 1, (7, 2, h_kv, page_size, d)).astype(np.float32)
    sm_scale = d ** -0.5
    zeros = np.zeros(3, np.int32)
    got = _run(queue, built, "batch_decode_paged_kv",
               {"Q": q, "pages": pages, "page_table_indptr": indptr, "page_table_values": values,
                "length_info": last_len, "k_rope_pos_offset": zeros, "q_rope_position": zeros,
                "output": np.zeros_like(q), "lse": np.zeros((3, h_qo), np.float32)},
               {"rotary_mode": 0, "rope_scale": 1.0, "rope_theta": 10000.0, "sm_scale": sm_scale})
    out, lse = reference_attention(q, pages, indptr, values, last_len, page_size, sm_scale)
    np.testing.assert_allclose(got["output"], out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["lse"], lse, rtol=1e-4, atol=1e-5)


def _run_launches(queue, built, name: str, arrays: dict[str, np.ndarray], scalars: dict[str, float | int]):
    """Every kernel PrimFunc NAME's host code launches, in order, as it launches them (its workspaces
    among `arrays`, by name); every buffer afterwards."""
    values = {**shape_values(built.func(name), arrays), **scalars}
    launches = [(kernel, args, tuple(extents.get(f"blockIdx.{a}", 1) for a in "xyz"),
                 tuple(extents.get(f"threadIdx.{a}", 1) for a in "xyz"))
                for kernel, args, extents in host_launches(built, name, values)]
    return _execute(queue, built.artifact_source, arrays, launches)


@pytest.mark.parametrize("h_kv, h_qo, d, warps, unroll, sliding, splits, softcap", [
    (2, 8, 64, 2, 2, False, 1, None),     # GQA 4, 16 lanes a row (2 tokens a warp), 8 tokens a step
    (3, 9, 32, 4, 4, False, 1, None),     # GQA 3 (SmolLM2's), 8 lanes a row
    (2, 2, 128, 8, 4, False, 1, None),    # no GQA, a row a warp, 32 tokens a step
    (2, 8, 64, 2, 2, True, 1, None),      # the sliding-window form: a sink, then the window
    (2, 8, 64, 2, 2, False, 3, None),     # each sequence split between 3 work-groups, then merged
    (3, 9, 32, 4, 4, False, 7, None),     # 7 splits: some of them empty
    (2, 8, 64, 2, 2, True, 3, None),
    (2, 8, 64, 2, 2, False, 1, 0.5),      # Gemma 2's soft-capped scores (a cap that bites)
    (2, 8, 64, 2, 2, True, 3, 0.5),
])
def test_kiln_decode_attention_on_opencl(queue, h_kv, h_qo, d, warps, unroll, sliding, splits, softcap):
    """targets/decode_attention.py, what CUDA builds decode with: sequences of 20, 16, 81 and no
    tokens (several unrolled steps, partial ones, an empty sequence's -5e4 lse as TVM writes it),
    whole or split between work-groups (the splits' states in a workspace, a second kernel merging
    them), scores soft-capped or not."""
    from kiln.targets.decode_attention import decode_attention
    name = "batch_decode_paged_kv" + ("_sliding_window" if sliding else "")
    kernels = build_prim_func(name, decode_attention(h_kv, h_qo, d, "float32", 16, sliding, warps, unroll, splits,
                                                     softcap=softcap), "android-opencl")
    assert len(host_launches(kernels, name, {"B": 4, "nnz_pages": 9, "sm_scale": 1.0})) == (1 if splits == 1 else 2)
    _check_decode(queue, kernels, name, h_kv, h_qo, d, sliding, splits, softcap)


def _check_decode(queue, kernels, name, h_kv, h_qo, d, sliding, splits, softcap):
    """Kernel `name` of `kernels` (a paged decode kernel) on sequences of 20, 16, 81 and no tokens
    (in 16-token pages) against reference_attention."""
    rng = np.random.default_rng(d + h_qo)
    indptr = np.array([0, 2, 3, 9, 9], np.int32)
    values = np.array([3, 0, 5, 1, 6, 2, 7, 8, 4], np.int32)
    last_len = np.array([4, 16, 1, 5], np.int32)
    offsets, sinks = np.array([6, 0, 40, 0], np.int32), np.array([2, 0, 4, 0], np.int32)
    q = rng.normal(0, 1, (4, h_qo, d)).astype(np.float32)
    pages = rng.normal(0, 1, (9, 2, h_kv, 16, d)).astype(np.float32)
    zeros = np.zeros(4, np.int32)
    got = _run_launches(queue, kernels, name,
                        {"Q": q, "pages": pages, "page_table_indptr": indptr, "page_table_values": values,
                         "length_info": np.stack([last_len, offsets, sinks]) if sliding else last_len,
                         "k_rope_pos_offset": zeros, "q_rope_position": zeros,
                         "output": np.full_like(q, 7.0), "lse": np.zeros((4, h_qo), np.float32),
                         "ws_o": np.full(4 * splits * h_qo * d, np.nan, np.float32),
                         "ws_md": np.full(4 * splits * h_qo * 2, np.nan, np.float32)},
                        {"rotary_mode": 0, "rope_scale": 1.0, "rope_theta": 10000.0, "sm_scale": d ** -0.5})
    out, lse = reference_attention(q, pages, indptr, values, last_len, 16, d ** -0.5,
                                   (offsets, sinks) if sliding else None, softcap)
    np.testing.assert_allclose(got["output"], out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["lse"], lse, rtol=1e-4, atol=1e-5)


PREFILL_CASES = [(2, 8, 64, True, None), (3, 9, 32, True, None), (2, 8, 64, False, None), (2, 8, 64, True, 0.5)]


@pytest.mark.parametrize("h_kv, h_qo, d, causal, softcap", PREFILL_CASES)
def test_kiln_prefill_attention_on_opencl(queue, h_kv, h_qo, d, causal, softcap):
    """targets/prefill_attention.py, what CUDA builds prefill with: three sequences of 5, 37 and
    1 new tokens, the second after 4 cached ones (more keys than queries), each token a work-group
    finding its sequence by binary search and walking only the keys it may see (scores soft-capped
    or not)."""
    from kiln.targets.prefill_attention import prefill_attention
    name = "batch_prefill_ragged_kv"
    kernels = build_prim_func(name, prefill_attention(h_kv, h_qo, d, "float32", warps=2, unroll=2, softcap=softcap),
                              "android-opencl")
    rng = np.random.default_rng(d + h_qo)
    q_indptr, kv_indptr = np.array([0, 5, 42, 43], np.int32), np.array([0, 5, 46, 47], np.int32)
    q = rng.normal(0, 1, (43, h_qo, d)).astype(np.float32)
    k, v = (rng.normal(0, 1, (47, h_kv, d)).astype(np.float32) for _ in range(2))
    got = _run_launches(queue, kernels, name,
                        {"q": q, "q_indptr": q_indptr, "k": k, "v": v, "kv_indptr": kv_indptr,
                         "q_rope_position": np.zeros(43, np.int32), "k_rope_pos_offset": np.zeros(3, np.int32),
                         "output": np.full_like(q, 7.0), "lse": np.zeros((43, h_qo), np.float32)},
                        {"causal": int(causal), "rotary_mode": 0, "rope_scale": 1.0, "rope_theta": 10000.0,
                         "sm_scale": d ** -0.5})
    out, lse = reference_prefill(q, k, v, q_indptr, kv_indptr, causal, d ** -0.5, softcap)
    np.testing.assert_allclose(got["output"], out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["lse"], lse, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("h_kv, h_qo, d, causal, softcap", PREFILL_CASES)
def test_kiln_paged_prefill_attention_on_opencl(queue, h_kv, h_qo, d, causal, softcap):
    """targets/prefill_attention.py over the cache's pages (new tokens after cached ones: chunked
    prefill, prefix hits): sequences of 20, 48 and 1 keys in 2, 3 and 1 pages (the last partly
    filled), their last 5, 3 and 1 keys the new tokens."""
    from kiln.targets.prefill_attention import prefill_attention
    name = "batch_prefill_paged_kv"
    kernels = build_prim_func(name, prefill_attention(h_kv, h_qo, d, "float32", warps=2, unroll=2, page_size=16,
                                                      softcap=softcap), "android-opencl")
    _check_paged_prefill(queue, kernels, name, h_kv, h_qo, d, causal, softcap)


def _check_paged_prefill(queue, kernels, name, h_kv, h_qo, d, causal, softcap):
    """Kernel `name` of `kernels` (a paged prefill kernel) on sequences of 20, 48 and 1 keys in 2, 3
    and 1 pages, their last 5, 3 and 1 keys the new tokens, against reference_prefill."""
    rng = np.random.default_rng(d + h_qo + 1)
    q_indptr, page_indptr = np.array([0, 5, 8, 9], np.int32), np.array([0, 2, 5, 6], np.int32)
    values, last_len = np.array([3, 0, 5, 1, 6, 2], np.int32), np.array([4, 16, 1], np.int32)
    q = rng.normal(0, 1, (9, h_qo, d)).astype(np.float32)
    pages = rng.normal(0, 1, (7, 2, h_kv, 16, d)).astype(np.float32)
    got = _run_launches(queue, kernels, name,
                        {"q": q, "q_indptr": q_indptr, "pages": pages, "page_indptr": page_indptr,
                         "page_values": values, "length_info": last_len,
                         "k_rope_pos_offset": np.zeros(3, np.int32), "q_rope_position": np.zeros(9, np.int32),
                         "output": np.full_like(q, 7.0), "lse": np.zeros((9, h_qo), np.float32)},
                        {"causal": int(causal), "rotary_mode": 0, "rope_scale": 1.0, "rope_theta": 10000.0,
                         "sm_scale": d ** -0.5})
    # the same keys and values laid out ragged: each sequence's pages in order, the last one cut
    lengths = [(e - b - 1) * 16 + n for b, e, n in zip(page_indptr[:-1], page_indptr[1:], last_len)]
    rows = [pages[values[b:e]].transpose(1, 0, 3, 2, 4).reshape(2, -1, h_kv, d)[:, :n]
            for b, e, n in zip(page_indptr[:-1], page_indptr[1:], lengths)]
    k, v = (np.concatenate([r[i] for r in rows]) for i in (0, 1))
    kv_indptr = np.cumsum([0, *lengths]).astype(np.int32)
    out, lse = reference_prefill(q, k, v, q_indptr, kv_indptr, causal, d ** -0.5, softcap)
    np.testing.assert_allclose(got["output"], out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["lse"], lse, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("h_kv, h_q, d, window, with_sinks", [
    (2, 4, 16, 0, False),       # Gemma 4's sliding layers' shape at tiny size, full attention
    (1, 4, 32, 3, False),       # a global layer's wider head and one KV head, a 3-token window
    (2, 8, 16, 0, True),        # gpt-oss's sinks
])
def test_owned_kv_attention_on_opencl(queue, h_kv, h_q, d, window, with_sinks):
    """targets/owned_kv.py's GPU form (a work-group a token, a thread a head: what CUDA, WebGPU and OpenCL
    builds run over the KV cache kiln owns, Gemma 4's and gpt-oss's) against numpy: two sequences across
    pages, query rows by position, windowed or not, with sinks or without."""
    from attention_reference import owned_attention_reference
    from kiln.targets.owned_kv import NO_SINK, owned_attention
    name, page = "owned_kv_attention", 4
    kernels = build_prim_func(name, owned_attention(h_kv, h_q, d, "float32", page, 0.25, window=window, gpu=True),
                              "android-opencl")
    rng = np.random.default_rng(d + window)
    pages_of, rows = [[3, 0], [5, 1, 2]], [(0, 4), (0, 5), (0, 6), (1, 9), (1, 0)]
    pages = rng.standard_normal((6, 2, h_kv, page, d)).astype(np.float32)
    q = rng.standard_normal((len(rows), h_q, d)).astype(np.float32)
    sinks = rng.standard_normal(h_q).astype(np.float32) if with_sinks else np.full(h_q, NO_SINK, np.float32)
    got = _run_launches(queue, kernels, name, {
        "q": q, "pages": pages, "page_indptr": np.array([0, 2, 5], np.int32),
        "page_values": np.array([3, 0, 5, 1, 2], np.int32), "seq_of": np.array([r[0] for r in rows], np.int32),
        "positions": np.array([r[1] for r in rows], np.int32), "sinks": sinks, "out": np.full_like(q, 7.0)}, {})
    want = owned_attention_reference(q, pages, pages_of, rows, sinks, window, 0.25)
    np.testing.assert_allclose(got["out"], want, rtol=1e-5, atol=1e-5)


def test_owned_kv_conv_on_opencl(queue):
    """targets/owned_kv.py's short convolution in its GPU form (LFM2's conv layers: a work-group a token, its threads
    over 320 channels, two rounds of 256) against numpy: each token's 3 taps over itself and the tokens before it,
    read from the pages its sequence holds, nothing before position 0."""
    from kiln.targets.owned_kv import owned_conv
    name, page, half, taps = "owned_kv_conv", 4, 160, 3
    kernels = build_prim_func(name, owned_conv(half, taps, "float32", page, gpu=True), "android-opencl")
    rng = np.random.default_rng(5)
    pages_of, rows = [[3, 0], [5, 1, 2]], [(0, 4), (0, 0), (0, 1), (1, 9), (1, 2)]
    pages = rng.standard_normal((6, 2, 1, page, half)).astype(np.float32)
    w = rng.standard_normal((2 * half, taps)).astype(np.float32)
    got = _run_launches(queue, kernels, name, {
        "pages": pages, "page_indptr": np.array([0, 2, 5], np.int32),
        "page_values": np.array([3, 0, 5, 1, 2], np.int32),
        "seq_of": np.array([r[0] for r in rows], np.int32), "positions": np.array([r[1] for r in rows], np.int32),
        "w": w, "out": np.full((len(rows), 2 * half), 7.0, np.float32)}, {})

    def x(b, pos):                 # a token's input: the key half, then the value half
        pg = pages_of[b][pos // page]
        return np.concatenate([pages[pg, 0, 0, pos % page], pages[pg, 1, 0, pos % page]]).astype(np.float64)
    want = np.array([sum(w[:, j] * (x(b, p - taps + 1 + j) if p - taps + 1 + j >= 0 else 0) for j in range(taps))
                     for b, p in rows])
    np.testing.assert_allclose(got["out"], want, rtol=1e-5, atol=1e-5)


def test_recurrent_kernels_on_opencl(queue):
    """targets/recurrent.py's GPU forms (Qwen3.5's DeltaNet: work-groups a sequence and 256 of its 320 conv
    channels; a work-group a sequence and value head, its threads over 160 value columns in two rounds of 128;
    Mamba-2's scan, the delta rule's kernel without its delta; Kimi Linear's KDA, a decay a key channel; Mamba-1's scan, work-groups a sequence and 128 of its
    160 channels) against numpy: one sequence starting at position 0 over a stale slot, one going on from its
    slot's state, the states they leave."""
    from kiln.targets.recurrent import gated_delta, selective_scan, state_conv
    from recurrent_reference import conv_reference, delta_reference, selective_scan_reference
    rng = np.random.default_rng(6)
    tables = {"q_indptr": np.array([0, 3, 5], np.int32), "state_slots": np.array([2, 0], np.int32),
              "positions": np.array([0, 1, 2, 7, 8], np.int32)}
    order = [tables[k] for k in ("q_indptr", "state_slots", "positions")]
    c, taps = 320, 4
    x = rng.standard_normal((5, c)).astype(np.float32)
    w = rng.standard_normal((c, taps)).astype(np.float32)
    state = rng.standard_normal((3, c, taps - 1)).astype(np.float32)
    kernels = build_prim_func("recurrent_conv", state_conv(c, taps, "float32", gpu=True), "android-opencl")
    got = _run_launches(queue, kernels, "recurrent_conv", {"x": x, "state": state.copy(), **tables, "w": w,
                                                           "out": np.full_like(x, 7.0)}, {})
    want, want_state = conv_reference(x, state, *order, w)
    np.testing.assert_allclose(got["out"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["state"][[2, 0]], want_state[[2, 0]], rtol=1e-6, atol=1e-6)
    hk, hv, dk, dv = 2, 4, 8, 160
    q, k = (rng.standard_normal((5, hk, dk)).astype(np.float32) for _ in range(2))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((5, hv, dv)).astype(np.float32)
    g, beta = -rng.uniform(0.01, 2.0, (5, hv)).astype(np.float32), rng.uniform(0, 1, (5, hv)).astype(np.float32)
    state = rng.standard_normal((3, hv, dk, dv)).astype(np.float32)
    gates = {False: g, True: -rng.uniform(0.01, 2.0, (5, hv, dk)).astype(np.float32)}    # a head's, a channel's
    # the delta rule; without its delta, Mamba-2's scan; with a decay a key channel, KDA's
    for delta, channels in ((True, False), (False, False), (True, True)):
        g = gates[channels]
        kernels = build_prim_func("recurrent_delta", gated_delta(hk, hv, dk, dv, gpu=True, delta=delta,
                                                                 channels=channels), "android-opencl")
        got = _run_launches(queue, kernels, "recurrent_delta", {"q": q, "k": k, "v": v, "g": g, "beta": beta,
                                                                "state": state.copy(), **tables,
                                                                "out": np.full_like(v, 7.0)}, {})
        want, want_state = delta_reference(q, k, v, g, beta, state, *order, delta=delta)
        np.testing.assert_allclose(got["out"], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["state"][[2, 0]], want_state[[2, 0]], rtol=1e-5, atol=1e-5)
    c, n_state = 160, 16                        # Mamba-1's scan: a thread a channel
    x, dt = rng.standard_normal((5, c)).astype(np.float32), rng.uniform(0.01, 1.0, (5, c)).astype(np.float32)
    A = -rng.uniform(0.1, 3.0, (c, n_state)).astype(np.float32)
    B, C = (rng.standard_normal((5, n_state)).astype(np.float32) for _ in range(2))
    state = rng.standard_normal((3, c, n_state)).astype(np.float32)
    kernels = build_prim_func("recurrent_selective_scan", selective_scan(c, n_state, gpu=True), "android-opencl")
    got = _run_launches(queue, kernels, "recurrent_selective_scan", {"x": x, "dt": dt, "A": A, "B": B, "C": C,
                                                                     "state": state.copy(), **tables,
                                                                     "out": np.full_like(x, 7.0)}, {})
    want, want_state = selective_scan_reference(x, dt, A, B, C, state, *order)
    np.testing.assert_allclose(got["out"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["state"][[2, 0]], want_state[[2, 0]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", ["decode", "paged prefill"])
def test_tvm_gpu_attention_soft_capped_on_opencl(queue, kernel):
    """TVM's GPU attention kernels that kiln keeps (every one off CUDA; the sliding-window prefill and
    the tree kernels there) with SoftcapTVMAttention's cap in their one score store (the decode
    kernel's score summed across threads, the tiled kernels' tile of scores): Gemma 2 on GPUs."""
    from tvm.relax.frontend.nn.llm._decode_kernels import _attention_decode
    from tvm.relax.frontend.nn.llm._prefill_kernels import _attention_prefill

    from kiln.targets import get_profile
    from kiln.targets.attention_softcap import cap_scores
    h_kv, h_qo, d, softcap = 2, 8, 64, 0.5
    with get_profile("android-opencl").tvm_target():
        target = tvm.target.Target.current()
        if kernel == "decode":
            name, func = "batch_decode_paged_kv", _attention_decode(h_kv, h_qo, d, "float32", False, {}, target)
        else:
            name, func = "batch_prefill_paged_kv", _attention_prefill(h_kv, h_qo, d, "float32", False, {}, target)
    kernels = build_prim_func(name, cap_scores(func, softcap), "android-opencl")
    if kernel == "decode":
        _check_decode(queue, kernels, name, h_kv, h_qo, d, False, 1, softcap)
    else:
        _check_paged_prefill(queue, kernels, name, h_kv, h_qo, d, True, softcap)


@pytest.fixture(scope="module")
def wide_add_norm():
    """The fused add + RMSNorm over 600-wide rows (more than one pass of the work-group, the last
    one partial): SmolLM2's 576 and an 8B model's 4096 are not multiples of the thread count either."""
    n = te.var("rows", "int64")
    x, r = (te.placeholder((n, 600), "float32", name=s) for s in ("x", "r"))
    w = te.placeholder((600,), "float32", name="w")
    func = te.create_prim_func([x, r, w, *add_rms_norm_te(x, r, w, 1e-6)])
    return build_prim_func("add_norm", func, "android-opencl"), 1e-6


@pytest.mark.parametrize("case, rows", [("tiny", 1), ("tiny", 7), ("wide", 1), ("wide", 3)])
def test_add_rms_norm_on_opencl(queue, built, wide_add_norm, case, rows):
    """The fused residual add + RMSNorm (one work-group per row, a cross-thread sum of squares)."""
    if case == "tiny":
        kernels, eps = built, 1e-5                              # the tiny Llama's rms_norm_eps
        name = sorted(n for n in built.prim_funcs() if n.startswith("fuse_add_rms_norm"))[0]
    else:
        (kernels, eps), name = wide_add_norm, "add_norm"
    x, r, w, y, n = buffers(kernels.func(name))
    rng = np.random.default_rng(rows)
    shape = tuple(rows if not isinstance(d, tvm.tirx.IntImm) else int(d) for d in x.shape)
    xs, rs = rng.normal(0, 1, shape).astype(np.float32), rng.normal(0, 1, shape).astype(np.float32)
    ws = rng.normal(1, 0.1, int(w.shape[0])).astype(np.float32)
    got = _run(queue, kernels, name, {x.name: xs, r.name: rs, w.name: ws,
                                      y.name: np.zeros(shape, np.float32), n.name: np.zeros(shape, np.float32)})
    total = xs + rs
    np.testing.assert_allclose(got[y.name], total, rtol=1e-6)
    norm = total / np.sqrt((total.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps) * ws
    np.testing.assert_allclose(got[n.name], norm, rtol=1e-4, atol=1e-5)


def test_greedy_tokens_on_opencl(queue, built):
    """greedy_tokens' argmax (a decode step copies back one token per sequence): numpy's argmax,
    the first of equal maxima included."""
    name = next(n for n in built.prim_funcs() if "argmax" in n)
    logits, out = buffers(built.func(name))
    vocab = int(logits.shape[-1])
    x = np.random.default_rng(3).normal(0, 4, (5, 1, vocab)).astype(np.float32)
    x[1, 0, [7, vocab - 1]] = x[1].max() + 1                  # a tie: the first index wins
    x[2, 0, :] = -1e30
    x[2, 0, 300:] = 2.5                                         # a tie over a whole tail
    x[3, 0, :] = -np.inf                                        # nothing allowed: numpy says 0
    got = _run(queue, built, name, {logits.name: x, out.name: np.full(5, -7, np.int32)})[out.name]
    np.testing.assert_array_equal(got, np.argmax(x[:, 0], axis=1))
    assert got[1] == 7 and got[2] == 300 and got[3] == 0


def test_greedy_tokens_in_chunks_on_opencl(queue):
    """A large vocabulary's argmax in two kernels (each chunk's winner, then the row's): numpy's argmax,
    with ties inside a chunk, across chunks and over a whole tail, and an all -inf row."""
    vocab = 8192
    chunks = _argmax_chunks(vocab)
    assert chunks == 8 and _argmax_chunks(128256) == 64 and _argmax_chunks(512) == 1 and _argmax_chunks(50257) == 29
    x_te = te.placeholder((tvm.tirx.Var("batch_size", "int64"), tvm.tirx.IntImm("int64", 1),
                           tvm.tirx.IntImm("int64", vocab)), "float32", name="logits")
    winners_te = _chunk_argmax_te(x_te, chunks)
    first = build_prim_func("argmax_chunks", te.create_prim_func([x_te, winners_te]), "android-opencl")
    w_te = te.placeholder(winners_te.shape, "float32", name="winners")
    second = build_prim_func("argmax_rows", te.create_prim_func([w_te, _argmax_of_chunks_te(w_te)]), "android-opencl")
    x = np.random.default_rng(4).normal(0, 4, (6, 1, vocab)).astype(np.float32)
    x[1, 0, [7, 9, 5000]] = x[1].max() + 1                    # ties in the first chunk and a later one
    x[2, 0, :] = -1e30
    x[2, 0, 3000:] = 2.5                                        # a tie from inside the third chunk to the end
    x[3, 0, :] = -np.inf                                        # nothing allowed: numpy says 0
    x[4, 0, vocab - 1] = 1e9                                    # the very last logit
    logits, winners = buffers(first.func("argmax_chunks"))
    w = _run(queue, first, "argmax_chunks", {logits.name: x, winners.name: np.zeros((6, chunks, 2), np.float32)})
    w_in, out = buffers(second.func("argmax_rows"))
    got = _run(queue, second, "argmax_rows", {w_in.name: w[winners.name], out.name: np.full(6, -7, np.int32)})[out.name]
    np.testing.assert_array_equal(got, np.argmax(x[:, 0], axis=1))
    assert got[1] == 7 and got[2] == 3000 and got[3] == 0 and got[4] == vocab - 1


@pytest.fixture(scope="module")
def wide_sampler():
    """sample_tokens for SmolLM2's 49152-token vocabulary (192 tokens per lane)."""
    return build_prim_func("sample_tokens", sample_kernel(49152, gpu=True), "android-opencl")


@pytest.fixture(scope="module")
def wider_sampler():
    """The same with CUDA's 1,024 lanes a row (48 tokens per lane; pocl takes 4,096-thread work-groups)."""
    return build_prim_func("sample_tokens", sample_kernel(49152, gpu=True, lanes=1024), "android-opencl")


@pytest.mark.parametrize("case", ["tiny", "wide", "1024 lanes"])
def test_sample_tokens_on_opencl(queue, built, wide_sampler, wider_sampler, case):
    """sample_tokens' GPU kernel (a work-group per row: bisected top-k/top-p thresholds, then the
    inverse CDF in vocabulary order) draws the host Sampler's token in every row, given its uniform."""
    kernels = {"tiny": built, "wide": wide_sampler, "1024 lanes": wider_sampler}[case]
    name = next(n for n in kernels.prim_funcs() if n.startswith("sample_tokens"))
    logits, params, out = buffers(kernels.func(name))
    x, p = sampling_case(40, int(logits.shape[-1]), seed=len(case))
    got = _run(queue, kernels, name, {logits.name: x, params.name: p, out.name: np.full(40, -7, np.int32)})[out.name]
    np.testing.assert_array_equal(got, host_tokens(x, p))
