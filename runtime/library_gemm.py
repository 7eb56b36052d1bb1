"""kiln.gemm_nt: the device's BLAS for batch_prefill_gemm's and batch_decode_gemm's matmuls.

compiler/passes/library_gemm.py routes the token matmuls of those entries to GEMM_PACKED_FUNC:
out = x @ w.T over x's last axis ([.., K]) and w [N, K], all one dtype. Here that is torch.matmul
on the tensors' own memory (DLPack, no copies): cuBLAS on CUDA (float16 summed in float32 and
rounded once, as kiln's matmuls sum; torch's reduced-precision float16 reductions are turned off
at the first call), its BLAS on a CPU. torch shares CUDA's legacy default stream with TVM's
launches, so the matmul runs between the kernels before and after it.

The VM resolves the name when it loads a library that calls it: the runner registers it first
(register), and takes the entry only where torch can run it (unusable says why not), where the
entry's float weights fit beside the KV cache (made once at load: memory_budget.gemm_weights_refused),
for forwards of MIN_TOKENS or more and decode steps of MIN_DECODE_ROWS sequences or more. Below
that a forward reads the quantized weights (4x fewer bytes for 4-bit ones) through kiln's own
kernels. Both are arithmetic, not measured: for an 8B model on an H100 the BLAS's float16 weights
take ~5.3 ms to read; the 4-bit prefill's matmuls run at ~210 TFLOP/s (14 GFLOP a token), so from
~64 tokens the BLAS at ~600 TFLOP/s is ahead; a 16-sequence decode step's matmuls took 10.7 ms on
the 4-bit tiles, but the MMA GEMV (to 16 rows) should take ~2.3. At the first GPU run
tools/gpu_checks.py's `library gemm crossover` and `library gemm decode crossover` say where they are.
"""

from __future__ import annotations

from ._tvm import tvm_ffi
from .contract import GEMM_PACKED_FUNC

MIN_TOKENS = 64
MIN_DECODE_ROWS = 32
_TORCH_DEVICES = ("cpu", "cuda", "rocm")          # runtime device kinds torch's matmul runs on


def register() -> None:
    """Make GEMM_PACKED_FUNC callable (once a process); torch is imported at its first call."""
    if tvm_ffi.get_global_func(GEMM_PACKED_FUNC, allow_missing=True) is None:
        tvm_ffi.register_global_func(GEMM_PACKED_FUNC, _gemm_nt)


def unusable(device: str) -> str | None:
    """None where torch runs matmuls on the runtime's `device` kind; else why not, in one line."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if device not in _TORCH_DEVICES:
        return f"torch runs no matmuls on {device}"
    if device == "cpu":
        return None
    gpu = torch.cuda.is_available() and bool(torch.version.hip) == (device == "rocm")
    return None if gpu else f"this torch has no {device} support (torch {torch.__version__})"


_configured = False


def _gemm_nt(x, w, out) -> None:
    global _configured
    import torch
    if not _configured:
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        _configured = True
    tx, tw, to = torch.from_dlpack(x), torch.from_dlpack(w), torch.from_dlpack(out)
    torch.matmul(tx.reshape(-1, tx.shape[-1]), tw.t(), out=to.view(-1, to.shape[-1]))
