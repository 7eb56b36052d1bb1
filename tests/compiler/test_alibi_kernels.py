"""targets/owned_kv.py's attention kernel with ALiBi's slopes (models/alibi.py) builds for CUDA: its GPU form
(a block a token, a thread a head) takes the slopes buffer, and nvcc compiles it for sm_90 where nvcc is here."""

from __future__ import annotations

import pytest

from gpu_kernels import build_prim_func, nvcc_compiles
from kiln.targets.owned_kv import owned_attention

pytestmark = pytest.mark.compiler


def test_the_slopes_kernel_builds_for_cuda(tmp_path):
    built = build_prim_func("alibi", owned_attention(2, 6, 16, "float16", 16, 0.25, gpu=True, alibi=True), "cuda")
    source = built.artifact_source
    assert "slopes" in source and "alibi_kernel" in source
    nvcc_compiles(source, tmp_path)
