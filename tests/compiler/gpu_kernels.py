"""Helpers for running a GPU artifact's kernels outside TVM (OpenCL on pocl, WGSL on wgpu).

A preset is built as `kiln compile` builds it (export_model + build_lib); the scheduled TIR is kept
(an instrument on the pipeline) because it holds what the kernel source does not: each kernel's
launch extents (its thread bindings) and which parameter is which. The kernels picked are the
ones the issue names: the quantized GEMV (decode), a quantized matmul (prefill) and the paged
decode attention kernel.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np
import tvm

from kiln.compiler.build import CompileOptions, build_lib, export_model


@dataclass
class Built:
    executable: object                  # relax VMExecutable
    scheduled: tvm.IRModule             # the module after kiln's pipeline (scheduled PrimFuncs)
    profile: object
    host: tvm.IRModule                  # after SplitHostDevice: the host code that launches each kernel
    artifact_source: str = ""          # the device source read back from the exported library

    def device_source(self) -> str:
        """The device module's source (OpenCL C, Metal, WGSL), as the artifact carries it."""
        host = self.executable.mod.imports[0]
        return host.imports[0].inspect_source()

    def func(self, name: str) -> tvm.tirx.PrimFunc:
        return self.scheduled[name]

    def prim_funcs(self) -> dict[str, tvm.tirx.PrimFunc]:
        return {gv.name_hint: f for gv, f in self.scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


@tvm.instrument.pass_instrument
class _Keep:
    """Keeps the module as it is after each of the named passes, by pass name."""

    def __init__(self, *names: str) -> None:
        self.names, self.mods = names, {}

    def run_after_pass(self, mod, info):
        if info.name in self.names:
            self.mods[info.name] = mod


_HOST = "tirx.SplitHostDevice"


def build(model_dir, target: str, quant: str, phase_passes=None, **fields) -> Built:
    """The preset built as `kiln compile` builds it (its phase passes replaced, and other profile
    `fields` set, if given)."""
    ex = export_model(CompileOptions(model=str(model_dir), target=target, quant=quant))
    if phase_passes is not None:
        fields["phase_passes"] = phase_passes
    profile = dataclasses.replace(ex.profile, **fields)
    keep = _Keep("kiln_pipeline", _HOST)
    with tvm.transform.PassContext(opt_level=3, instruments=[keep]):
        executable, _ = build_lib(ex.mod, profile)
    return Built(executable, keep.mods["kiln_pipeline"], profile, keep.mods[_HOST])


def build_prim_func(name: str, func: tvm.tirx.PrimFunc, target: str) -> Built:
    """One PrimFunc scheduled by a GPU preset's rules and compiled alone for its target (kernel
    NAME_kernel), for shapes the tiny model does not have."""
    from tvm.s_tir import dlight as dl

    from kiln.targets import get_profile
    from kiln.targets.gpu import gpu_schedule_rules

    profile = get_profile(target)
    mod = tvm.IRModule({name: func.with_attr("global_symbol", name)})
    with profile.tvm_target():
        mod = dl.ApplyDefaultSchedule(*gpu_schedule_rules())(mod)     # a scheduled func is kept as it is
    keep = _Keep(_HOST)
    with tvm.transform.PassContext(opt_level=3, instruments=[keep]):
        executable = tvm.compile(mod, target=profile.tvm_target())
    return Built(executable, mod, profile, keep.mods[_HOST], executable.mod.imports[0].inspect_source())


def buffers(func) -> list:
    return [p for p in func.params if hasattr(p, "shape") and not p.is_scalar()]


def is_q4_matmul(func, rows: str) -> bool:
    """A dequantize-matmul over 4-bit weights: (qweight uint32 [N, K/8], scale [N, K/32], x, out);
    rows "one": x is [1, 1, K] (single-sequence decode); "seq": x is [1, seq_len, K] (prefill);
    "batch": x is [batch_size, 1, K] (batch_decode, what the runtime calls every step)."""
    b = buffers(func)
    if len(b) != 4 or b[0].dtype != "uint32" or len(b[0].shape) != 2 or len(b[2].shape) != 3:
        return False
    k = int(b[0].shape[1]) * 8
    x = [str(d) for d in b[2].shape]
    if x[-1] != str(k) and x[-1] != f"T.int64({k})":
        return False
    one = all(isinstance(d, tvm.tirx.IntImm) and int(d) == 1 for d in b[2].shape[:2])
    seq = isinstance(b[2].shape[0], tvm.tirx.IntImm) and not isinstance(b[2].shape[1], tvm.tirx.IntImm)
    batch = not isinstance(b[2].shape[0], tvm.tirx.IntImm) and isinstance(b[2].shape[1], tvm.tirx.IntImm)
    return {"one": one, "seq": seq, "batch": batch}[rows]


def row_branches(func) -> list[tuple[int | None, tvm.tirx.PrimFunc]]:
    """The branches of a kernel that picks its schedule by its rows (targets/row_dispatch.py): its
    root holds `if rows <= R1: A elif rows <= R2: B else: C`, and TVM emits one device kernel per
    branch, named NAME_kernel, NAME_kernel_1, ... in that order. (R, the branch as a PrimFunc with
    func's params) per branch, R None for the last; [(None, func)] for a kernel without branches."""
    body = func.body
    if isinstance(body, tvm.s_tir.SBlockRealize):
        body = body.block.body
    out = []
    while isinstance(body, tvm.tirx.IfThenElse):
        cond = body.condition
        if isinstance(cond, tvm.ir.expr.Call) and cond.op.name == "tirx.tvm_thread_invariant":
            cond = cond.args[0]
        if not isinstance(cond, tvm.tirx.LE):
            return [(None, func)]               # not a row dispatch: a kernel's own branch
        out.append((int(cond.b), func.with_body(body.then_case)))
        body = body.else_case
    return out + [(None, func.with_body(body))] if out else [(None, func)]


def branch_kernel(name: str, index: int) -> str:
    """The device kernel TVM emits for branch `index` of PrimFunc NAME (one kernel per branch)."""
    return f"{name}_kernel" if index == 0 else f"{name}_kernel_{index}"


def _evaluate(expr: str, values: dict[str, int]) -> int:
    text = re.sub(r"T\.int(?:32|64)\((-?\d+)\)", r"\1", expr)
    return int(eval(text, {"__builtins__": {}}, dict(values)))  # noqa: S307 (TVMScript shape arithmetic)


def host_values(built: Built, name: str, values: dict[str, int]) -> dict[str, int]:
    """`values` and the scalars PrimFunc NAME's host code computes before a launch and passes to a
    kernel (TIR's common-subexpression variables such as `cse_v4 = (seq_len + 1) // 2`)."""
    out = dict(values)
    for m in re.finditer(r"^\s*(\w+): T\.let\[T\.int(?:32|64)\] = (.+)$", built.host[name].script(), re.M):
        try:
            out[m.group(1)] = _evaluate(m.group(2).replace("T.min(", "min(").replace("T.max(", "max("), out)
        except NameError:
            pass                                # a let over values this call does not have
    return out


def launch(func, values: dict[str, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(blocks, threads) per axis x, y, z, from the PrimFunc's thread bindings."""
    extents = {}
    for m in re.finditer(r'T\.thread_binding\((.+?), thread="((?:blockIdx|threadIdx)\.[xyz])"', func.script()):
        value = _evaluate(m.group(1), values)
        if extents.setdefault(m.group(2), value) != value:
            raise ValueError(f"{m.group(2)} bound to {extents[m.group(2)]} and {value} in one kernel")
    blocks = tuple(extents.get(f"blockIdx.{a}", 1) for a in "xyz")
    threads = tuple(extents.get(f"threadIdx.{a}", 1) for a in "xyz")
    return blocks, threads


def host_launches(built: Built, name: str, values: dict[str, int | float]) -> list[tuple[str, list, dict]]:
    """The kernel launches of PrimFunc NAME's host code in order, for a function without host-side
    branches (several kernels, a workspace): (kernel, its arguments: a buffer name or a number, the
    launch extents by thread tag). Element offsets are 0; other scalars come from `values` and the
    host code's lets."""
    values = host_values(built, name, values)
    out = []
    for m in re.finditer(r'T\.call_ffi_kernel\("(\w+)", (.*?), launch_params=\[(.*?)\]', built.host[name].script()):
        args = [a.strip() for a in m.group(2).split(",")]
        tags = [t.strip().strip('"') for t in m.group(3).split(",")]
        extents = [_evaluate(a, values) for a in args[len(args) - len(tags):]]
        resolved = []
        for a in args[:len(args) - len(tags)]:
            if a.endswith(".data"):
                resolved.append(re.sub(r"_\d+$", "", a.removesuffix(".data")))
            elif a.endswith(".elem_offset"):
                resolved.append(0)
            else:
                resolved.append(values[a] if a in values else _evaluate(a, values))
        out.append((m.group(1), resolved, dict(zip(tags, extents))))
    return out


def shape_values(func, arrays: dict[str, np.ndarray]) -> dict[str, int]:
    """Symbolic sizes read off the arrays given for the buffers (elem offsets are 0)."""
    values: dict[str, int] = {}
    for b in buffers(func):
        offset = str(b.elem_offset)
        if offset.isidentifier():
            values[offset] = 0
        if b.name not in arrays:
            continue
        if len(b.shape) != arrays[b.name].ndim:
            raise ValueError(f"{b.name}: {arrays[b.name].shape} for a {len(b.shape)}-d buffer")
        for dim, size in zip(b.shape, arrays[b.name].shape):
            if str(dim).isidentifier():
                values[str(dim)] = size
    for b in buffers(func):
        if b.name in arrays:
            want = tuple(_evaluate(str(d), values) for d in b.shape)
            if want != arrays[b.name].shape:
                raise ValueError(f"{b.name}: shape {arrays[b.name].shape}, the kernel expects {want}")
    return values


_KERNEL_SIG = r"__kernel void {name}\((?P<args>[^)]*)\)\s*\{{"


def kernel_args(source: str, name: str) -> list[tuple[str, str]]:
    """(kind, name) per argument of an OpenCL kernel: ("buffer", buffer name) or (c type, scalar name)."""
    m = re.search(_KERNEL_SIG.format(name=re.escape(name)), source)
    if m is None:
        raise ValueError(f"kernel {name} is not in the source")
    out = []
    for arg in m.group("args").split(","):
        words = arg.replace("*", " * ").split()
        if "*" in words:
            out.append(("buffer", words[-1].removesuffix("_ptr")))
        else:
            out.append((words[-2], words[-1]))
    return out


def cuda_kernels(source: str) -> dict[str, tuple[int, str]]:
    """{kernel: (threads it is launched with, its body)} of TVM's generated CUDA source."""
    found = re.findall(r"__launch_bounds__\((\d+)\) (\w+)\([^;{]*\{\n(.*?)\n}\n", source, re.S)
    return {name: (int(threads), body) for threads, name, body in found}


def kernel_chunk(source: str, name: str) -> str:
    """The part of TVM's per-kernel source (sections start with `// Function: NAME`) for one kernel."""
    parts = re.split(r"^// Function: ", source, flags=re.M)
    for part in parts:
        if part.startswith(name + "\n"):
            return "// Function: " + part
    raise ValueError(f"no section for {name}")


def soft_cap(s, softcap: float | None):
    """Gemma 2's attention logit soft-cap, c tanh(s / c), on scaled scores (None: none)."""
    return s if softcap is None else softcap * np.tanh(s / softcap)


def reference_attention(q, pages, indptr, values, last_len, page_size, sm_scale, window=None, softcap=None):
    """Decode attention over a paged KV cache, in numpy: (output [B, H, D], lse [B, H] base 2).
    `window`: (offsets, sinks) per sequence for the sliding-window kernels, which attend to the
    first `sink` tokens and those from `offset` on; `softcap`: scores soft-capped. A sequence
    without tokens: output 0 and lse -5e4, as TVM's kernels write them."""
    b_count, h_qo, _ = q.shape
    h_kv = pages.shape[2]
    out = np.zeros_like(q)
    lse = np.full((b_count, h_qo), -5e4, np.float32)
    for b in range(b_count):
        seq_pages = values[indptr[b]:indptr[b + 1]]
        if len(seq_pages) == 0:
            continue
        length = (len(seq_pages) - 1) * page_size + last_len[b]
        keep = np.arange(length)
        if window is not None:
            keep = np.r_[0:window[1][b], window[0][b]:length]
        k = np.concatenate([pages[p, 0] for p in seq_pages], axis=1)[:, keep]   # [H_kv, L, D]
        v = np.concatenate([pages[p, 1] for p in seq_pages], axis=1)[:, keep]
        for h in range(h_qo):
            kv = h // (h_qo // h_kv)
            s = soft_cap((k[kv] @ q[b, h]) * sm_scale, softcap)
            w = np.exp(s - s.max())
            out[b, h] = (w / w.sum()) @ v[kv]
            lse[b, h] = (s.max() + np.log(w.sum())) / np.log(2)
    return out, lse


def nvcc_compiles(source: str, tmp_path) -> None:
    """nvcc turns generated CUDA into sm_90 code (TVM's own build here only generates the source: a
    float32x8 constant once generated CUDA that nvcc refused). Nothing checked without nvcc."""
    if shutil.which("nvcc") is None:
        return
    (tmp_path / "k.cu").write_text(source)
    done = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-O3", "-w", "-o", str(tmp_path / "k.cubin"),
                           str(tmp_path / "k.cu")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def reference_prefill(q, k, v, q_indptr, kv_indptr, causal: bool, sm_scale: float, softcap=None):
    """Each query token's attention over its sequence's keys (the last len(q) of them are the
    queries' own: causal lets token p see keys up to kv_len - q_len + p), in float64; lse base 2;
    `softcap`: scores soft-capped."""
    h_qo, h_kv = q.shape[1], k.shape[1]
    out, lse = np.zeros(q.shape), np.zeros(q.shape[:2])
    for b in range(len(q_indptr) - 1):
        q_len, kv_len = q_indptr[b + 1] - q_indptr[b], kv_indptr[b + 1] - kv_indptr[b]
        for p in range(q_len):
            seen = kv_len - q_len + p + 1 if causal else kv_len
            for h in range(h_qo):
                keys = k[kv_indptr[b]:kv_indptr[b] + seen, h // (h_qo // h_kv)].astype(np.float64)
                vals = v[kv_indptr[b]:kv_indptr[b] + seen, h // (h_qo // h_kv)].astype(np.float64)
                s = soft_cap(keys @ q[q_indptr[b] + p, h].astype(np.float64) * sm_scale, softcap)
                w = np.exp(s - s.max())
                out[q_indptr[b] + p, h] = w @ vals / w.sum()
                lse[q_indptr[b] + p, h] = (s.max() + np.log(w.sum())) / np.log(2)
    return out, lse
