"""SoftcapTVMAttention / cap_scores: the one finished-score store of each TVM attention kernel kiln keeps (CPU
and GPU forms) is soft-capped (a masked score is not), kiln's own kernels are left to their parameter, and a
kernel whose scaling moved fails loudly. The numerics are checked end to end on the CPU by
tests/numerics/test_families*.py (Gemma 2), and the GPU kernels on OpenCL by test_opencl_kernels.py."""

from __future__ import annotations

import math

import pytest
import tvm
from tvm.relax.frontend.nn.llm._decode_kernels import _attention_decode, _attention_decode_cpu
from tvm.relax.frontend.nn.llm._prefill_kernels import (_attention_prefill, _attention_prefill_cpu,
                                                        _attention_prefill_ragged, _attention_prefill_ragged_cpu)
from tvm.relax.frontend.nn.llm.tree_attn import (tree_attn, tree_attn_cpu, tree_attn_with_paged_kv_cache,
                                                 tree_attn_with_paged_kv_cache_cpu)
from tvm.script import tirx as T

from kiln.targets import SOFTCAP_ATTR
from kiln.targets.attention_softcap import KILN_KERNEL_ATTR, SoftcapTVMAttention, cap_scores

pytestmark = pytest.mark.compiler

KERNELS = {
    "decode_sliding": lambda: _attention_decode_cpu(2, 4, 16, "float32", True, {}),
    "prefill_sliding": lambda: _attention_prefill_cpu(2, 4, 16, "float32", True, {}, sliding_window_size=16),
    "ragged": lambda: _attention_prefill_ragged_cpu(2, 4, 16, 16, "float32", {}),
    "tree": lambda: tree_attn_cpu(2, 4, 16, "float32", {}),
    "tree_paged": lambda: tree_attn_with_paged_kv_cache_cpu(2, 4, 16, "float32", {}),
}

_CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "max_shared_memory_per_block": 232448,
                           "max_threads_per_block": 1024, "thread_warp_size": 32})
# TVM's GPU kernels sum scaled products (each product line multiplies by sm_scale): the cap goes on
# the finished score, the decode kernel's sum across threads or the tiled kernels' tile of scores.
GPU_KERNELS = {
    "decode": (lambda: _attention_decode(2, 4, 16, "float16", False, {}, _CUDA), "t0[0]"),
    "decode_sliding": (lambda: _attention_decode(2, 4, 16, "float16", True, {}, _CUDA), "t0[0]"),
    "prefill_sliding": (lambda: _attention_prefill(2, 4, 16, "float16", True, {}, _CUDA), "S_local[i, j]"),
    "ragged": (lambda: _attention_prefill_ragged(2, 4, 16, 16, "float16", {}, _CUDA), "S_local[i, j]"),
    "tree": (lambda: tree_attn(2, 4, 16, "float16", {}, _CUDA), "S_local[i, j]"),
    "tree_paged": (lambda: tree_attn_with_paged_kv_cache(2, 4, 16, "float16", {}, _CUDA), "S_local[i, j]"),
}


def _tanh_lines(func) -> list[str]:
    return [line for line in func.script().splitlines() if "T.tanh" in line]


@pytest.mark.parametrize("name", KERNELS)
def test_each_tvm_cpu_kernel_gets_one_cap(name):
    tanh_lines = _tanh_lines(cap_scores(KERNELS[name](), 50.0))
    assert len(tanh_lines) == 1 and repr(50.0 * math.log2(math.e))[:8] in tanh_lines[0]
    assert "-72134.75" not in tanh_lines[0]                # the masked score stays masked


@pytest.mark.parametrize("name", GPU_KERNELS)
def test_each_tvm_gpu_kernel_gets_one_cap_on_its_finished_score(name):
    make, score = GPU_KERNELS[name]
    tanh_lines = _tanh_lines(cap_scores(make(), 50.0))
    assert len(tanh_lines) == 1 and f"T.tanh({score} / " in tanh_lines[0]
    assert "sm_scale" not in tanh_lines[0]                 # not one of the products


def test_a_kernel_with_two_scaled_stores_is_an_error():
    @T.prim_func
    def two(a: T.handle, sm_scale: T.float32):
        A = T.match_buffer(a, (2,), "float32")
        A[0] = A[0] * sm_scale
        A[1] = A[1] * sm_scale

    with pytest.raises(ValueError, match="found 2 score stores"):
        cap_scores(two, 10.0)


def test_the_pass_skips_modules_without_a_cap_and_kiln_kernels():
    kernel = KERNELS["decode_sliding"]()
    mod = tvm.IRModule({"tvm_kernel": kernel, "kiln_kernel": kernel.with_attr(KILN_KERNEL_ATTR, True)})
    assert SoftcapTVMAttention()(mod).same_as(mod)
    capped = SoftcapTVMAttention()(mod.with_attr(SOFTCAP_ATTR, 30.0))
    assert "T.tanh" in capped["tvm_kernel"].script() and "T.tanh" not in capped["kiln_kernel"].script()
