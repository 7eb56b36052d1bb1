"""The KV cache sized from the device's memory (vLLM's --gpu-memory-utilization).

Of the device's total memory, a fraction `utilization` may be this engine's. When the cache is
made the weights are already on the device, and the artifact records the most its planned
activation buffers take (ArtifactConfig.activation_bytes), so the KV cache gets

    free now - total * (1 - utilization) - activation bytes

in whole pages: what other processes hold stays theirs, and a tenth (at 0.9) is left for the
device runtime, the attention kernels' scratch and allocations sized at run time. It never gets
more than every sequence at its full context can use, and it must hold at least one sequence
at the full context, else the engine refuses to start and says what to change.

The memory comes from TVM's device attributes (CUDA reports free and total; ROCm, OpenCL and
Metal only total, so free is total less what this engine loaded); on the CPU from the kernel's
MemAvailable, within the process's cgroup limit. A device that reports no size keeps the default
capacity (default_kv_tokens), and a share asked of it is refused; sized_by_memory says which way a
runner's cache is sized.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .contract import KVCacheLayout

if TYPE_CHECKING:
    from .artifact import Artifact

DEFAULT_GPU_UTILIZATION = 0.9
# Devices a server runs on, with memory of their own: an engine there sizes its KV cache from the
# device's memory unless told a size. Elsewhere (CPUs, Apple and phone GPUs sharing the system's
# memory with the app) the default stays one full context plus a page per sequence.
SERVER_DEVICES = ("cuda", "rocm")


class MemoryBudgetError(ValueError):
    """The KV cache cannot be sized from memory as asked; the message names the fix."""


@dataclass(frozen=True)
class DeviceMemory:
    free: int
    total: int


def device_memory(kind: str, device, loaded_bytes: int) -> DeviceMemory | None:
    """Free and total bytes of the device an engine runs on (None where TVM reports no size);
    `loaded_bytes` (what the engine put there itself) is taken off the total where the device
    reports no free memory."""
    if kind == "cpu":
        return host_memory()
    total = device.total_global_memory
    if not total:
        return None
    free = device.available_global_memory
    return DeviceMemory(int(free) if free is not None else max(0, int(total) - loaded_bytes), int(total))


def host_memory(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")) -> DeviceMemory:
    """The machine's available and total memory, as Linux reports them, within this process's
    cgroup (v2) limit if it has one; elsewhere sysconf's free pages."""
    try:
        fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        free, total = (int(fields[k].split()[0]) * 1024 for k in ("MemAvailable", "MemTotal"))
    except (OSError, KeyError, ValueError):
        page = os.sysconf("SC_PAGE_SIZE")
        free, total = os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            used = int((cgroup / "memory.current").read_text())
            total = min(total, int(limit))
            free = min(free, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return DeviceMemory(free, total)


def no_memory_size(kind: str) -> MemoryBudgetError:
    return MemoryBudgetError(f"TVM reports no memory size for this {kind} device; give the KV cache size "
                             "instead (--kv-cache-memory or --max-total-tokens)")


def check_utilization(utilization: float) -> None:
    if not (isinstance(utilization, (int, float)) and not isinstance(utilization, bool) and 0 < utilization <= 1):
        raise MemoryBudgetError(f"memory utilization {utilization!r} is not a fraction in (0, 1]; e.g. 0.9")


def kv_tokens_for_memory(memory: DeviceMemory, utilization: float, activation_bytes: int,
                         layout: KVCacheLayout, max_num_seqs: int, context_window: int) -> int:
    """KV capacity in tokens (whole pages) for `utilization` of the device's memory."""
    reserved, budget = _budget(memory, utilization, activation_bytes)
    per_page = layout.bytes_per_token * layout.page_size
    pages_per_seq = math.ceil(context_window / layout.page_size)
    pages = min(max(budget, 0) // per_page, max_num_seqs * pages_per_seq)
    if pages < pages_per_seq:
        raise MemoryBudgetError(
            f"the KV cache needs {_gib(pages_per_seq * per_page)} for one sequence at the full context "
            f"({context_window} tokens), but at memory utilization {utilization} it gets {_gib(max(budget, 0))} "
            f"({_gib(memory.free)} free of {_gib(memory.total)}, {_gib(reserved)} kept back, "
            f"{_gib(activation_bytes)} for activations); raise --gpu-memory-utilization, free the device, "
            "or compile with a smaller --context-window")
    return pages * layout.page_size


def gemm_weights_refused(memory: DeviceMemory, utilization: float, activation_bytes: int, need: int,
                         kv_bytes: int | None = None) -> str | None:
    """Why the library GEMM's float weights (`need` bytes, kept from the load: compiler/passes/library_gemm.py)
    stay off the device, or None where they fit: within `utilization` of its memory beside the
    activations and a KV cache of `kv_bytes` if one was asked, else in at most half of what the KV
    cache would get, so that a long-prompt speed-up never halves the sequences a server holds."""
    _, budget = _budget(memory, utilization, activation_bytes)
    room = budget - kv_bytes if kv_bytes is not None else budget // 2
    if need <= room:
        return None
    kv = f"a KV cache of {_gib(kv_bytes)}" if kv_bytes is not None else "the KV cache's half"
    return (f"its float weights for the BLAS entries ({_gib(need)}) do not fit beside {kv} "
            f"({_gib(max(budget, 0))} left at memory utilization {utilization}); long prompts and wide "
            "decode steps go through batch_prefill and batch_decode")


def _budget(memory: DeviceMemory, utilization: float, activation_bytes: int) -> tuple[int, int]:
    """(bytes kept back, bytes left for the KV cache and anything else the engine keeps) at
    `utilization` of the device's memory, the weights already loaded and the activations planned."""
    check_utilization(utilization)
    reserved = int(memory.total * (1 - utilization))
    return reserved, memory.free - reserved - activation_bytes


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def sized_by_memory(device_kind: str, memory_utilization: float | None) -> bool:
    """Whether a runner's KV capacity comes from the device's memory (a share asked, or CUDA and ROCm
    by default) rather than from default_kv_tokens (unless given in tokens)."""
    return memory_utilization is not None or device_kind in SERVER_DEVICES


def runner_kv_tokens(artifact: Artifact, device, max_num_seqs: int, share: float | None, loaded: int) -> int | None:
    """A runner's KV tokens for `share` of `device`'s memory, the weights (`loaded` bytes) already on
    it; with no share, DEFAULT_GPU_UTILIZATION on CUDA and ROCm. None: the default capacity (no
    share asked, and the device is not one of those or reports no memory size)."""
    kind, cfg = artifact.device, artifact.config
    if not sized_by_memory(kind, share):
        return None
    memory = device_memory(kind, device, loaded)
    if memory is None:
        if share is not None:
            raise no_memory_size(kind)
        return None
    return kv_tokens_for_memory(memory, DEFAULT_GPU_UTILIZATION if share is None else share,
                                cfg.activation_bytes, cfg.kv_cache, max_num_seqs, artifact.context_window)


def default_kv_tokens(artifact: Artifact, max_num_seqs: int | None = None) -> int:
    """The KV capacity a runner gets unless told otherwise: room for one full-context sequence plus a
    partly filled page per other sequence."""
    cfg = artifact.config
    return artifact.context_window + (max_num_seqs or cfg.max_batch_size) * cfg.kv_cache.page_size
