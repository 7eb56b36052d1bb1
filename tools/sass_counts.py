"""The instruction mix of a model's CUDA kernels, on a machine without a GPU.

    python tools/sass_counts.py [MODEL] [--target cuda-sm90] [--quant q4f16] [--variant base]
                                [--kernels REGEX] [--json OUT]

MODEL defaults to gpu_builds.py's 2-layer Llama-3-8B-shaped model (a shapes-only checkpoint:
the kernels depend on the shapes alone), whose kernels are the 8B's.

Builds MODEL for a CUDA preset as `kiln compile` would (gpu_builds.py's VARIANTS patched in with
--variant), compiles the generated CUDA source to a cubin with nvcc, disassembles it with nvdisasm
and prints, for each kernel whose name matches --kernels, its SASS instruction count and the most
frequent opcodes.

Why: a quantized GEMV that issues ~8 instructions per weight value is capped by the SM's issue rate
(4 warp-instructions a clock), not by memory. On the H100 (2026-11-26) the 8B's 4-bit GEMVs and its
8-bit LM head both ran at ~3e12 values a second, each with ~8 SASS instructions a value (the 1-row
GEMV thread handles 128 values: 1,040 instructions for the 4-bit kernels, 968 for the 8-bit): the
same value rate at half the bytes, so the 4-bit layers stream at half the bandwidth. Fewer
instructions a value is the lever, and this count is measurable here.

`--order` also prints each kernel's registers a thread (ptxas) and its global loads, MMAs, barriers
and branches in program order, runs of one opcode counted (`8 LDG, 16 HMMA`: opcodes without modifiers):
where a kernel issues its loads against its MMAs, e.g. gpu_builds.py's `pipe` against `base`:

    python tools/sass_counts.py --variant pipe --kernels 'q4[34]_NT_matmul[23]_relax_astype_kernel$' --order

Needs nvcc (on this machine) and nvdisasm: `pip install nvidia-cuda-nvdisasm` (a PyPI wheel).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))


def nvdisasm() -> str:
    """The nvdisasm binary: on PATH, or the one the nvidia-cuda-nvdisasm wheel installs."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    from importlib import metadata
    try:
        files = metadata.files("nvidia-cuda-nvdisasm") or []
    except metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == "nvdisasm":
            path = Path(f.locate())
            path.chmod(path.stat().st_mode | 0o111)          # the wheel ships it without the x bit
            return str(path)
    raise SystemExit("nvdisasm not found: pip install nvidia-cuda-nvdisasm (or put CUDA's nvdisasm on PATH)")


def cuda_source(model: str, target: str, quant: str, variant: str) -> str:
    """The CUDA source of MODEL's library built for `target`."""
    from gpu_builds import built_with

    from kiln.compiler.build import CompileOptions, build_lib, export_model
    with built_with(variant):
        ex = export_model(CompileOptions(model=model, target=target, quant=quant))
        lib, _ = build_lib(ex.mod, ex.profile)

    def modules(m):
        yield m
        for sub in m.imports:
            yield from modules(sub)
    for m in modules(lib.mod):
        if m.kind == "cuda":
            return m.inspect_source("cuda")
    raise SystemExit(f"the {target} build has no CUDA module")


def sass_kernels(source: str, arch: str, registers: dict | None = None) -> dict[str, list[str]]:
    """{kernel: [opcode, ...]} of the source compiled for `arch` (sm_90); `registers`, if given, gets
    {kernel: registers a thread} from ptxas."""
    with tempfile.TemporaryDirectory(prefix="kiln-sass-") as tmp:
        cu, cubin = Path(tmp) / "kernels.cu", Path(tmp) / "kernels.cubin"
        cu.write_text(source)
        built = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-O3", "-w", "-Xptxas", "-v", "-o", str(cubin),
                                str(cu)], capture_output=True, text=True)
        if built.returncode:
            raise SystemExit(f"nvcc failed on the generated CUDA:\n{built.stderr[-3000:]}")
        text = subprocess.run([nvdisasm(), "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
    if registers is not None:
        name = None
        for line in built.stderr.splitlines():
            entry = re.search(r"(?:Compiling entry function|Function properties for) '?(\w+)'?", line)
            name = entry.group(1) if entry else name
            used = re.search(r"Used (\d+) registers", line)
            if used and name:
                registers[name] = int(used.group(1))
    kernels: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        head = re.match(r"\s*\.text\.(\S+):", line)
        if head:
            name = head.group(1)
            kernels[name] = []
            continue
        op = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if name and op:
            kernels[name].append(op.group(1))
    return kernels


ORDERED = re.compile(r"LDG|HMMA|MMA|MEMBAR|BAR|BRA|EXIT")    # what --order shows, in program order


def in_order(ops: list[str]) -> str:
    """The kernel's global loads, MMAs, fences, barriers and branches in program order, a run of one
    opcode as `N OPCODE`."""
    runs: list[list] = []
    for op in ops:
        if ORDERED.match(op):
            if runs and runs[-1][1] == op:
                runs[-1][0] += 1
            else:
                runs.append([1, op])
    return ", ".join(f"{n} {op}" for n, op in runs)


def main() -> None:
    from gpu_builds import VARIANTS

    from kiln.targets import get_profile, names
    cuda = [name for name in names() if get_profile(name).device == "cuda"]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="a model kiln compiles (a path or an alias) [the 8B's 2 layers]")
    ap.add_argument("--target", default="cuda-sm90", choices=cuda)
    ap.add_argument("--quant", default="q4f16")
    ap.add_argument("--variant", default="base", choices=list(VARIANTS), help="a gpu_builds.py VARIANTS entry")
    ap.add_argument("--kernels", default="NT_matmul", help="regex over kernel names [NT_matmul]")
    ap.add_argument("--top", type=int, default=12, help="opcodes shown per kernel [12]")
    ap.add_argument("--order", action="store_true",
                    help="also each kernel's registers and its loads, MMAs and branches in program order")
    ap.add_argument("--json", help="also write {kernel: {total, opcodes}} here")
    args = ap.parse_args()
    arch = get_profile(args.target).tvm_target().arch
    with tempfile.TemporaryDirectory(prefix="kiln-shapes-") as tmp:
        model = args.model
        if model is None:
            from gpu_builds import VARIANT_LAYERS, llama8b_config, shapes_only_checkpoint
            name, config = llama8b_config(argparse.Namespace(quick=False), layers=VARIANT_LAYERS)
            model = str(shapes_only_checkpoint(Path(tmp) / name, config))
        source = cuda_source(model, args.target, args.quant, args.variant)
    registers: dict[str, int] = {}
    kernels = sass_kernels(source, arch, registers)
    report = {}
    for name, ops in sorted(kernels.items()):
        if re.search(args.kernels, name):
            counts = collections.Counter(ops)
            report[name] = {"total": len(ops), "opcodes": dict(counts.most_common()),
                            "registers": registers.get(name)}
            mix = ", ".join(f"{op} {n}" for op, n in counts.most_common(args.top))
            print(f"{name}: {len(ops)} instructions ({mix})")
            if args.order:
                report[name]["order"] = in_order(ops)
                print(f"  {registers.get(name, '?')} registers a thread; in order: {report[name]['order']}")
    if not report:
        print(f"no kernel matches {args.kernels!r}; the library has {len(kernels)}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
