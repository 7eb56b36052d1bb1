"""UseKilnAttention: the KV cache's attention kernels swapped for kiln's, by name, symbols kept.

TVM's KV cache (relax/frontend/nn/llm/kv_cache.py) builds its attention kernels into the module
under fixed names and calls them from the runtime by those names. Where the cache applies RoPE
before attention (so a kernel may ignore rotary_mode), this pass replaces:
- `batch_decode_paged_kv` and `_sliding_window` with targets/decode_attention.py's kernel (on the
  H100 half of TVM's time at 1-64 sequences, 1/23 after a 4,000-token prompt);
- `batch_prefill_ragged_kv` (a prefill's new tokens over themselves) and `batch_prefill_paged_kv`
  (new tokens over a sequence's cached pages) with targets/prefill_attention.py's (TVM's ragged
  kernel took 0.71 ms a layer of the 8B's 16 x 128-token prefill).
The sliding-window prefill stays TVM's. Nothing changes where the cache applies RoPE inside
attention, or where there is no cache. A model that soft-caps its attention scores (Gemma 2: the
module's SOFTCAP_ATTR) gets kernels built with that cap; SoftcapTVMAttention caps TVM's kernels
that stay.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .cpu.attention_pass import rope_before_attention
from .attention_softcap import KILN_KERNEL_ATTR, module_softcap
from .decode_attention import replacement as decode_replacement
from .prefill_attention import prefill_replacement


@tvm.transform.module_pass(opt_level=0, name="UseKilnAttention")
class UseKilnAttention:
    def __init__(self, decode: bool = True, prefill: bool = True) -> None:
        self.swaps = [f for f, on in ((decode_replacement, decode), (prefill_replacement, prefill)) if on]

    def transform_module(self, mod: tvm.ir.IRModule, _ctx: tvm.transform.PassContext) -> tvm.ir.IRModule:
        if not self.swaps or rope_before_attention(mod) is None:
            return mod
        softcap = module_softcap(mod)
        mod = mod.clone()
        for gv, func in list(mod.functions_items()):
            if isinstance(func, tirx.PrimFunc):
                new = next((n for n in (swap(gv.name_hint, func, softcap) for swap in self.swaps)
                            if n is not None), None)
                if new is not None:
                    mod[gv] = new.with_attr(KILN_KERNEL_ATTR, True)
        return mod
