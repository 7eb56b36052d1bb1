"""The android-opencl artifact's kernels, built and run by a real OpenCL implementation on this CPU
(pocl, through pyopencl) against numpy: the 4-bit GEMV (decode), a 4-bit matmul (prefill) and
the paged decode attention kernel. The source run is the one the artifact's library carries.

pocl's CPU device has no half precision, so the model is built with q4f32 (float32 activations);
the q4f16 kernels differ only in their element type.
"""

from __future__ import annotations

import struct
import tarfile

import numpy as np
import pytest

from kiln.compiler.quant_modules import QuantFormat
from kiln.compiler.quant_pack import dequantize, quantize

from gpu_kernels import (build, buffers, is_q4_matmul, kernel_args, kernel_chunk, launch, reference_attention,
                         shape_values)

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


def _source_in_artifact(lib) -> str:
    """The OpenCL source inside lib.tar's packed device module (a length-prefixed string)."""
    with tarfile.open(lib) as tar:
        blob = tar.extractfile("devc.o").read()
    start = blob.index(b"// Function: ")
    (length,) = struct.unpack("<Q", blob[start - 8:start])
    return blob[start:start + length].decode()


def _run(queue, built, name: str, arrays: dict[str, np.ndarray], scalars: dict[str, float | int] | None = None):
    """Build kernel NAME_kernel from the artifact's source on the OpenCL device, launch it as the
    PrimFunc's thread bindings say, and return every buffer afterwards (by PrimFunc buffer name)."""
    func = built.func(name)
    values = {**shape_values(func, arrays), **(scalars or {})}
    blocks, threads = launch(func, values)
    kernel_name = f"{name}_kernel"
    program = cl.Program(queue.context, kernel_chunk(built.artifact_source, kernel_name)).build()
    mf = cl.mem_flags
    device = {n: cl.Buffer(queue.context, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a))
              for n, a in arrays.items()}
    args = [device[n] if kind == "buffer" else _CL_TYPES[kind](values[n])
            for kind, n in kernel_args(built.artifact_source, kernel_name)]
    global_size = tuple(b * t for b, t in zip(blocks, threads))
    getattr(program, kernel_name)(queue, global_size, threads, *args)
    out = {n: np.empty_like(a) for n, a in arrays.items()}
    for n in arrays:
        cl.enqueue_copy(queue, out[n], device[n])
    queue.finish()
    return out


def _q4_case(func, rows: int, seed: int):
    """Random weights quantized as kiln stores them, inputs, and numpy's x @ W^T with W dequantized."""
    qweight, scale, x, out = buffers(func)
    n, k = int(qweight.shape[0]), int(qweight.shape[1]) * 8
    rng = np.random.default_rng(seed)
    fmt = QuantFormat("q4", k // int(scale.shape[1]), "float32")
    planes = quantize(fmt, rng.normal(0, 0.5, (n, k)).astype(np.float32))
    xs = rng.normal(0, 1, (1, rows, k)).astype(np.float32)
    arrays = {qweight.name: planes["qweight"], scale.name: planes["scale"], x.name: xs,
              out.name: np.zeros((1, rows, n), np.float32)}
    return arrays, out.name, xs[0] @ dequantize(fmt, planes).T


def test_artifact_carries_the_built_opencl_source(built):
    assert built.artifact_source == built.device_source()
    assert built.artifact_source.count("__kernel void batch_decode_paged_kv_kernel(") >= 1


@pytest.mark.parametrize("rows", ["one", "seq"], ids=["gemv", "matmul"])
def test_q4_matmul_on_opencl(queue, built, rows):
    name = next(n for n, f in sorted(built.prim_funcs().items()) if is_q4_matmul(f, rows))
    arrays, out, expected = _q4_case(built.func(name), 1 if rows == "one" else 13, seed=len(name))
    got = _run(queue, built, name, arrays)[out][0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


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
