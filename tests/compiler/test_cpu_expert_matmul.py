"""targets/cpu/expert_matmul.py: MoE expert matmuls with the tokens grouped by expert. Kernels written as
models/moe.py emits them (expert_matmul_te over kiln's dequantize of each format, with the router weight's
multiply fused after, or a float16 cast), scheduled by GroupedExpertMatmul for this machine's CPU and run at
1 token (RowReduction's branch), 5 (a few slots an expert) and 40 (several passes of SLOTS and the rest)
against numpy's float64 product of the same dequantized planes; and what the match turns away."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import te, tirx

from kiln.compiler.quant_modules import QuantFormat, dequantize_element
from kiln.compiler.quant_pack import dequantize
from kiln.models.moe import expert_matmul_te
from kiln.targets.cpu.expert_matmul import GroupedExpertMatmul, match_expert_matmul
from kiln.targets.cpu.rowwise import RowReduction
from kiln.targets.cpu.schedule import CPUKnobs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from bench_cpu_gemv import random_planes  # noqa: E402

pytestmark = pytest.mark.compiler

TARGET = {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
          "mattr": ["-amx-tile", "-amx-int8", "-amx-bf16"], "num-cores": 2}
EXPERTS, TOP_K, ROWS, DEPTH = 8, 2, 12, 128


def _i64(v: int):
    return tirx.const(v, "int64")


def expert_func(kind: str | None, per_slot: bool = False, epilogue: str = "weigh", scale_dtype: str = "float16",
                tokens=None, group: int = 32, element_dtype: str = "float32"):
    """(PrimFunc, format) of one expert matmul as models/moe.py writes it: kind None is a float32 weight
    (q0f32), else kiln's `kind` planes; x [T, depth] (or [T, k, depth]: Llama 4's per-slot input); then
    `epilogue`: "weigh" (times the slot's router weight, as the down projection fuses), "cast" (float16
    sums, a float16 scheme's), or "none". `tokens`: a count (static), else symbolic. `element_dtype`: the dtype the
    dequantize computes in (float16 where the target's CPU has float16 arithmetic: AArch64's, Android's)."""
    tokens = tirx.Var("tokens", "int64") if tokens is None else _i64(tokens)
    n = EXPERTS * ROWS
    x = te.placeholder((tokens, _i64(TOP_K), _i64(DEPTH)) if per_slot else (tokens, _i64(DEPTH)), "float32", name="x")
    experts = te.placeholder((tokens, _i64(TOP_K)), "int32", name="experts")
    if kind is None:
        fmt, planes = None, [te.placeholder((_i64(n), _i64(DEPTH)), "float32", name="weight")]
        element = lambda row, r: planes[0][row, r]                                         # noqa: E731
    else:
        fmt = QuantFormat(kind, group, scale_dtype)
        planes = [te.placeholder(tuple(_i64(d) for d in shape), dtype, name=name)
                  for name, (shape, dtype) in fmt.planes(n, DEPTH).items()]
        element = lambda row, r: dequantize_element(fmt, element_dtype, *(planes + [None, None])[:3], row,  # noqa: E731
                                                    r)
    out = expert_matmul_te(x, element, experts, ROWS)
    args = [x, experts, *planes]
    if epilogue == "weigh":
        weights = te.placeholder((tokens, _i64(TOP_K), _i64(1)), "float32", name="weights")
        out = te.compute(out.shape, lambda t, j, c: out[t, j, c] * weights[t, j, 0], name="T_multiply")
        args.append(weights)
    elif epilogue == "cast":
        out = te.compute(out.shape, lambda t, j, c: out[t, j, c].astype("float16"), name="expert_matmul_cast")
    return te.create_prim_func([*args, out]), fmt


def build(func, lanes: int = 16):
    target = tvm.target.Target(TARGET)
    knobs = CPUKnobs(vector_lanes=lanes)
    with target:
        sch = GroupedExpertMatmul(knobs, few=RowReduction(knobs)).apply(func, target, False)
    assert sch is not None, "GroupedExpertMatmul did not take the expert matmul"
    return sch.mod["main"], tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=target)


def run(lib, func, fmt, tokens: int, per_slot: bool, epilogue: str, seed: int = 0):
    """(kiln's output, numpy float64's) for `tokens` tokens routed at random (distinct experts a token)."""
    rng = np.random.default_rng(seed + tokens)
    n = EXPERTS * ROWS
    if fmt is None:
        planes = {"weight": rng.standard_normal((n, DEPTH)).astype(np.float32)}
        w = planes["weight"].astype(np.float64)
    else:
        planes = random_planes(fmt, n, DEPTH, rng)
        w = dequantize(fmt, planes).astype(np.float64)
    x = rng.standard_normal((tokens, TOP_K, DEPTH) if per_slot else (tokens, DEPTH)).astype(np.float32)
    experts = np.stack([rng.permutation(EXPERTS)[:TOP_K] for _ in range(tokens)]).astype(np.int32)
    xs = x if per_slot else np.repeat(x[:, None], TOP_K, axis=1)
    want = np.einsum("tjr,tjcr->tjc", xs.astype(np.float64), w.reshape(EXPERTS, ROWS, DEPTH)[experts])
    inputs = [x, experts, *planes.values()]
    if epilogue == "weigh":
        weights = rng.random((tokens, TOP_K, 1)).astype(np.float32)
        want = want * weights
        inputs.append(weights)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros((tokens, TOP_K, ROWS), "float16" if epilogue == "cast" else "float32"), dev)
    lib(*[tvm.runtime.tensor(a, dev) for a in inputs], out)
    return out.numpy().astype(np.float64), want


CASES = [("q4", False, "weigh"), ("q4m", False, "none"), ("q8", False, "weigh"), ("q8m", False, "none"),
         ("f16", False, "none"), ("bf16", False, "weigh"), (None, False, "weigh"), ("q4", True, "none"),
         ("q4", False, "cast")]


@pytest.mark.parametrize("kind,per_slot,epilogue", CASES,
                         ids=[f"{k or 'f32'}{'-per-slot' if p else ''}-{e}" for k, p, e in CASES])
def test_grouped_expert_matmul_matches_numpy(kind, per_slot, epilogue):
    func, fmt = expert_func(kind, per_slot, epilogue)
    scheduled, lib = build(func)
    script = scheduled.script()
    assert '"grouped"' in script and '"few_slots"' in script, "no branch for a slot an expert or fewer"
    gemv = kind is not None                     # quant_gemv's GEMV where it takes the format, else RowReduction
    few = script[script.index('"few_slots"'):script.index('"grouped"')]
    assert ("ax0_ax1_fused in T.parallel(tokens" in few) != gemv, "RowReduction's parallel loop over the outputs"
    assert ("po in T.parallel(tokens" in few) == gemv, "the GEMV's one parallel loop over every part's outputs"
    # 4-bit codes: the tile decoded from the code bytes' nibbles, x read through its copy in their order
    assert ('"uint8"' in script.split('"grouped"')[1]) == (kind in ("q4", "q4m"))
    for tokens in (1, 3, 5, 40):                # 1, 3: a slot an expert or fewer (6 slots, 8 experts); 5, 40: grouped
        got, want = run(lib, func, fmt, tokens, per_slot, epilogue)
        tol = 2e-2 if epilogue == "cast" else 1e-4
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max(),
                                   err_msg=f"{tokens} tokens")


@pytest.mark.parametrize("kind", ["q4", "q4m"])
def test_float32_scales_take_the_nibble_decode(kind):
    """kiln's own 4-bit formats (float32 scales and mins, a q4f32 conversion's) read them in place."""
    func, fmt = expert_func(kind, scale_dtype="float32")
    _, lib = build(func)
    for tokens in (5, 40):
        got, want = run(lib, func, fmt, tokens, False, "weigh")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=f"{tokens} tokens")


@pytest.mark.parametrize("kind", ["q4", "q8"])
@pytest.mark.parametrize("lanes", [16, 8])
def test_a_float16_dequantize_takes_the_grouped_kernel(kind, lanes):
    """The dequantize in float16 (AArch64's and Android's q4f16: their CPUs compute in it), its float16 scales read
    through the tile's float32 copies: the grouped kernel writes (its value widened to float32, as the function's own
    product takes it) where it fell back to RowReduction before, and gives numpy's product to float16's rounding of
    each weight."""
    func, fmt = expert_func(kind, element_dtype="float16")
    scheduled, lib = build(func, lanes=lanes)
    assert '"grouped"' in scheduled.script()
    for tokens in (1, 5, 40):
        got, want = run(lib, func, fmt, tokens, False, "weigh")
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max(), err_msg=f"{tokens} tokens")


def test_q6_k_experts_take_the_gemv():
    """8-bit codes in groups of 16 (GGUF's Q6_K as stored): the GEMV at a slot an expert, the grouped
    kernel's generic decode past it."""
    func, fmt = expert_func("q8", group=16)
    scheduled, lib = build(func)
    script = scheduled.script()
    assert "po in T.parallel(tokens" in script[script.index('"few_slots"'):script.index('"grouped"')]
    for tokens in (1, 3, 5, 40):
        got, want = run(lib, func, fmt, tokens, False, "weigh")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=f"{tokens} tokens")


@pytest.mark.parametrize("kind", ["q4", None], ids=["q4", "f32"])
def test_eight_lane_targets_never_branch_to_row_reduction(kind):
    """AVX2's 8 lanes: a branch to RowReduction would share vector constants with the grouped kernel's
    body (module docstring), so a format the GEMV does not take (float32 weights) takes the grouped kernel
    at every count, which is right at one token too; q4 keeps the GEMV's branch."""
    func, fmt = expert_func(kind)
    scheduled, lib = build(func, lanes=8)
    script = scheduled.script()
    before = script.split('"grouped"')[0]       # the branch for a slot an expert, if any
    assert "ax0_ax1_fused in T.parallel(tokens" not in before and ('"few_slots"' in script) == (kind is not None)
    for tokens in (1, 40):
        got, want = run(lib, func, fmt, tokens, False, "weigh")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_the_match_turns_away_other_kernels():
    func, _ = expert_func("q4")
    assert match_expert_matmul(func) is not None
    # a plain matmul named like one, its weight not read through the router's choice
    tokens = tirx.Var("tokens", "int64")
    x = te.placeholder((tokens, _i64(DEPTH)), "float32", name="x")
    w = te.placeholder((_i64(ROWS), _i64(DEPTH)), "float32", name="w")
    r = te.reduce_axis((0, _i64(DEPTH)), name="r")
    plain = te.compute((tokens, _i64(1), _i64(ROWS)), lambda t, j, c: te.sum(x[t, r] * w[c, r], axis=r),
                       name="expert_matmul")
    assert match_expert_matmul(te.create_prim_func([x, w, plain])) is None
    # a static token count (the single-sequence decode entry): RowReduction's alone
    one, _ = expert_func("q4", tokens=1)
    target = tvm.target.Target(TARGET)
    with target:
        assert GroupedExpertMatmul(CPUKnobs(), few=RowReduction(CPUKnobs())).apply(one, target, False) is None
