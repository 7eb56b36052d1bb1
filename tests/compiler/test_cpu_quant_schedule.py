"""QuantMatmul (targets/cpu/quant_schedule.py) on a float16 scheme's kernel: q4 codes dequantized in
float16, summed in float32, cast back to float16 (the cast a third block). It used to take the pair
of blocks only, so q4f16 on a CPU ran this kernel unscheduled (SmolLM2's prefill ~5x slower than
scheduled); now it is scheduled, and matches numpy at one row (the GEMV branch) and at several (the
tiled branch)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from kiln.compiler.quant_pack import pack_nibbles
from kiln.targets.cpu.quant_schedule import GEMV_TILE_N, MATMUL_TILES, QuantMatmul, default_knobs, gemv_tile_n
from kiln.targets.cpu.schedule import CPUKnobs

pytestmark = pytest.mark.compiler

N, K = 64, 128


@T.prim_func(s_tir=True)
def q4f16_matmul(var_x: T.handle, W: T.Buffer((T.int64(N), T.int64(K // 8)), "uint32"),
                 S: T.Buffer((T.int64(N), T.int64(K // 32)), "float16"), var_y: T.handle):
    T.func_attr({"tirx.noalias": True})
    rows = T.int64()
    X = T.match_buffer(var_x, (rows, T.int64(1), T.int64(K)), "float16")
    Y = T.match_buffer(var_y, (rows, T.int64(1), T.int64(N)), "float16")
    deq = T.sblock_alloc_buffer((T.int64(N), T.int64(K)), "float16")
    acc = T.sblock_alloc_buffer((rows, T.int64(1), T.int64(N)))
    for n, k in T.grid(T.int64(N), T.int64(K)):
        with T.sblock("dequantize"):
            v_n, v_k = T.axis.remap("SS", [n, k])
            deq[v_n, v_k] = (T.Cast("float16", W[v_n, v_k // T.int64(8)] >> T.Cast("uint32", v_k % T.int64(8) * T.int64(4))
                                    & T.uint32(15)) - T.float16(8.0)) * S[v_n, v_k // T.int64(32)]
    for i0, i1, i2, k in T.grid(rows, T.int64(1), T.int64(N), T.int64(K)):
        with T.sblock("NT_matmul"):
            v_i0, v_i1, v_i2, v_k = T.axis.remap("SSSR", [i0, i1, i2, k])
            with T.init():
                acc[v_i0, v_i1, v_i2] = T.float32(0.0)
            acc[v_i0, v_i1, v_i2] = acc[v_i0, v_i1, v_i2] + T.Cast("float32", X[v_i0, v_i1, v_k]) * T.Cast(
                "float32", deq[v_i2, v_k])
    for i0, i1, i2 in T.grid(rows, T.int64(1), T.int64(N)):
        with T.sblock("compute"):
            v_i0, v_i1, v_i2 = T.axis.remap("SSS", [i0, i1, i2])
            Y[v_i0, v_i1, v_i2] = T.Cast("float16", acc[v_i0, v_i1, v_i2])


@pytest.fixture(scope="module", params=[0, 1, 2])
def built(request):
    """Built with the default knobs (gemv_tile_n 0: the matmul's tile_n on a target without mcpu), and
    with the one-row GEMV's tiles of 1 and 2 weight rows."""
    target = tvm.target.Target({"kind": "llvm", "mattr": ["-amx-tile", "-amx-int8", "-amx-bf16"]})
    knobs = dataclasses.replace(default_knobs(16), gemv_tile_n=request.param)
    sch = QuantMatmul(knobs).apply(q4f16_matmul, target, False)
    assert sch is not None, "the dequantize + matmul + cast kernel was left unscheduled"
    return tvm.compile(tvm.IRModule({"q4f16_matmul": sch.mod["main"]}), target=target)


def test_the_one_row_gemv_tile_follows_the_knob_else_the_cpu():
    knobs = default_knobs(16)
    znver4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    assert gemv_tile_n(knobs, znver4) == GEMV_TILE_N["znver4"] == 1
    assert gemv_tile_n(knobs, tvm.target.Target({"kind": "llvm", "mcpu": "znver5"})) == knobs.tile_n == 8
    assert gemv_tile_n(dataclasses.replace(knobs, gemv_tile_n=4), znver4) == 4
    with pytest.raises(ValueError, match="gemv_tile_n"):
        dataclasses.replace(knobs, gemv_tile_n=-1)


@pytest.mark.parametrize("rows", [1, 5])
def test_q4f16_kernel_is_scheduled_and_matches_numpy(built, rows):
    _check_against_numpy(built, rows)


@pytest.mark.parametrize("rows", [16, 37])
def test_rows_in_several_l2_blocks_match_numpy(monkeypatch, rows):
    """The tiled matmul's rows in blocks of activations that fit in L2 (schedule.A_BLOCK_BYTES): here
    blocks of 8 rows, so 16 rows are two whole blocks and 37 four and a part."""
    from kiln.targets.cpu import schedule
    monkeypatch.setattr(schedule, "A_BLOCK_BYTES", 8 * K * 4)
    assert schedule.row_block(K, 2) == 8
    target = tvm.target.Target({"kind": "llvm", "mattr": ["-amx-tile", "-amx-int8", "-amx-bf16"]})
    sch = QuantMatmul(default_knobs(16)).apply(q4f16_matmul, target, False)
    _check_against_numpy(tvm.compile(tvm.IRModule({"q4f16_matmul": sch.mod["main"]}), target=target), rows)


def _check_against_numpy(built, rows: int) -> None:
    rng = np.random.default_rng(rows)
    codes = rng.integers(0, 16, size=(N, K), dtype=np.uint8)
    words = pack_nibbles(codes)                             # value k at bits 4 * (k % 8) of word k // 8
    scales = (rng.random((N, K // 32)) * 0.1 + 0.01).astype(np.float16)
    x = rng.standard_normal((rows, 1, K)).astype(np.float16)
    w = ((codes.astype(np.float16) - np.float16(8)) * np.repeat(scales, 32, axis=1)).astype(np.float16)
    want = (x.astype(np.float32) @ w.astype(np.float32).T).astype(np.float16)          # [rows, 1, N]
    dev = tvm.cpu()
    y = tvm.runtime.tensor(np.zeros((rows, 1, N), np.float16), dev)
    built["q4f16_matmul"](tvm.runtime.tensor(x, dev), tvm.runtime.tensor(words, dev), tvm.runtime.tensor(scales, dev), y)
    got = y.numpy().astype(np.float32)
    # float32 sums in another order, then one float16 rounding: within a unit in the last place
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_tuning_starts_a_quantized_kernel_from_quant_matmuls_own_knobs():
    """`kiln tune`'s baseline for a dequantize + matmul kernel is QuantMatmul's default for the target's
    CPU (MATMUL_TILES, else 2 x 8 tiles with 16 lanes), the knobs the rule compiles with untuned, not
    the float rules' (2 x 4 everywhere)."""
    from kiln.targets import get_profile
    from kiln.targets.cpu import schedule_rules
    from kiln.targets.cpu.schedule import target_mcpu
    profile = get_profile("cpu")
    space = profile.tuning_space()
    lanes = space.default_knobs().vector_lanes
    rule = next(r for r in schedule_rules(profile) if isinstance(r, QuantMatmul))
    assert space.default_knobs(q4f16_matmul) == default_knobs(lanes, target_mcpu(profile.tvm_target())) == rule.knobs
    znver4, znver5 = default_knobs(16, "znver4"), default_knobs(16, "znver5")
    assert (znver4.tile_m, znver4.tile_n, znver4.outer) == MATMUL_TILES["znver4"] == (1, 8, True)
    assert (znver5.tile_m, znver5.tile_n, znver5.outer) == (2, 8, False)
    assert default_knobs(8) == CPUKnobs(vector_lanes=8, outer=True)         # AVX2: 2 x 4 as an outer product
    assert default_knobs(4) == CPUKnobs(vector_lanes=4)


def test_the_float_gemv_tile_follows_the_cpu_and_is_tunings_baseline():
    """LowBatchGEMV (the float one-row GEMV copies) takes its weight rows per tile from the target's CPU
    (FLOAT_GEMV_TILE_N, 6 elsewhere), and `kiln tune` times a ``kiln.gemv`` copy from those knobs."""
    from kiln.targets import get_profile
    from kiln.targets.cpu import schedule_rules
    from kiln.targets.cpu.fused_schedule import FLOAT_GEMV_TILE_N, LowBatchGEMV, gemv_knobs
    from kiln.targets.cpu.low_batch_gemv import GEMV_ATTR
    from kiln.targets.cpu.schedule import target_mcpu
    assert gemv_knobs(16, "znver4").tile_n == FLOAT_GEMV_TILE_N["znver4"] == 1
    assert (gemv_knobs(16, "znver5").tile_m, gemv_knobs(16, "znver5").tile_n) == (1, 6) == \
        (gemv_knobs(16).tile_m, gemv_knobs(16).tile_n)
    profile = get_profile("cpu")
    target = profile.tvm_target()
    rule = next(r for r in schedule_rules(profile) if isinstance(r, LowBatchGEMV))
    assert rule.knobs == gemv_knobs(rule.knobs.vector_lanes, target_mcpu(target))
    space = profile.tuning_space()
    assert space.default_knobs(float_matmul.with_attr(GEMV_ATTR, 4)) == rule.knobs != space.default_knobs(float_matmul)
    assert space.default_knobs(q4f16_matmul.with_attr(GEMV_ATTR, 4)) == default_knobs(rule.knobs.vector_lanes,
                                                                                   target_mcpu(target))


@T.prim_func(s_tir=True)
def float_matmul(var_x: T.handle, W: T.Buffer((T.int64(N), T.int64(K)), "float32"), var_y: T.handle):
    T.func_attr({"tirx.noalias": True})
    rows = T.int64()
    X = T.match_buffer(var_x, (rows, T.int64(1), T.int64(K)))
    Y = T.match_buffer(var_y, (rows, T.int64(1), T.int64(N)))
    for i0, i1, i2, k in T.grid(rows, T.int64(1), T.int64(N), T.int64(K)):
        with T.sblock("NT_matmul"):
            v_i0, v_i1, v_i2, v_k = T.axis.remap("SSSR", [i0, i1, i2, k])
            with T.init():
                Y[v_i0, v_i1, v_i2] = T.float32(0.0)
            Y[v_i0, v_i1, v_i2] = Y[v_i0, v_i1, v_i2] + X[v_i0, v_i1, v_k] * W[v_i2, v_k]


@pytest.mark.parametrize("rows", [9, 16, 37, 100])
@pytest.mark.parametrize("cpu", ["avx2", "znver4"])
def test_the_outer_product_form_matches_numpy(monkeypatch, rows, cpu):
    """knobs.outer (AVX2's default: 2 vectors of 8 rows by 4 weight rows; znver4's: 1 vector of 16 by
    8): tile_n weight rows broadcast against tile_m vectors of A rows, A packed into panels of the
    tile's rows first; rows padded to whole panels (9 of 16, 37 of 48), in L2 blocks of 32 rows here
    (100: three blocks and a part). Built for a generic x86-64 (LLVM splits the 16-lane vectors), so
    it runs on any host."""
    from kiln.targets.cpu import schedule
    monkeypatch.setattr(schedule, "A_BLOCK_BYTES", 32 * K * 4)
    target = tvm.target.Target({"kind": "llvm", "mattr": ["-amx-tile", "-amx-int8", "-amx-bf16"]})
    knobs = default_knobs(8) if cpu == "avx2" else default_knobs(16, cpu)
    assert knobs.outer
    sch = QuantMatmul(knobs).apply(q4f16_matmul, target, False)
    assert _packs_a(sch, 16)
    _check_against_numpy(tvm.compile(tvm.IRModule({"q4f16_matmul": sch.mod["main"]}), target=target), rows)


@pytest.mark.parametrize("rows", [32, 40])
def test_the_outer_product_form_at_static_rows(rows):
    """Static rows take the tiled matmul alone: in the outer form whether or not they fill whole panels
    (32: no pad block, A copied into panels all the same; 40: padded to 48)."""
    target = tvm.target.Target({"kind": "llvm", "mattr": ["-amx-tile", "-amx-int8", "-amx-bf16"]})
    x = tvm.tirx.decl_buffer((tvm.tirx.IntImm("int64", rows), tvm.tirx.IntImm("int64", 1), tvm.tirx.IntImm("int64", K)),
                             "float16", name="X")
    static = q4f16_matmul.specialize({q4f16_matmul.params[0]: x})
    sch = QuantMatmul(default_knobs(8)).apply(static, target, False)
    assert sch is not None and _packs_a(sch, 16)
    _check_against_numpy(tvm.compile(tvm.IRModule({"q4f16_matmul": sch.mod["main"]}), target=target), rows)


def _packs_a(sch, rt: int) -> bool:
    """Whether the schedule copies A into panels of rt rows (a write indexed [.., i // rt, k, i % rt])."""
    return f"% T.int64({rt})] = " in sch.mod["main"].script()
