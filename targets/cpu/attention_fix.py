"""FixTVMSlidingPrefill: two bugs in TVM 0.27's CPU sliding-window prefill kernel, repaired in place.

``batch_prefill_paged_kv_cpu_sliding_window`` (kept where UseKilnCPUAttention does not replace it:
RoPE inside attention, a head dim kiln's kernels do not take, a window size not a constant) has an online
softmax whose running maximum ``new_m`` is updated only for unmasked keys and never initialised,
so a query whose first keys fall out of the window starts from whatever the buffer held; and it
rescales the output with ``scale_O[d_idx]`` although ``scale_O`` holds one value, reading past the
buffer. On one host the garbage happened to be harmless; on another the rows past the window came
out NaN. The repair: ``new_m`` starts each query at ``m_val``'s initial value, and the output is
scaled by ``scale_O[0]``. A kernel where either line is not found exactly once fails the compile
(a TVM upgrade that changed the kernel must be looked at, not silently passed through).
"""

from __future__ import annotations

import re

import tvm
import tvm.script
from tvm import tirx

from ..attention_softcap import KILN_KERNEL_ATTR

KERNEL = "batch_prefill_paged_kv_cpu_sliding_window"
_M_INIT = re.compile(r"^(?P<indent>\s*)m_val\[0\] = (?P<value>T\.float32\(-?[0-9.e+]+\))$")
_SCALE = re.compile(r"scale_O\[d_idx\]")


def repair(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """The kernel with new_m initialised per query and scale_O read at its one element."""
    lines, inits, scales = func.script().splitlines(), 0, 0
    out = []
    for line in lines:
        m = _M_INIT.match(line)
        if m:
            out += [line, f"{m['indent']}new_m[0] = {m['value']}"]
            inits += 1
            continue
        line, k = _SCALE.subn("scale_O[0]", line)
        scales += k
        out.append(line)
    if (inits, scales) != (1, 1):
        raise ValueError(f"cannot repair TVM's {KERNEL}: found {inits} running-max initialisations and {scales} "
                         "scale_O[d_idx] reads (expected 1 and 1); TVM's kernel changed")
    return tvm.script.from_source("\n".join(out))


@tvm.transform.module_pass(opt_level=0, name="FixTVMSlidingPrefill")
class FixTVMSlidingPrefill:
    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        hits = [gv for gv, f in mod.functions.items()
                if isinstance(f, tirx.PrimFunc) and f.attrs and f.attrs.get("global_symbol") == KERNEL
                and not f.attrs.get(KILN_KERNEL_ATTR)]      # kiln's own kernel under TVM's symbol
        if not hits:
            return mod
        mod = mod.clone()
        for gv in hits:
            mod[gv] = repair(mod[gv])
        return mod
