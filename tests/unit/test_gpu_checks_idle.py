"""tools/gpu_checks.py idle_gaps: where a GPU profile's idle time goes, from kernel start/end times."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def _gpu_checks():
    path = Path(__file__).parents[2] / "tools" / "gpu_checks.py"
    spec = importlib.util.spec_from_file_location("gpu_checks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_idle_time_is_grouped_by_the_kernel_after_the_gap():
    # Two steps: embed, a graph kernel, a 10 us wait, attention (overlapping a copy), then 100 us
    # of host between the steps; spacings of 1 us are launch spacing, not idle.
    step = [("embed", 0, 5), ("fused_matmul", 6, 50), ("batch_decode_paged_kv", 60, 70), ("copy", 65, 72),
            ("greedy", 73, 80)]
    kernels = step + [(name, start + 180, end + 180) for name, start, end in step]
    gaps = _gpu_checks().idle_gaps(kernels, steps=2, min_us=2.0)
    assert gaps["before"][0] == ("embed", 0.05, 0.5)               # 100 us once in 2 steps
    assert gaps["before"][1] == ("batch_decode_paged_kv", 0.01, 1.0)
    assert gaps["idle_ms"] == pytest.approx((100 + 2 * 10) / 2 / 1e3)
    assert gaps["launch_spacing_ms"] == pytest.approx(4 * 1 / 2 / 1e3)
    assert gaps["activities_per_step"] == 5


def test_no_kernels_no_idle():
    assert _gpu_checks().idle_gaps([], steps=1) == {"idle_ms": 0.0, "launch_spacing_ms": 0.0,
                                                    "activities_per_step": 0.0, "before": []}
