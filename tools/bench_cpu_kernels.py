"""Time kiln's CPU matmul schedule on SmolLM2-135M's projection shapes against numpy (BLAS).

    python tools/bench_cpu_kernels.py                 # all shapes, m = 1 and 128, float32
    python tools/bench_cpu_kernels.py --shapes lm_head --rows 1,4,128 --threads 2

For each NT matmul ``y[1, m, N] = x[1, m, K] @ W[N, K]^T`` it reports the median time of the
TVM kernel and of ``x @ W.T`` in numpy, GFLOP/s, and weight GB/s (N*K*bytes / time: the m = 1
GEMV is bound by streaming W, compare with --bandwidth-gbs), plus the schedule and build time.
numpy is timed first: TVM's worker threads keep spinning after a kernel and would steal the
cores from OpenBLAS.  The machine should be otherwise idle; numbers on a shared box are noisy.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from dataclasses import dataclass

SHAPES = {  # name: (N, K) for SmolLM2-135M (hidden 576, 9 + 3 + 3 heads of 64, ffn 1536)
    "qkv": (960, 576),
    "o_proj": (576, 576),
    "gate_up": (3072, 576),
    "down": (576, 1536),
    "lm_head": (49152, 576),
}


@dataclass(frozen=True)
class BenchArgs:
    shapes: tuple[str, ...]
    rows: tuple[int, ...]
    dtype: str
    repeat: int
    threads: int
    bandwidth_gbs: float
    knob_overrides: dict  # CPUKnobs fields set on the command line


def parse_args(argv: list[str] | None = None) -> BenchArgs:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    parser.add_argument("--rows", default="1,128", help="comma list of m (rows of x) to time")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    parser.add_argument("--repeat", type=int, default=7, help="timed repeats; the median is reported")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="TVM_NUM_THREADS for the kernels")
    parser.add_argument("--bandwidth-gbs", type=float, default=21.0,
                        help="memory read bandwidth (GB/s) the m=1 weight stream is compared with")
    for knob in ("tile_m", "tile_n", "unroll_k", "vector_lanes"):
        parser.add_argument(f"--{knob.replace('_', '-')}", type=int, help=f"override CPUKnobs.{knob}")
    ns = parser.parse_args(argv)
    unknown = [s for s in ns.shapes.split(",") if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; pick from {list(SHAPES)}")
    return BenchArgs(
        shapes=tuple(ns.shapes.split(",")),
        rows=tuple(int(r) for r in ns.rows.split(",")),
        dtype=ns.dtype,
        repeat=ns.repeat,
        threads=ns.threads,
        bandwidth_gbs=ns.bandwidth_gbs,
        knob_overrides={k: getattr(ns, k) for k in ("tile_m", "tile_n", "unroll_k", "vector_lanes")
                        if getattr(ns, k) is not None},
    )


def numpy_seconds(n: int, k: int, m: int, dtype: str, repeat: int) -> float:
    """Median seconds of ``x @ W.T`` in numpy (float16 is timed as numpy does it, slowly)."""
    import numpy as np

    x = np.random.rand(m, k).astype(dtype)
    w = np.random.rand(n, k).astype(dtype)
    x @ w.T
    number = max(1, int(0.05 / max(_once(lambda: x @ w.T), 1e-7)))
    return statistics.median(_once(lambda: x @ w.T, number) for _ in range(repeat))


def _once(fn, number: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def nt_matmul_func(n: int, k: int, dtype: str, target, rows: int | str = "m"):
    """The fused NT matmul PrimFunc kiln's pipeline produces for ``nn.Linear(k, n)`` on
    x[1, rows, k]: symbolic rows (prefill, batch_decode) or a static 1 (the decode entry)."""
    import tvm
    from tvm import relax, tirx
    from tvm.relax.frontend import nn

    from kiln.compiler.pipeline import legalize_passes

    class Proj(nn.Module):
        def __init__(self) -> None:
            self.proj = nn.Linear(k, n, bias=False, dtype=dtype)

        def forward(self, x: nn.Tensor) -> nn.Tensor:
            return self.proj(x)

    mod, _ = Proj().export_tvm(spec={"forward": {"x": nn.spec.Tensor([1, rows, k], dtype)}})
    with target:
        mod = tvm.transform.Sequential(
            [
                relax.transform.FuseTransposeMatmul(),
                *legalize_passes(),
            ]
        )(mod)
    (func,) = [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    return func


def build_kernel(func, target, rules):
    """Schedule + build one PrimFunc; returns (kernel module or None, schedule s, build s)."""
    import tvm
    import tvm.s_tir.dlight as dl

    start = time.perf_counter()
    with target:
        scheduled = dl.ApplyDefaultSchedule(*rules)(tvm.IRModule({"main": func}))["main"]
    schedule_s = time.perf_counter() - start
    if not scheduled.attrs.get("tirx.is_scheduled", False):
        return None, schedule_s, 0.0
    start = time.perf_counter()
    module = tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")})
    kernel = tvm.compile(module, target=target).jit()
    return kernel, schedule_s, time.perf_counter() - start


def bench_shape(name: str, args: BenchArgs, target, rules, numpy_times: dict) -> list[str]:
    """One line per m: the symbolic-rows kernel, plus the static one-row decode GEMV ("1s")."""
    import numpy as np
    import tvm

    n, k = SHAPES[name]
    variants = [(m, "m", str(m)) for m in args.rows] + ([(1, 1, "1s")] if 1 in args.rows else [])
    kernels = {rows: build_kernel(nt_matmul_func(n, k, args.dtype, target, rows), target, rules)
               for rows in {v[1] for v in variants}}
    itemsize = np.dtype(args.dtype).itemsize
    lines = []
    for m, rows, label in variants:
        kernel, schedule_s, build_s = kernels[rows]
        if kernel is None:
            lines.append(f"{name:8s} {n:6d} {k:5d} {label:>4s} | NOT SCHEDULED by the kiln rules")
            continue
        x = np.random.rand(1, m, k).astype(args.dtype)
        w = np.random.rand(n, k).astype(args.dtype)
        buffers = [tvm.runtime.tensor(a) for a in (x, w, np.zeros((1, m, n), args.dtype))]
        kernel["main"](*buffers)
        err = float(np.abs(buffers[2].numpy() - (x[0].astype("float64") @ w.T.astype("float64"))).max())
        timer = kernel.time_evaluator("main", tvm.cpu(), number=1, repeat=args.repeat, min_repeat_ms=50)
        tvm_s = statistics.median(timer(*buffers).results)
        np_s = numpy_times[(name, m)]
        flops, weight_gb = 2.0 * m * n * k, n * k * itemsize / 1e9
        lines.append(
            f"{name:8s} {n:6d} {k:5d} {label:>4s} | {tvm_s * 1e6:9.1f} {flops / tvm_s / 1e9:7.1f} "
            f"{weight_gb / tvm_s:6.1f} {100 * weight_gb / tvm_s / args.bandwidth_gbs:5.0f}% | "
            f"{np_s * 1e6:9.1f} {flops / np_s / 1e9:7.1f} {weight_gb / np_s:6.1f} | {np_s / tvm_s:5.2f} | "
            f"{schedule_s * 1e3:5.0f} {build_s * 1e3:6.0f} | {err:.1e}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # TVM's default is one thread per 2 cores
    numpy_times = {
        (name, m): numpy_seconds(*SHAPES[name], m, args.dtype, args.repeat)
        for name in args.shapes
        for m in args.rows
    }
    import tvm

    from kiln.targets.cpu.schedule import CPUKnobs, cpu_schedule_rules

    target = tvm.target.Target(
        {
            "kind": "llvm",
            "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
            "mattr": ["-amx-tile", "-amx-int8", "-amx-bf16"],  # never emit AMX
            "num-cores": args.threads,
        }
    )
    knobs = dataclasses.replace(CPUKnobs(), **args.knob_overrides)
    rules = cpu_schedule_rules(knobs=knobs)
    print(f"{args.dtype}, {args.threads} threads, {knobs}, medians of {args.repeat}; "
          f"bandwidth ref {args.bandwidth_gbs} GB/s")
    print(
        f"{'shape':8s} {'N':>6s} {'K':>5s} {'m':>4s} | {'tvm us':>9s} {'GFLOP/s':>7s} {'W GB/s':>6s} "
        f"{'%bw':>6s} | {'numpy us':>9s} {'GFLOP/s':>7s} {'W GB/s':>6s} | {'speedup':>5s} | "
        f"{'sch ms':>5s} {'bld ms':>6s} | max err"
    )
    for name in args.shapes:
        for line in bench_shape(name, args, target, rules, numpy_times):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
