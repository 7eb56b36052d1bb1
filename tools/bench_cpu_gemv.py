"""Time kiln's quantized GEMVs on this CPU: targets/cpu/quant_gemv.py's hand-written kernels
against what QuantMatmul builds without them (one row: its scheduled GEMV; more: its tiled matmul),
per weight format and row count, on SmolLM2's projection shapes. The planes are rotated through
--cold-mb of copies, so each call reads its weights from memory as a decode step does (a model's
weights outgrow the caches).

    python tools/bench_cpu_gemv.py                                   # q4m (GGUF Q4_1), every shape
    python tools/bench_cpu_gemv.py --formats q4,q8,f16 --shapes gate_up,lm_head --repeat 15
    python tools/bench_cpu_gemv.py --rows 1,2,4,8                    # batched decode's row counts
    python tools/bench_cpu_gemv.py --int8 --formats q4,q4m --scale-dtype float16   # int8 x against exact

Each line: the best of --repeat passes over the copies (the two kernels' passes alternating: a
shared host's bandwidth drifts by 1.5x over minutes), in us a call and GB/s of planes read, for
both kernels; the speedup; the largest difference of each from numpy's float64 product (relative to
its largest value). The kernels are built for this machine's CPU, as `kiln compile --target cpu` does.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu_kernels import SHAPES  # noqa: E402  (SmolLM2's (N, K) per projection)

FORMATS = ("q4", "q4m", "q8", "q8m", "f16", "bf16")


def dequant_matmul(kind: str, n: int, k: int, group: int = 32, by_bits: bool = False, x_dtype: str = "float32",
                   rows: int | None = None, scale_dtype: str = "float32", rows_second: bool = False):
    """y[rows, 1, n] = x[rows, 1, k] . dequantize(planes)[n, k] as kiln's modules emit it (kiln's
    `dequantize` block, int64 shapes; symbolic rows unless `rows` is given). `rows_second`: x [1, rows,
    k] and y [1, rows, n] (a prefill's layout: one sequence's positions)."""
    from tvm import te, tirx

    from kiln.compiler.quant_modules import QuantFormat, dequantize_element

    def i64(*dims):
        return [tirx.IntImm("int64", d) if isinstance(d, int) else d for d in dims]

    fmt = QuantFormat(kind, group, scale_dtype)
    planes = [te.placeholder(i64(*shape), dtype, name=name) for name, (shape, dtype) in fmt.planes(n, k).items()]
    qweight, scale, minimum = (planes + [None, None])[:3]
    w = te.compute(i64(n, k), lambda i, j: dequantize_element(fmt, "float32", qweight, scale, minimum, i, j, by_bits),
                   name="dequantize")
    m = tirx.Var("rows", "int64") if rows is None else rows
    lead = (1, m) if rows_second else (m, 1)
    x = te.placeholder(i64(*lead, k), x_dtype, name="x")
    r = te.reduce_axis(i64(0, k), name="k")
    y = te.compute(i64(*lead, n), lambda a, b, c: te.sum(x[a, b, r].astype("float32") * w[c, r], axis=r),
                   name="NT_matmul")
    return te.create_prim_func([*planes, x, y])


def random_planes(fmt, n: int, k: int, rng) -> dict:
    """Planes of `fmt` for an [n, k] weight: random codes, small positive scales, mins around 0."""
    import numpy as np

    out = {}
    for name, (shape, dtype) in fmt.planes(n, k).items():
        if name in ("scale", "min"):
            out[name] = ((rng.random(shape) - (0.5 if name == "min" else 0.0)) * 0.1).astype(dtype)
        elif dtype == "float16":
            out[name] = rng.standard_normal(shape).astype(np.float16)
        elif fmt.kind == "bf16":                                        # bfloat16 bits: float32's high half
            out[name] = (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        else:
            info = np.iinfo(dtype)
            out[name] = rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
    return out


def cpu_target(mcpu: str | None = None):
    """This machine's CPU as `kiln compile --target cpu` builds for it (or LLVM CPU `mcpu`: haswell times
    the AVX2 kernels on an AVX-512 host)."""
    import tvm
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu or tvm.target.codegen.llvm_get_system_cpu(),
                              "mattr": ["-amx-tile", "-amx-int8", "-amx-bf16"], "num-cores": os.cpu_count() or 1})


def kernels(kind: str, n: int, k: int, target, rows: int = 1, scale_dtype: str = "float32", group: int = 32,
            int8: bool = False):
    """(hand-written GEMV, the schedule QuantMatmul uses without it) for `rows` rows of a `kind`
    [n, k] weight, built: QuantMatmul's function itself (its branches dispatch on the rows), and its
    GEMV (one row) or its tiled matmul. `int8`: (QuantMatmul's function with int8 activations
    (`--decode-activations int8`), the same without them)."""
    import tvm

    from kiln.targets import INT8_DECODE_ATTR
    from kiln.targets.cpu import quant_gemv
    from kiln.targets.cpu.quant_schedule import QuantMatmul, default_knobs, gemv_tile_n
    from kiln.targets.cpu.schedule import target_mcpu, vector_lanes_for_target

    func = dequant_matmul(kind, n, k, group, scale_dtype=scale_dtype)
    if quant_gemv.branches(func) is None:
        raise SystemExit(f"{kind} {n} x {k}: quant_gemv does not take this kernel")
    rule = QuantMatmul(default_knobs(vector_lanes_for_target(target), target_mcpu(target)))   # the CPU's, as compile's
    scheduled, _ = rule._variant(func, panel=rows > 1, tile_n=None if rows > 1 else gemv_tile_n(rule.knobs, target))
    build = lambda f: tvm.compile(tvm.IRModule({"main": f}), target=target)["main"]  # noqa: E731
    if int8:
        return (build(rule.apply(func.with_attr(INT8_DECODE_ATTR, True), target, False).mod["main"]),
                build(rule.apply(func, target, False).mod["main"]))
    return build(rule.apply(func, target, False).mod["main"]), build(scheduled.mod["main"])


def bench(kind: str, shape: str, rows: int, repeat: int, cold_mb: int, target, scale_dtype: str = "float32",
          group: int = 32, int8: bool = False) -> str:
    import numpy as np
    import tvm

    from kiln.compiler.quant_modules import QuantFormat
    from kiln.compiler.quant_pack import dequantize

    n, k = SHAPES[shape]
    fmt = QuantFormat(kind, group, scale_dtype)
    rng = np.random.default_rng(0)
    planes = random_planes(fmt, n, k, rng)
    nbytes = sum(p.nbytes for p in planes.values())
    copies = max(2, cold_mb * 2**20 // nbytes)
    sets = [[tvm.runtime.tensor(p.copy()) for p in planes.values()] for _ in range(copies)]
    x = rng.standard_normal((rows, 1, k)).astype(np.float32)
    want = x[:, 0].astype(np.float64) @ dequantize(fmt, planes).astype(np.float64).T
    xt, yt = tvm.runtime.tensor(x), tvm.runtime.tensor(np.zeros((rows, 1, n), np.float32))
    built, errs = kernels(kind, n, k, target, rows, scale_dtype, group, int8), []
    for kernel in built:
        kernel(*sets[0], xt, yt)
        errs.append(float(np.abs(yt.numpy()[:, 0] - want).max() / np.abs(want).max()))
    best = [float("inf")] * len(built)
    for _ in range(repeat):             # the kernels' passes alternate: a shared host's bandwidth drifts
        for i, kernel in enumerate(built):
            start = time.perf_counter()
            for planes_set in sets:
                kernel(*planes_set, xt, yt)
            best[i] = min(best[i], (time.perf_counter() - start) / copies)
    (hand_us, sched_us), (hand_gbs, sched_gbs) = [t * 1e6 for t in best], [nbytes / t / 1e9 for t in best]
    hand_err, sched_err = errs
    return (f"{kind:5s} {shape:8s} {n:6d} {k:5d} {rows:4d} | {hand_us:8.1f} {hand_gbs:6.1f} | "
            f"{sched_us:8.1f} {sched_gbs:6.1f} | {sched_us / hand_us:5.2f} | {hand_err:.1e} {sched_err:.1e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", default="q4m", help=f"comma list of {', '.join(FORMATS)}")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    parser.add_argument("--rows", default="1", help="comma list of row counts (batched decode's sequences) [1]")
    parser.add_argument("--repeat", type=int, default=10, help="passes over the copies; the best is reported")
    parser.add_argument("--cold-mb", type=int, default=256, help="memory the plane copies rotate through")
    parser.add_argument("--scale-dtype", default="float32", choices=("float32", "float16"),
                        help="the scale and min planes' dtype (float16: a GGUF's own, kept so on a CPU)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="TVM_NUM_THREADS for the kernels")
    parser.add_argument("--int8", action="store_true",
                        help="time the one-row GEMV with int8 activations (`kiln compile --decode-activations "
                             "int8`) against the exact one (the columns hand / sched become int8 / exact)")
    parser.add_argument("--mcpu", help="build for this LLVM CPU instead of the host's (haswell: AVX2 only)")
    parser.add_argument("--group", type=int, default=32,
                        help="values a scale serves (16 with q8 / q8m: GGUF's Q6_K as stored) [32]")
    ns = parser.parse_args(argv)
    formats, shapes = ns.formats.split(","), ns.shapes.split(",")
    bad = [f for f in formats if f not in FORMATS] + [s for s in shapes if s not in SHAPES]
    if bad:
        parser.error(f"unknown {bad}; formats {list(FORMATS)}, shapes {list(SHAPES)}")
    os.environ["TVM_NUM_THREADS"] = str(ns.threads)
    target = cpu_target(ns.mcpu)
    print(f"{target.attrs['mcpu']}, {ns.threads} threads, {ns.scale_dtype} scales in groups of {ns.group}, "
          f"best of {ns.repeat} passes "
          f"over {ns.cold_mb} MB of planes")
    print(f"{'fmt':5s} {'shape':8s} {'N':>6s} {'K':>5s} {'rows':>4s} | {'hand us':>8s} {'GB/s':>6s} | "
          f"{'sched us':>8s} {'GB/s':>6s} | {'x':>5s} | rel err hand, sched")
    for kind in formats:
        for shape in shapes:
            for rows in (int(r) for r in ns.rows.split(",")):
                print(bench(kind, shape, rows, ns.repeat, ns.cold_mb, target, ns.scale_dtype, ns.group, ns.int8),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
