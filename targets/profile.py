"""TargetProfile: everything the compiler and runtime need to know about one device family."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import tvm


@dataclass(frozen=True)
class TargetProfile:
    name: str                       # what users type: cpu, cuda, android, ...
    target: dict                    # TVM target, JSON dict form
    device: str                     # runtime device kind: "cpu" | "cuda" | ...
    export_format: str              # "so" | "tar" | "dylib" | "wasm"
    runnable_here: bool             # False for cross targets (android)
    page_size: int = 16             # KV cache tokens per page
    prefill_chunk: int = 2048       # most tokens one prefill call takes
    schedule: Callable[["TargetProfile"], list] = field(default=lambda p: [], compare=False)
    description: str = ""

    def tvm_target(self) -> tvm.target.Target:
        return tvm.target.Target(self.target)

    def schedule_passes(self) -> list[tvm.transform.Pass]:
        """The target's TIR scheduling passes (dlight rules or a tuned database)."""
        return self.schedule(self)

    @property
    def lib_name(self) -> str:
        return f"lib.{self.export_format}"
