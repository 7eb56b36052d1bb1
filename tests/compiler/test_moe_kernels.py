"""models/moe.py's kernels on the GPU presets: the gathered expert matmul (weights read through the
router's indices) made dlight's GEMV / Reduction analyses assert, which killed a CUDA compile of any
MoE model; targets/gpu.py's Tolerant rules pass it on to the next rule. Its numerics are checked
on the CPU against transformers (tests/numerics/test_families.py: mixtral, qwen2-moe, qwen3-moe, olmoe)."""

from __future__ import annotations

import pytest
from tvm import te, tirx

from gpu_kernels import build_prim_func, nvcc_compiles
from kiln.models.moe import expert_matmul_te

pytestmark = pytest.mark.compiler


@pytest.mark.parametrize("per_slot", [False, True])
def test_the_expert_matmul_builds_for_cuda(per_slot, tmp_path):
    tokens = tirx.Var("tokens", "int64")
    rows, depth = (64, 96) if per_slot else (192, 64)               # down, gate_up of 8 experts
    x = te.placeholder((tokens, 2, depth) if per_slot else (tokens, depth), "float16", name="x")
    w = te.placeholder((8 * rows, depth), "float16", name="w")
    experts = te.placeholder((tokens, 2), "int32", name="experts")
    func = te.create_prim_func([x, w, experts, expert_matmul_te(x, lambda n, r: w[n, r], experts, rows)])
    built = build_prim_func("expert_matmul", func, "cuda-sm90")
    source = built.artifact_source
    assert "expert_matmul_kernel" in source and "threadIdx.x" in source      # scheduled (dlight's Fallback)
    nvcc_compiles(source, tmp_path)
