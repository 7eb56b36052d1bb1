"""FixTVMSlidingPrefill repairs TVM's CPU sliding-window prefill kernel (uninitialised running max,
out-of-bounds scale read) and refuses a kernel it does not recognise. The NaN it caused is covered
end to end by tests/numerics/test_sliding_window.py (Qwen2's rows past the window)."""

from __future__ import annotations

import pytest
import tvm
from tvm.relax.frontend.nn.llm._prefill_kernels import _attention_prefill_cpu

from kiln.targets.cpu.attention_fix import KERNEL, FixTVMSlidingPrefill, repair


def _kernel():
    return _attention_prefill_cpu(2, 4, 16, "float32", True, {}, sliding_window_size=16)


def test_repair_initialises_the_running_max_and_reads_scale_in_bounds():
    before, after = _kernel().script(), repair(_kernel()).script()
    assert "scale_O[d_idx]" in before and "scale_O[d_idx]" not in after
    lines = after.splitlines()
    i = next(n for n, line in enumerate(lines) if line.strip() == "m_val[0] = T.float32(-50000.0)")
    assert lines[i + 1].strip() == "new_m[0] = T.float32(-50000.0)"
    assert before.count("new_m[0] =") + 1 == after.count("new_m[0] =")


def test_pass_touches_only_that_kernel():
    other = _attention_prefill_cpu(2, 4, 16, "float32", False, {})
    mod = tvm.IRModule({KERNEL: _kernel(), "plain": other})
    out = FixTVMSlidingPrefill()(mod)
    assert "scale_O[d_idx]" not in out[KERNEL].script()
    assert out["plain"].script() == other.script()


def test_an_unrecognised_kernel_fails_the_compile():
    changed = tvm.script.from_source(repair(_kernel()).script())     # already repaired: nothing to find
    with pytest.raises(ValueError, match="TVM's kernel changed"):
        repair(changed)


def test_kilns_kernel_under_that_symbol_is_left_alone():
    """UseKilnCPUAttention replaces the kernel where it can, keeping TVM's symbol: nothing to repair."""
    from kiln.targets.attention_softcap import KILN_KERNEL_ATTR
    from kiln.targets.cpu.attention import attention_paged_cpu
    kiln_kernel = attention_paged_cpu(2, 4, 16, "float32", 16, decode=False, sliding=True, window=16) \
        .with_attr("global_symbol", KERNEL).with_attr(KILN_KERNEL_ATTR, True)
    out = FixTVMSlidingPrefill()(tvm.IRModule({KERNEL: kiln_kernel}))
    assert out[KERNEL].same_as(kiln_kernel)
