"""Software prefetch for the CPU's hand-written kernels: one home for the instruction and the distance.

A kernel that streams weight rows (quant_gemv.py's GEMVs, expert_matmul.py's tile decode) or KV-cache
pages (attention.py's decode) moves to a new 4 KB page every few rows, where the CPU's own prefetcher
starts over; asked for ahead, the reads are in flight when the loop gets there."""

from __future__ import annotations

from tvm.script import tirx as T

PREFETCH_BYTES = 4096      # how far ahead of a row loop its weights are prefetched (rows_ahead)


def rows_ahead(row_bytes: int) -> int:
    """Rows a loop over weight rows of row_bytes each prefetches ahead: PREFETCH_BYTES' worth, at least one
    (none where PREFETCH_BYTES is 0). Asked for ~4 KB ahead, SmolLM2's one-row GEMVs read 22-28 GB/s of
    planes where they read 15-19 (tools/bench_cpu_gemv.py, Sapphire Rapids, 2 threads: 2 KB ahead 20-24,
    1 KB 18-22)."""
    return max(1, -(-PREFETCH_BYTES // row_bytes)) if PREFETCH_BYTES > 0 else 0


def prefetch_read(address, into_l1: bool = True):
    """The statement's expression that asks for the cache line at `address` (T.address_of of a load), to
    be read: LLVM's llvm.prefetch, kept in every cache level (prefetcht0 on x86, PRFM PLDL1KEEP on
    AArch64), or with `into_l1` False only up to L2 (locality 2: prefetcht1, PLDL2KEEP).

    Where the loop asks a whole 4 KB page ahead, as the decode attention does, L2 is the level (the
    likely reason, not measured: into L1 each prefetch holds one of L1's few miss buffers until its line
    arrives, and the loop's own loads queue behind them). SmolLM2's decode attention at 1,024 tokens (30 layers' caches, 2 znver4 cores):
    82-88 us a call into L1, 45-47 into L2 (35 GB/s of KV, the host's read bandwidth). The GEMVs,
    4 KB ahead of a row, measured level either way (they are bound by instructions, not bytes)."""
    return T.call_llvm_intrin("void", "llvm.prefetch.p0", address, T.int32(0), T.int32(3 if into_l1 else 2),
                              T.int32(1))
