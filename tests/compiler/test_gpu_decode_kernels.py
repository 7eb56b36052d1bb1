"""What a GPU decode step runs (issue 10): batch_decode, the function the runtime calls every
step at any batch size, read from a q4f16 CUDA build's scheduled IR."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.compiler


def _called(funcs: dict[str, str], relax_func: str) -> list[str]:
    return re.findall(r"R\.call_tir\(cls\.(\w+)", funcs[relax_func])


def test_batch_decode_matmuls_branch_to_gemv_at_few_rows(dumped_ir):
    funcs = dumped_ir("cuda", "schedule")
    matmuls = sorted({f for f in _called(funcs, "batch_decode") if "_NT_matmul" in f})
    assert len(matmuls) >= 5                     # qkv, o, gate-up, down, lm head
    for name in matmuls:
        assert "T.tvm_thread_invariant(batch_size <= T.int64(2))" in funcs[name], name
        assert "T.tvm_thread_invariant(batch_size <= T.int64(8))" in funcs[name], name


def test_batch_decode_has_no_cast_kernels(dumped_ir):
    """AccumulateInFloat32 sums the matmuls in float32 and casts to float16: the cast is the
    quantized matmul's epilogue, not a kernel reading the float32 sums back."""
    called = _called(dumped_ir("cuda", "schedule"), "batch_decode")
    assert not [f for f in called if re.search(r"(^|_)cast\d*(_|$)", f)], called
    assert sum(f.endswith("_relax_astype") for f in called) >= 4
