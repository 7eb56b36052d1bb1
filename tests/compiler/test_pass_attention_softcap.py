"""SoftcapTVMAttention / cap_scores: the one scaled-score store of each TVM CPU attention kernel kiln keeps is
soft-capped (a masked score is not), kiln's own kernels are left to their parameter, and a kernel whose
scaling moved fails loudly. The numerics are checked end to end by tests/numerics/test_families*.py (Gemma 2)."""

from __future__ import annotations

import math

import pytest
import tvm
from tvm.relax.frontend.nn.llm._decode_kernels import _attention_decode_cpu
from tvm.relax.frontend.nn.llm._prefill_kernels import _attention_prefill_cpu, _attention_prefill_ragged_cpu
from tvm.relax.frontend.nn.llm.tree_attn import tree_attn_cpu, tree_attn_with_paged_kv_cache_cpu
from tvm.script import tirx as T

from kiln.targets import SOFTCAP_ATTR
from kiln.targets.cpu.attention_softcap import KILN_KERNEL_ATTR, SoftcapTVMAttention, cap_scores

pytestmark = pytest.mark.compiler

KERNELS = {
    "decode_sliding": lambda: _attention_decode_cpu(2, 4, 16, "float32", True, {}),
    "prefill_sliding": lambda: _attention_prefill_cpu(2, 4, 16, "float32", True, {}, sliding_window_size=16),
    "ragged": lambda: _attention_prefill_ragged_cpu(2, 4, 16, 16, "float32", {}),
    "tree": lambda: tree_attn_cpu(2, 4, 16, "float32", {}),
    "tree_paged": lambda: tree_attn_with_paged_kv_cache_cpu(2, 4, 16, "float32", {}),
}


@pytest.mark.parametrize("name", KERNELS)
def test_each_tvm_cpu_kernel_gets_one_cap(name):
    capped = cap_scores(KERNELS[name](), 50.0).script()
    tanh_lines = [line for line in capped.splitlines() if "T.tanh" in line]
    assert len(tanh_lines) == 1 and repr(50.0 * math.log2(math.e))[:8] in tanh_lines[0]
    assert "-72134.75" not in tanh_lines[0]                # the masked score stays masked


def test_a_kernel_with_two_scaled_stores_is_an_error():
    @T.prim_func
    def two(a: T.handle, sm_scale: T.float32):
        A = T.match_buffer(a, (2,), "float32")
        A[0] = A[0] * sm_scale
        A[1] = A[1] * sm_scale

    with pytest.raises(ValueError, match="found 2 scaled-score stores"):
        cap_scores(two, 10.0)


def test_the_pass_skips_modules_without_a_cap_and_kiln_kernels():
    kernel = KERNELS["decode_sliding"]()
    mod = tvm.IRModule({"tvm_kernel": kernel, "kiln_kernel": kernel.with_attr(KILN_KERNEL_ATTR, True)})
    assert SoftcapTVMAttention()(mod).same_as(mod)
    capped = SoftcapTVMAttention()(mod.with_attr(SOFTCAP_ATTR, 30.0))
    assert "T.tanh" in capped["tvm_kernel"].script() and "T.tanh" not in capped["kiln_kernel"].script()
