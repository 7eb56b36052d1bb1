"""targets/kernel_memo.py: a hand-written kernel is parsed once a process, and a kernel over a symbolic
size comes back over the caller's own variable, structurally the kernel a fresh parse gives; a parsed
kernel is kept in the library cache for the next process (a damaged one is parsed again); TVM's
KV-cache kernels go through the same memo."""

from __future__ import annotations

import functools

import pytest
import tvm
from tvm import tirx
from tvm_ffi import structural_equal

from kiln.compiler import lib_cache
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


def test_a_parsed_kernel_is_kept_for_the_next_process_and_a_damaged_one_parsed_again(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_LIB_CACHE", str(tmp_path))
    parses = []

    @functools.wraps(gemv_kernel.__wrapped__)
    def counted(*args, **kwargs):
        parses.append(args)
        return gemv_kernel.__wrapped__(*args, **kwargs)

    def in_a_new_process(rows):                                    # an empty memo, the same cache folder
        return parsed_once(size="rows")(counted)("q4", 64, 128, 32, 4, rows)

    first, second = tirx.Var("n", "int64"), tirx.Var("batch_size", "int64")
    in_a_new_process(first)
    (kept,) = lib_cache.parsed_kernels()
    loaded = in_a_new_process(second)
    assert len(parses) == 1                                        # the second process parsed nothing
    fresh = gemv_kernel.__wrapped__("q4", 64, 128, 32, 4, second)
    assert any(d.same_as(second) for d in _sizes(loaded))
    assert tvm.ir.save_json(loaded) == tvm.ir.save_json(fresh)     # what compiler/lib_cache.py's keys read
    kept.path.write_bytes(kept.path.read_bytes().replace(b'"float32"', b'"float16"', 1))
    again = in_a_new_process(second)
    assert len(parses) == 2 and tvm.ir.save_json(again) == tvm.ir.save_json(fresh)
    assert [k.path for k in lib_cache.parsed_kernels()] == [kept.path]     # replaced, whole
    assert tvm.ir.save_json(tvm.ir.load_json(kept.path.read_text())) == tvm.ir.save_json(
        gemv_kernel.__wrapped__("q4", 64, 128, 32, 4, kernel_memo._stand_in("int64")))
    monkeypatch.setenv("KILN_LIB_CACHE", "0")                      # no cache: the process's memo only
    in_a_new_process(second)
    assert len(parses) == 3


def test_tvm_kv_cache_kernels_are_parsed_once():
    from tvm.relax.frontend.nn.llm import kv_cache
    kernel_memo.memoize_kv_cache_kernels()
    kernel_memo.memoize_kv_cache_kernels()                         # once: a memo is not wrapped again
    decode = kv_cache._attention_decode_cpu
    assert decode.__wrapped__.__module__.startswith("tvm.") and not hasattr(decode.__wrapped__, "kernels")
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    args = (2, 4, 16, "float32", False, llama3)
    a = decode(*args)
    assert decode(*args[:-1], dict(reversed(llama3.items()))) is a      # an equal dict is the same key
    assert decode(*args[:-1], {**llama3, "factor": 4.0}) is not a
    assert tvm.ir.save_json(a) == tvm.ir.save_json(decode.__wrapped__(*args))
    def sm90():
        return tvm.target.Target({"kind": "cuda", "arch": "sm_90"})

    merge = kv_cache._merge_state_inplace(4, 16, "float16", sm90())
    assert kv_cache._merge_state_inplace(4, 16, "float16", sm90()) is merge           # an equal target


def test_a_builder_given_a_tir_expression_builds_as_is():
    calls = []

    @parsed_once()
    def build(extent):
        calls.append(extent)
        return tirx.PrimFunc([], tirx.Evaluate(extent))

    page = tirx.Var("page_size", "int64")
    assert build(page).body.value.same_as(page) and build(page) is not build(page)
    assert len(calls) == 3 and build(16) is build(16) and len(calls) == 4


@pytest.mark.parametrize("name, args", [("_copy_single_page_cpu", (2, None, 16, "float32")),
                                        ("_copy_single_page", (4, None, 64, "float16", "cuda")),
                                        ("_copy_single_page_mla", (None, 64, "float16", "cuda"))])
def test_tvm_page_copies_come_back_over_the_callers_page_size(name, args):
    """TVM's page copies take the cache's symbolic page size: parsed once over the stand-in, each caller's
    copy is over its own variable, the kernel a fresh parse over it gives."""
    from tvm.relax.frontend.nn.llm import kv_cache
    kernel_memo.memoize_kv_cache_kernels()
    build = getattr(kv_cache, name)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    first, second = tirx.Var("page_size", "int64"), tirx.Var("page_size", "int64")

    def call(fn, page):
        return fn(*(page if a is None else target if a == "cuda" else a for a in args))

    a = call(build, first)
    parsed = len(build.kernels)
    b = call(build, second)
    assert len(build.kernels) == parsed and parsed >= 1                   # the second call parsed nothing
    assert any(d.same_as(first) for d in _sizes(a)) and any(d.same_as(second) for d in _sizes(b))
    assert tvm.ir.save_json(b) == tvm.ir.save_json(call(build.__wrapped__, second))


def test_kept_kernels_read_back_without_tvms_upgrade_as_with_it(tmp_path, monkeypatch):
    """lib_cache.load_kept skips json_compact's upgrade (nothing to upgrade in this TVM's own JSON): what it
    reads is what tvm.ir.load_json reads."""
    monkeypatch.setenv("KILN_LIB_CACHE", str(tmp_path))
    parsed_once(size="rows")(gemv_kernel.__wrapped__)("q4m", 64, 128, 32, 4, tirx.Var("n", "int64"))
    (kept,) = lib_cache.parsed_kernels()
    text = kept.path.read_text()
    assert tvm.ir.save_json(lib_cache.load_kept(text)) == tvm.ir.save_json(tvm.ir.load_json(text)) == text
