"""targets/kernel_memo.py: a hand-written kernel is parsed once a process, and a kernel over a symbolic
size comes back over the caller's own variable, structurally the kernel a fresh parse gives."""

from __future__ import annotations

import pytest
import tvm
from tvm import tirx
from tvm_ffi import structural_equal

from kiln.targets import kernel_memo
from kiln.targets.cpu.argmax import chunk_argmax
from kiln.targets.cpu.attention import attention_paged_cpu, split_rotary_cpu
from kiln.targets.cpu.quant_gemv import gemv_kernel
from kiln.targets.kernel_memo import parsed_once
from kiln.targets.mma_gemv import mma_gemv
from kiln.targets.q4_gemv import q4_gemv

pytestmark = pytest.mark.compiler


def _sizes(kernel: tirx.PrimFunc) -> list:
    return [d for p in kernel.params for d in (getattr(p, "shape", None) or []) if isinstance(d, tirx.Var)]


@pytest.mark.parametrize("build, args, size", [
    (gemv_kernel, ("q4m", 256, 128, 32, 4), "rows"),
    (gemv_kernel, ("q8", 64, 256, 32, 8), "rows"),
    (chunk_argmax, (), "rows"),
    (mma_gemv, (256, 512, "float16", 4, 4, 2), "count"),
    (q4_gemv, (256, 512, "float16", 2, 4, True, 8), "count"),
])
def test_a_symbolic_size_comes_back_over_the_callers_variable(build, args, size):
    kwargs = {"vocab": 4096, "chunks": 8} if build is chunk_argmax else {}
    first, second = tirx.Var("n", "int64"), tirx.Var("batch_size", "int64")
    a = build(*args, **kwargs, **{size: first})
    parsed = len(build.kernels)
    b = build(*args, **kwargs, **{size: second})
    assert len(build.kernels) == parsed                            # the second call parsed nothing:
    stand_in = kernel_memo._stand_in("int64")                      # it rebound the kept kernel
    assert any(kernel_memo._rebind(k, stand_in, second) is not None for k in build.kernels.values())
    assert any(d.same_as(first) for d in _sizes(a)) and any(d.same_as(second) for d in _sizes(b))
    assert not any(d.same_as(first) for d in _sizes(b))
    fresh = build.__wrapped__(*args, **kwargs, **{size: second})   # the builder itself, parsed over `second`
    assert structural_equal(b, fresh)
    assert tvm.ir.save_json(b) == tvm.ir.save_json(fresh)          # what compiler/lib_cache.py's keys read


def test_the_same_arguments_give_the_same_kernel_and_others_another():
    a = attention_paged_cpu(2, 4, 16, "float32", 16, decode=True)
    assert attention_paged_cpu(2, 4, 16, "float32", 16, decode=True) is a
    assert attention_paged_cpu(2, 4, 16, "float32", 16, True) is a                 # positional or keyword
    assert attention_paged_cpu(2, 4, 16, "float32", 16, decode=False) is not a
    rope = split_rotary_cpu(1e4, 1.0, 16, 4, 2, "float32")
    assert split_rotary_cpu(1e4, 1.0, 16, 4, 2, "float32") is rope
    assert not structural_equal(split_rotary_cpu(5e5, 1.0, 16, 4, 2, "float32"), rope)
    one_row = gemv_kernel("q4", 64, 128, 32)                       # no symbolic size: one kernel
    assert gemv_kernel("q4", 64, 128, 32, 1, None) is one_row


def test_a_size_no_buffer_param_has_is_parsed_over_the_callers_variable():
    calls = []

    @parsed_once(size="rows")
    def build(rows):
        calls.append(rows)
        return tirx.PrimFunc([], tirx.Evaluate(rows))

    rows = tirx.Var("rows", "int32")
    kernel = build(rows)
    assert calls[-1].same_as(rows) and kernel.body.value.same_as(rows)


def test_a_knob_set_for_a_build_gives_its_own_kernel(monkeypatch):
    from kiln.targets import decode_attention
    shipped = decode_attention.decode_attention(8, 32, 128, "float16", 16)
    monkeypatch.setattr(decode_attention, "MIN_SPLIT", decode_attention.MIN_SPLIT * 2)   # tools/gpu_builds.py's knob
    patched = decode_attention.decode_attention(8, 32, 128, "float16", 16)
    fresh = decode_attention.decode_attention.__wrapped__(8, 32, 128, "float16", 16)
    assert tvm.ir.save_json(patched) == tvm.ir.save_json(fresh) != tvm.ir.save_json(shipped)
    monkeypatch.undo()
    assert decode_attention.decode_attention(8, 32, 128, "float16", 16) is shipped
