"""CPU schedule rules: every kernel of a small nn.Module gets scheduled (parallel + vectorised
loops), and the compiled module matches numpy at 1, 7 and 128 rows in float32 and float16."""

from __future__ import annotations

import platform

import numpy as np
import pytest
import tvm
import tvm.s_tir.dlight as dl
from tvm import relax, tirx
from tvm.relax.backend.cpu_generic import pipeline as cpu_pipeline
from tvm.relax.frontend import nn

from kiln.compiler.pipeline import legalize_passes
from kiln.targets.cpu.schedule import (
    CPUKnobs,
    Matmul,
    cpu_schedule_rules,
    vector_lanes_for_target,
)
from kiln.targets.cpu.rowwise import Elementwise, RowReduction

pytestmark = pytest.mark.compiler

HIDDEN, OUT, VOCAB = 64, 96, 80
ROWS = (1, 7, 128)
TOLERANCE = {"float32": 1e-4, "float16": 2e-2}  # max abs error / max(1, max |reference|)


@pytest.fixture(scope="module")
def target() -> tvm.target.Target:
    return tvm.target.Target(
        {
            "kind": "llvm",
            "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
            "mattr": ["-amx-tile", "-amx-int8", "-amx-bf16"],  # AMX faults on these hosts
            "num-cores": 2,
        }
    )


def compile_cpu(
    mod: tvm.IRModule, target: tvm.target.Target, rules: list
) -> tuple[tvm.IRModule, relax.VirtualMachine]:
    """The CPU pipeline: fuse, schedule with ``rules``, lower, build. Returns the scheduled
    module (for inspection) and a VM."""
    with target:
        mod = tvm.transform.Sequential(
            [
                relax.transform.FuseTransposeMatmul(),
                *legalize_passes(),
                dl.ApplyDefaultSchedule(*rules),
            ]
        )(mod)
        scheduled = mod
        mod = tvm.transform.Sequential(
            cpu_pipeline.dataflow_lower_passes(target) + cpu_pipeline.finalize_passes(target)
        )(mod)
    executable = relax.build(mod, target=target, relax_pipeline=None)
    return scheduled, relax.VirtualMachine(executable, tvm.cpu())


def prim_funcs(mod: tvm.IRModule) -> dict[str, tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def loop_kinds(func: tirx.PrimFunc) -> set:
    """ForKind of every loop in a (scheduled, block-level) PrimFunc."""
    kinds, stack = set(), [func.body]
    while stack:
        node = stack.pop()
        if isinstance(node, tirx.For):
            kinds.add(node.kind)
        for field in ("body", "block", "init", "then_case", "else_case"):
            child = getattr(node, field, None)
            if isinstance(child, tirx.Stmt):
                stack.append(child)
        stack.extend(getattr(node, "seq", []))
    return kinds


def assert_close(actual: np.ndarray, reference: np.ndarray, dtype: str, what: str) -> None:
    scale = max(1.0, float(np.abs(reference).max()))
    err = float(np.abs(actual.astype("float64") - reference).max())
    assert err <= TOLERANCE[dtype] * scale, f"{what}: max abs error {err:.3g} (scale {scale:.3g})"


class LinearNormBlock(nn.Module):
    """Linear + residual (NT matmul with epilogue), RMSNorm, softmax, silu * mul."""

    def __init__(self, dtype: str) -> None:
        self.proj = nn.Linear(HIDDEN, OUT, bias=False, dtype=dtype)
        self.norm_weight = nn.Parameter((OUT,), dtype)

    def forward(self, x: nn.Tensor, residual: nn.Tensor):
        h = self.proj(x) + residual  # h: [1, m, OUT]
        normed = nn.op.rms_norm(h, self.norm_weight, axes=[-1], epsilon=1e-5)
        return normed, nn.op.softmax(h, axis=-1), nn.op.silu(h) * h


def block_spec(rows: int | str, dtype: str) -> dict:
    x, residual = nn.spec.Tensor([1, rows, HIDDEN], dtype), nn.spec.Tensor([1, rows, OUT], dtype)
    return {"forward": {"x": x, "residual": residual}}


def block_reference(x, residual, weight, norm_weight):
    h = x.astype("float64") @ weight.T.astype("float64") + residual
    normed = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-5) * norm_weight
    e = np.exp(h - h.max(-1, keepdims=True))
    return normed, e / e.sum(-1, keepdims=True), h / (1 + np.exp(-h)) * h


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_block_scheduled_and_matches_numpy(target, dtype):
    mod, _ = LinearNormBlock(dtype).export_tvm(spec=block_spec("m", dtype))
    scheduled, vm = compile_cpu(mod, target, cpu_schedule_rules())

    funcs = prim_funcs(scheduled)
    assert {"fused_NT_matmul_add", "rms_norm", "softmax", "fused_silu_multiply"} <= set(funcs)
    for name, func in funcs.items():
        assert func.attrs.get("tirx.is_scheduled", False), f"{name} was left unscheduled"
        kinds = loop_kinds(func)
        assert tirx.ForKind.PARALLEL in kinds, f"{name} has no parallel loop"
        assert tirx.ForKind.VECTORIZED in kinds, f"{name} has no vectorized loop"
    assert tirx.ForKind.UNROLLED in loop_kinds(funcs["fused_NT_matmul_add"])  # register tile

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((OUT, HIDDEN)) / 8).astype(dtype)
    norm_weight = rng.standard_normal(OUT).astype(dtype)
    for m in ROWS:
        x = rng.standard_normal((1, m, HIDDEN)).astype(dtype)
        residual = rng.standard_normal((1, m, OUT)).astype(dtype)
        outs = vm["forward"](*[tvm.runtime.tensor(a) for a in (x, residual, weight, norm_weight)])
        refs = block_reference(x, residual, weight, norm_weight)
        for what, out, ref in zip(("rms_norm", "softmax", "silu*mul"), outs, refs):
            assert_close(out.numpy(), ref, dtype, f"{what} at m={m}")


def test_rows_in_several_l2_blocks_match_numpy(target, monkeypatch):
    """Matmul's rows in blocks of activations that fit in L2 (A_BLOCK_BYTES): here 8 rows, so 37 rows
    are four blocks and a part, and 128 sixteen."""
    from kiln.targets.cpu import schedule
    monkeypatch.setattr(schedule, "A_BLOCK_BYTES", 8 * HIDDEN * 4)
    assert schedule.row_block(HIDDEN, 2) == 8
    mod, _ = LinearNormBlock("float32").export_tvm(spec=block_spec("m", "float32"))
    _, vm = compile_cpu(mod, target, cpu_schedule_rules())
    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((OUT, HIDDEN)) / 8).astype("float32")
    norm_weight = rng.standard_normal(OUT).astype("float32")
    for m in (7, 37, 128):
        x = rng.standard_normal((1, m, HIDDEN)).astype("float32")
        residual = rng.standard_normal((1, m, OUT)).astype("float32")
        outs = vm["forward"](*[tvm.runtime.tensor(a) for a in (x, residual, weight, norm_weight)])
        for what, out, ref in zip(("rms_norm", "softmax", "silu*mul"), outs,
                                  block_reference(x, residual, weight, norm_weight)):
            assert_close(out.numpy(), ref, "float32", f"{what} at m={m}")


def test_static_single_row_decode_shapes(target):
    """A decode entry with static [1, 1, H] inputs: the matmul is a GEMV with no row axis."""
    mod, _ = LinearNormBlock("float32").export_tvm(spec=block_spec(1, "float32"))
    scheduled, vm = compile_cpu(mod, target, cpu_schedule_rules())
    funcs = prim_funcs(scheduled)
    for name, func in funcs.items():
        assert func.attrs.get("tirx.is_scheduled", False), f"{name} was left unscheduled"
        assert tirx.ForKind.VECTORIZED in loop_kinds(func), f"{name} has no vectorized loop"
    assert tirx.ForKind.PARALLEL in loop_kinds(funcs["fused_NT_matmul_add"])  # W rows split over cores

    rng = np.random.default_rng(4)
    shapes = ((1, 1, HIDDEN), (1, 1, OUT), (OUT, HIDDEN), (OUT,))  # x, residual, weight, norm weight
    args = [rng.standard_normal(shape).astype("float32") for shape in shapes]
    outs = vm["forward"](*[tvm.runtime.tensor(a) for a in args])
    for what, out, ref in zip(("rms_norm", "softmax", "silu*mul"), outs, block_reference(*args)):
        assert_close(out.numpy(), ref, "float32", what)


def test_matmul_accumulators_stay_off_the_heap(target):
    """The register tile must lower to a stack array (SROA'd into registers), not a
    TVMBackendAllocWorkspace block per tile, which made in-model matmuls 2.5x slower."""
    mod, _ = LinearNormBlock("float32").export_tvm(spec=block_spec("m", "float32"))
    scheduled, _ = compile_cpu(mod, target, cpu_schedule_rules())
    func = prim_funcs(scheduled)["fused_NT_matmul_add"].with_attr("global_symbol", "main")
    llvm_ir = tvm.compile(tvm.IRModule({"main": func}), target=target).mod.inspect_source("ll")
    assert "load ptr, ptr @__TVMBackendAllocWorkspace" not in llvm_ir


class EmbeddingHeads(nn.Module):
    """take (embedding), tied LM head matmul(x, permute_dims(E)) and an NN matmul x @ W."""

    def __init__(self) -> None:
        self.embed = nn.Embedding(VOCAB, HIDDEN, dtype="float32")
        self.w_nn = nn.Parameter((HIDDEN, 48), "float32")

    def forward(self, ids: nn.Tensor, x: nn.Tensor):
        logits = nn.op.matmul(x, nn.op.permute_dims(self.embed.weight))  # [b, m, VOCAB]
        return self.embed(ids), logits, nn.op.matmul(x, self.w_nn)


def test_embedding_tied_head_and_nn_matmul(target):
    ids, x = nn.spec.Tensor([1, "m"], "int32"), nn.spec.Tensor(["b", "m", HIDDEN], "float32")
    spec = {"forward": {"ids": ids, "x": x}}
    mod, _ = EmbeddingHeads().export_tvm(spec=spec)
    scheduled, vm = compile_cpu(mod, target, cpu_schedule_rules())
    funcs = prim_funcs(scheduled)
    for name, func in funcs.items():  # the reshapes of ids have no static axis to vectorise
        assert func.attrs.get("tirx.is_scheduled", False), f"{name} was left unscheduled"
    for name in ("take", "NT_matmul", "matmul"):
        assert {tirx.ForKind.PARALLEL, tirx.ForKind.VECTORIZED} <= loop_kinds(funcs[name]), name

    rng = np.random.default_rng(1)
    table = rng.standard_normal((VOCAB, HIDDEN)).astype("float32")
    w_nn = rng.standard_normal((HIDDEN, 48)).astype("float32")
    for b, m in ((1, 1), (3, 1), (1, 7), (2, 128)):  # decode batches and prefill
        ids = rng.integers(0, VOCAB, (1, m)).astype("int32")
        x = rng.standard_normal((b, m, HIDDEN)).astype("float32")
        rows, logits, y = vm["forward"](*[tvm.runtime.tensor(a) for a in (ids, x, table, w_nn)])
        np.testing.assert_array_equal(rows.numpy(), table[ids])
        assert_close(logits.numpy(), x.astype("float64") @ table.T, "float32", f"tied head b={b} m={m}")
        assert_close(y.numpy(), x.astype("float64") @ w_nn, "float32", f"NN matmul b={b} m={m}")


class ColumnSum(nn.Module):
    """A reduction over the row axis: no rule matches it."""

    def forward(self, x: nn.Tensor):
        return nn.op.sum(x, axis=1)  # [1, HIDDEN]


def test_unmatched_function_left_alone_and_builds(target):
    mod, _ = ColumnSum().export_tvm(spec={"forward": {"x": nn.spec.Tensor([1, "m", HIDDEN], "float32")}})
    scheduled, vm = compile_cpu(mod, target, cpu_schedule_rules())
    (func,) = prim_funcs(scheduled).values()
    assert not func.attrs.get("tirx.is_scheduled", False)
    x = np.random.default_rng(2).standard_normal((1, 7, HIDDEN)).astype("float32")
    out = vm["forward"](tvm.runtime.tensor(x)).numpy()
    assert_close(out, x.astype("float64").sum(1), "float32", "column sum")


def test_scheduled_function_is_skipped(target):
    mod, _ = LinearNormBlock("float32").export_tvm(spec=block_spec("m", "float32"))
    with target:
        fuse = [relax.transform.LegalizeOps(), relax.transform.FuseOps(), relax.transform.FuseTIR()]
        mod = tvm.transform.Sequential(fuse)(mod)
    rules = cpu_schedule_rules()
    for name, func in prim_funcs(mod).items():
        assert any(rule.apply(func, target, False) is not None for rule in rules), name
        marked = func.with_attr("tirx.is_scheduled", True)
        assert all(rule.apply(marked, target, False) is None for rule in rules), name


def test_knobs_and_rule_order(target):
    rules = cpu_schedule_rules()
    assert [type(r) for r in rules] == [Matmul, RowReduction, Elementwise]
    assert all(r.knobs.vector_lanes == 16 for r in rules)
    assert cpu_schedule_rules(vector_lanes=8)[0].knobs == CPUKnobs(vector_lanes=8, tile_m=2, tile_n=4)
    assert vector_lanes_for_target(target) in (8, 16)  # AVX2 or AVX-512 host
    with pytest.raises(ValueError, match="tile_m"):
        CPUKnobs(tile_m=0)
    with pytest.raises(ValueError, match="power of two"):
        CPUKnobs(vector_lanes=12)
    with pytest.raises(ValueError, match="spill"):
        CPUKnobs(tile_m=6, tile_n=8)
    with pytest.raises(ValueError, match="conflicts"):
        cpu_schedule_rules(vector_lanes=8, knobs=CPUKnobs(vector_lanes=4))


def test_vector_lanes_follow_the_cpu():
    """The lanes come from the CPU's features (TVM's llvm_get_vector_width says 512 bits for every x86
    CPU): AVX2 CPUs and the portable AVX2 build get 8 float32 lanes, AVX-512 16, NEON 4; this host
    the width its /proc/cpuinfo flags say."""
    from kiln.targets.cpu import _host_cpu_flags, aarch64_profile, cpu_profile, x86_64_profile

    def lanes(spec):
        return vector_lanes_for_target(tvm.target.Target(spec))

    x86 = {"kind": "llvm", "mtriple": "x86_64-pc-linux-gnu"}
    assert [lanes({**x86, "mcpu": cpu}) for cpu in ("haswell", "znver3", "znver4", "skylake-avx512")] == [8, 8, 16, 16]
    assert lanes({**x86, "mcpu": "znver4", "mattr": ["-avx512f"]}) == 8
    assert vector_lanes_for_target(x86_64_profile("x86-64-v3").tvm_target()) == 8
    assert vector_lanes_for_target(x86_64_profile("x86-64-avx512").tvm_target()) == 16
    assert vector_lanes_for_target(aarch64_profile().tvm_target()) == 4
    if platform.machine() in ("x86_64", "AMD64"):
        flags = _host_cpu_flags()
        want = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
        assert vector_lanes_for_target(cpu_profile().tvm_target()) == want


def test_avx2_sized_knobs_still_correct(target):
    """Other tile shapes (AVX2 lanes, a ragged 3-row tile) keep the numerics."""
    knobs = CPUKnobs(vector_lanes=8, tile_m=3, tile_n=4, unroll_k=2)
    mod, _ = LinearNormBlock("float32").export_tvm(spec=block_spec("m", "float32"))
    _, vm = compile_cpu(mod, target, cpu_schedule_rules(knobs=knobs))
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((OUT, HIDDEN)).astype("float32")
    norm_weight = rng.standard_normal(OUT).astype("float32")
    for m in (1, 5):
        x = rng.standard_normal((1, m, HIDDEN)).astype("float32")
        residual = rng.standard_normal((1, m, OUT)).astype("float32")
        outs = vm["forward"](*[tvm.runtime.tensor(a) for a in (x, residual, weight, norm_weight)])
        refs = block_reference(x, residual, weight, norm_weight)
        for what, out, ref in zip(("rms_norm", "softmax", "silu*mul"), outs, refs):
            assert_close(out.numpy(), ref, "float32", f"{what} at m={m}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_outer_product_form_matches_numpy(target, monkeypatch, dtype):
    """knobs.outer (not the float rule's default; `kiln tune` tries it): A packed into panels of 16 rows,
    each weight broadcast against 2 vectors of 8 rows, the residual add at the tile; rows padded to
    whole panels (1 and 7 of 16, 37 of 48), in L2 blocks of 16 rows here (128: eight blocks)."""
    from kiln.targets.cpu import schedule
    monkeypatch.setattr(schedule, "A_BLOCK_BYTES", 16 * HIDDEN * 4)
    knobs = CPUKnobs(vector_lanes=8, tile_m=2, tile_n=4, outer=True)
    mod, _ = LinearNormBlock(dtype).export_tvm(spec=block_spec("m", dtype))
    scheduled, vm = compile_cpu(mod, target, cpu_schedule_rules(knobs=knobs))
    assert "% T.int64(16)] = " in prim_funcs(scheduled)["fused_NT_matmul_add"].script()     # A in panels
    rng = np.random.default_rng(4)
    weight = (rng.standard_normal((OUT, HIDDEN)) / 8).astype(dtype)
    norm_weight = rng.standard_normal(OUT).astype(dtype)
    for m in (1, 7, 37, 128):
        x = rng.standard_normal((1, m, HIDDEN)).astype(dtype)
        residual = rng.standard_normal((1, m, OUT)).astype(dtype)
        outs = vm["forward"](*[tvm.runtime.tensor(a) for a in (x, residual, weight, norm_weight)])
        for what, out, ref in zip(("rms_norm", "softmax", "silu*mul"), outs,
                                  block_reference(x, residual, weight, norm_weight)):
            assert_close(out.numpy(), ref, dtype, f"{what} at m={m}")


def test_elementwise_keeps_a_table_read_by_every_head(target):
    """models/rope.py's cos / sin tables ([positions, dims / 2]) are read by every head: Elementwise keeps
    such a block apart (computed once per position) instead of inlining a libm call per element; a
    one-to-one exp is inlined as before. Both compute the same numbers."""
    from kiln.models.rope import apply_rope

    class Rope(nn.Module):
        def forward(self, x: nn.Tensor, pos: nn.Tensor):
            return apply_rope(x, pos, np.float32(1.0) / np.float32(1e4) ** (np.arange(0, 16, 2) / 16), 1.0)

    spec = {"forward": {"x": nn.spec.Tensor([1, "s", 4, 16], "float32"), "pos": nn.spec.Tensor(["s"], "int32")}}
    scheduled, vm = compile_cpu(Rope().export_tvm(spec=spec)[0], target, cpu_schedule_rules())
    (func,) = prim_funcs(scheduled).values()
    text = func.script()
    assert 'T.sblock("rope_cos")' in text and 'T.sblock("rope_sin")' in text, text
    x = np.random.default_rng(3).standard_normal((1, 9, 4, 16)).astype("float32")
    pos = np.arange(100, 109, dtype="int32")
    got = vm["forward"](tvm.runtime.tensor(x), tvm.runtime.tensor(pos)).numpy()
    angle = pos[:, None].astype(np.float64) * (1.0 / 1e4 ** (np.arange(0, 16, 2) / 16))[None, :]
    cos, sin = np.concatenate([np.cos(angle)] * 2, -1)[:, None], np.concatenate([np.sin(angle)] * 2, -1)[:, None]
    rotated = np.concatenate([-x[..., 8:], x[..., :8]], -1)
    assert_close(got, x * cos + rotated * sin, "float32", "rope")

    from tvm import te
    x = te.placeholder((4, 32), "float32", name="x")
    e = te.compute((4, 32), lambda i, j: tirx.exp(x[i, j]), name="e")          # read once per output
    y = te.compute((4, 32), lambda i, j: e[i, j] + x[i, j], name="y")
    with target:
        sch = Elementwise().apply(te.create_prim_func([x, y]), target, False)
    assert 'T.sblock("e")' not in sch.mod["main"].script()
