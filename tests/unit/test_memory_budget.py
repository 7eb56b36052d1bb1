"""The KV cache sized from the device's memory (`kiln serve --gpu-memory-utilization`, the default
on CUDA and ROCm): the arithmetic, where the memory figures come from, and an engine sized so."""

from __future__ import annotations

import math

import pytest

import kiln
from kiln.runtime.contract import KVCacheLayout
from kiln.runtime.memory_budget import (DeviceMemory, MemoryBudgetError, device_memory, gemm_weights_refused,
                                        host_memory, kv_tokens_for_memory, no_memory_size)

GIB = 2**30
LAYOUT = KVCacheLayout(page_size=16, num_layers=32, num_kv_heads=8, head_dim=128, dtype="float16")   # 8B-like


def test_kv_gets_what_the_weights_activations_and_reserve_leave():
    per_page = LAYOUT.bytes_per_token * 16                        # 2 MiB
    memory = DeviceMemory(free=70 * GIB, total=80 * GIB)          # weights already loaded
    tokens = kv_tokens_for_memory(memory, 0.9, 2 * GIB, LAYOUT, max_num_seqs=256, context_window=8192)
    budget = 70 * GIB - int(80 * GIB * (1 - 0.9)) - 2 * GIB
    assert tokens == budget // per_page * 16
    assert tokens * LAYOUT.bytes_per_token <= budget < (tokens + 16) * LAYOUT.bytes_per_token


def test_kv_never_exceeds_every_sequence_at_full_context():
    memory = DeviceMemory(free=70 * GIB, total=80 * GIB)
    tokens = kv_tokens_for_memory(memory, 0.9, 0, LAYOUT, max_num_seqs=4, context_window=1000)
    assert tokens == 4 * math.ceil(1000 / 16) * 16


def test_too_little_memory_for_one_full_context_is_refused_with_the_fixes():
    memory = DeviceMemory(free=9 * GIB, total=80 * GIB)           # another process holds the rest
    with pytest.raises(MemoryBudgetError, match=r"(?s)one sequence at the full context.*9\.00 GiB free of "
                                                r"80\.00 GiB.*raise --gpu-memory-utilization"):
        kv_tokens_for_memory(memory, 0.9, GIB, LAYOUT, max_num_seqs=8, context_window=8192)
    for bad in (0, -0.5, 1.5):
        with pytest.raises(MemoryBudgetError, match="not a fraction"):
            kv_tokens_for_memory(memory, bad, 0, LAYOUT, max_num_seqs=8, context_window=8192)


def test_blas_weights_take_at_most_half_of_what_the_kv_cache_would_get():
    memory = DeviceMemory(free=70 * GIB, total=80 * GIB)          # an 8B's 4-bit weights loaded
    budget = 70 * GIB - int(80 * GIB * 0.1) - 2 * GIB             # 60 GiB for the KV cache
    assert gemm_weights_refused(memory, 0.9, 2 * GIB, 15 * GIB) is None            # its float16 copies
    assert gemm_weights_refused(memory, 0.9, 2 * GIB, budget // 2) is None
    why = gemm_weights_refused(memory, 0.9, 2 * GIB, budget // 2 + 1)
    assert "do not fit beside the KV cache's half (60.00 GiB left at memory utilization 0.9)" in why
    assert "long prompts and wide decode steps go through batch_prefill and batch_decode" in why
    # A KV cache asked in tokens (its bytes): the copies get the rest, however much that is.
    assert gemm_weights_refused(memory, 0.9, 2 * GIB, 50 * GIB, kv_bytes=10 * GIB) is None
    assert "a KV cache of 10.02 GiB" in gemm_weights_refused(memory, 0.9, 2 * GIB, 50 * GIB, kv_bytes=10 * GIB + 2**24)
    with pytest.raises(MemoryBudgetError, match="not a fraction"):
        gemm_weights_refused(memory, 1.5, 0, GIB)


def test_host_memory_reads_meminfo_within_the_cgroup_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n")
    no_cgroup = tmp_path / "none"
    assert host_memory(meminfo, no_cgroup) == DeviceMemory(20_000_000 * 1024, 24_000_000 * 1024)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("8589934592\n")
    (cgroup / "memory.current").write_text(str(3 * GIB))
    assert host_memory(meminfo, cgroup) == DeviceMemory(5 * GIB, 8 * GIB)
    (cgroup / "memory.max").write_text("max\n")
    assert host_memory(meminfo, cgroup) == DeviceMemory(20_000_000 * 1024, 24_000_000 * 1024)


class _Reports:
    """Stands for a TVM device's memory attributes (what CUDA, or ROCm/OpenCL/Metal, report)."""

    def __init__(self, total, free):
        self.total_global_memory, self.available_global_memory = total, free


def test_device_memory_takes_what_the_device_reports():
    assert device_memory("cuda", _Reports(80 * GIB, 60 * GIB), loaded_bytes=5 * GIB) == DeviceMemory(60 * GIB, 80 * GIB)
    # ROCm/OpenCL/Metal report only the total: what this engine loaded is taken off it
    assert device_memory("rocm", _Reports(64 * GIB, None), loaded_bytes=5 * GIB) == DeviceMemory(59 * GIB, 64 * GIB)
    assert device_memory("vulkan", _Reports(None, None), loaded_bytes=0) is None     # then: the default size,
    assert "--kv-cache-memory or --max-total-tokens" in str(no_memory_size("vulkan"))  # or this if asked


def test_engine_sized_by_memory_on_this_machine(tiny_artifacts):
    art = kiln.Artifact.load(tiny_artifacts["tied"])
    cfg = art.config
    assert cfg.activation_bytes > 0
    # a tiny model: 90% of this machine holds every sequence at its full context, the cap
    engine = kiln.Engine(art.path, kiln.EngineConfig(max_num_seqs=3, gpu_memory_utilization=0.9))
    pages = math.ceil(cfg.context_window_size / cfg.kv_cache.page_size)
    assert engine.runner.max_total_tokens == 3 * pages * cfg.kv_cache.page_size
    assert engine.generate([5, 6, 7], kiln.SamplingParams(max_tokens=3, temperature=0)).token_ids
    # a share smaller than what the rest of the machine already holds leaves the KV cache nothing
    with pytest.raises(MemoryBudgetError, match="raise --gpu-memory-utilization"):
        kiln.Engine(art.path, kiln.EngineConfig(gpu_memory_utilization=1e-6))
    with pytest.raises(ValueError, match="give the KV cache size once, not as max_total_tokens and "
                                         "gpu_memory_utilization"):
        kiln.Engine(art.path, kiln.EngineConfig(max_total_tokens=512, gpu_memory_utilization=0.5))


@pytest.mark.parametrize("bad", [0, 1.5, -0.2, True, "0.9"])
def test_engine_refuses_a_bad_utilization_before_loading(tiny_artifacts, monkeypatch, bad):
    """A share outside (0, 1] is refused in one line before any weight is read."""
    import kiln.runtime.model_runner as model_runner
    monkeypatch.setattr(model_runner.ModelRunner, "__init__", lambda *a, **k: pytest.fail("weights were loaded"))
    with pytest.raises(MemoryBudgetError, match=r"is not a fraction in \(0, 1\]; e\.g\. 0\.9"):
        kiln.Engine(tiny_artifacts["tied"], kiln.EngineConfig(gpu_memory_utilization=bad))
