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
kernels. Measured in one runner (H200, 8B-architecture q4f16, tools/gpu_checks.py measure8b's
`library gemm crossover`, 2026-11-28), through kiln's kernels against through the BLAS: a prompt of
16 tokens 12.7 ms against 8.6, 32: 12.4 against 9.1, 64: 16.4 against 8.4, 16 x 128: 160 against
59; a decode step of 8 sequences 3.6 ms against 8.4, 16: 4.5 against 8.5, 32: 8.1 against 8.8,
64: 13.8 against 9.1. Kiln's tiles grow by ~0.18 ms a sequence from 32, the BLAS by ~0.01: they
cross near 36 (interpolated); MIN_DECODE_ROWS is 40. Fewer than 16 tokens were not measured.

A decode step's crossover moves with the model (min_decode_rows): the BLAS path's cost a step is
mostly fixed, a host call a matmul and no CUDA graphs, while kiln's kernels grow with rows x weight
values, so a model whose matmuls are smaller crosses at proportionally more rows. Scaled from the
8B's (DECODE_CALL_VALUES a call, the artifact's library_gemm_call_values): SmolLM2-135M (0.88 M
values a call) crosses at ~2,470 sequences, beyond the 256 an artifact serves. Measured (H200,
2026-12-04, tools/gpu_checks.py `all`): SmolLM2 q4f16 at 64 sequences through the BLAS entry 8,453
tok/s (7.6 ms a step) and at 256 32,358, where its batch_decode (CUDA graphs) had made 27,469 and
56,837 (2026-11-28, same GPU): 3.2x and 1.8x slower.
"""

from __future__ import annotations

import math

from ._tvm import tvm_ffi
from .contract import GEMM_PACKED_FUNC, LIBRARY_GEMM_ENTRY, LIBRARY_GEMM_WEIGHTS
from .memory_budget import DEFAULT_GPU_UTILIZATION, device_memory, gemm_weights_refused

MIN_TOKENS = 16
MIN_DECODE_ROWS = 40
DECODE_CALL_VALUES = 54_525_952           # the 8B's weight values a BLAS call (6.98 G over 128), MIN_DECODE_ROWS'
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


def _configure(torch) -> None:
    """float16 and bfloat16 matmuls summed in float32 (as kiln's own), once a process."""
    global _configured
    if not _configured:
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        _configured = True


def warm_up(device: str, index: int = 0) -> None:
    """One small matmul on the runtime's device through torch, at load: torch's BLAS handle and
    workspace are made then (before the KV cache takes the memory left), not in the first long
    forward a request waits on."""
    import torch
    _configure(torch)
    if device != "cpu":
        a = torch.ones((16, 16), dtype=torch.float16, device=torch.device("cuda", index))
        torch.matmul(a, a.t())
        torch.cuda.synchronize(a.device)


def _gemm_nt(x, w, out) -> None:
    import torch
    _configure(torch)
    tx, tw, to = torch.from_dlpack(x), torch.from_dlpack(w), torch.from_dlpack(out)
    torch.matmul(tx.reshape(-1, tx.shape[-1]), tw.t(), out=to.view(-1, to.shape[-1]))


def kept_weights(artifact, vm, device, params, kv_tokens: int | None, share: float | None,
                 loaded: int) -> tuple[object | None, str | None]:
    """(LIBRARY_GEMM_WEIGHTS' float weights, None) for a runner of `artifact` (its VM, device and
    params; `loaded` bytes on the device so far; the KV cache's tokens, or its share of the device's
    memory, as asked); or (None, why the runner goes without the library GEMM entries)."""
    cfg = artifact.config
    if LIBRARY_GEMM_ENTRY not in cfg.entry_functions:
        return None, "not in this artifact"
    if LIBRARY_GEMM_WEIGHTS not in cfg.entry_functions:
        return None, f"this artifact's {LIBRARY_GEMM_ENTRY} predates {LIBRARY_GEMM_WEIGHTS}; recompile it"
    why = unusable(artifact.device)
    if why is not None:
        return None, why
    if cfg.library_gemm_bytes:                          # quantized weights: their float copies
        memory = device_memory(artifact.device, device, loaded)
        if memory is None:
            return None, "the device reports no memory size to fit the BLAS's float weights in"
        kv_bytes = None if kv_tokens is None else kv_tokens * cfg.kv_cache.bytes_per_token
        why = gemm_weights_refused(memory, DEFAULT_GPU_UTILIZATION if share is None else share,
                                   cfg.activation_bytes, cfg.library_gemm_bytes, kv_bytes)
        if why is not None:
            return None, why
    try:
        warm_up(artifact.device, device.index)
    except RuntimeError as e:                       # torch's errors (its CUDA, its BLAS): go without
        return None, f"torch's BLAS did not start ({str(e).strip().splitlines()[-1][:200]})"
    try:
        return vm[LIBRARY_GEMM_WEIGHTS](params), None
    except RuntimeError as e:                       # TVM's errors, e.g. out of device memory: go without
        return None, f"making its float weights failed ({str(e).strip().splitlines()[-1][:200]})"


def min_decode_rows(config) -> int:
    """The fewest sequences a decode step of an artifact (its `config`) takes the BLAS entry for:
    MIN_DECODE_ROWS for matmuls of DECODE_CALL_VALUES weight values a call or more (and for artifacts
    that predate the count), proportionally more for smaller ones (see the module docstring)."""
    values = config.library_gemm_call_values
    if not values or values >= DECODE_CALL_VALUES:
        return MIN_DECODE_ROWS
    return math.ceil(MIN_DECODE_ROWS * DECODE_CALL_VALUES / values)


def note(config, why_unused: str | None) -> str | None:
    """What a runner does with an artifact's (its `config`'s) library GEMM entries, in a clause for a
    load message; None where it has none."""
    if LIBRARY_GEMM_ENTRY not in config.entry_functions:
        return None
    if why_unused is not None:
        return f"the BLAS entries unused: {why_unused}"
    size = config.library_gemm_bytes
    size = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
    rows = min_decode_rows(config)
    decode = f"decode steps of {rows}+ sequences" if rows <= config.max_batch_size else \
        f"no decode step (it pays from {rows} sequences; the artifact serves {config.max_batch_size})"
    return f"forwards of {MIN_TOKENS}+ tokens and {decode} through the device's BLAS ({size} of float weights kept)"
