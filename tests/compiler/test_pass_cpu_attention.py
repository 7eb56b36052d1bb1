"""UseKilnCPUAttention and FastActivations: what they replace, what they must leave alone, and the numbers.

UseKilnCPUAttention swaps whole PrimFuncs, so its before/after is checked structurally: after
the pass each KV-cache kernel equals kiln's kernel built for the cache's shapes, and everything
else is TVM's, untouched. The kernels' numerics are in tests/numerics/test_cpu_attention.py;
the whole model against transformers in tests/numerics/test_llama_numerics.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op
from tvm.relax.frontend.nn.llm.kv_cache import RopeMode, TIRPagedKVCache
from tvm.script import ir as I
from tvm.script import relax as R

from kiln.compiler import pipeline
from kiln.targets.cpu.attention_pass import UseKilnCPUAttention
from kiln.targets.cpu.fast_activations import FastActivations
from kiln.targets import get_profile
from kiln.targets.cpu.attention import attention_paged_cpu, attention_prefill_ragged_cpu, split_rotary_cpu

pytestmark = pytest.mark.compiler
H_Q, H_KV, D, THETA = 4, 2, 16, 10000.0
REPLACED = {
    "batch_prefill_ragged_kv": lambda: attention_prefill_ragged_cpu(H_KV, H_Q, D, "float32"),
    "batch_prefill_paged_kv_cpu": lambda: attention_paged_cpu(H_KV, H_Q, D, "float32", 16, decode=False),
    "batch_decode_paged_kv_cpu": lambda: attention_paged_cpu(H_KV, H_Q, D, "float32", 16, decode=True),
    "batch_decode_paged_kv_cpu_sliding_window": lambda: attention_paged_cpu(H_KV, H_Q, D, "float32", 16,
                                                                            decode=True, sliding=True),
    "batch_prefill_paged_kv_cpu_sliding_window": lambda: attention_paged_cpu(
        H_KV, H_Q, D, "float32", 16, decode=False, sliding=True, window=1024),     # TVM's default window size
    "fused_rope": lambda: split_rotary_cpu(THETA, 1.0, D, H_Q, H_KV, "float32"),
}
UNTOUCHED = ("batch_tree_attn", "tree_attn_paged_kv_cpu",
             "merge_state_inplace_cpu")


class CacheOnly(nn.Module):
    def __init__(self, rope_mode=RopeMode.NORMAL, rope_scaling=None):
        self.rope_mode, self.rope_scaling = rope_mode, rope_scaling or {}

    def create_paged_kv_cache(self, max_batch_size, max_total_seq_len, prefill_chunk_size, page_size,
                              support_sliding_window):
        return TIRPagedKVCache(
            attn_kind="mha", max_batch_size=max_batch_size, max_total_seq_len=max_total_seq_len,
            prefill_chunk_size=prefill_chunk_size, page_size=page_size,
            support_sliding_window=support_sliding_window, layer_partition=relax.ShapeExpr([0, 2]),
            num_hidden_layers=2, num_attention_heads=H_Q, num_key_value_heads=H_KV, qk_head_dim=D,
            v_head_dim=D, mla_original_qk_head_dim=0, mla_original_v_head_dim=0, rope_mode=self.rope_mode,
            rope_scale=1, rope_theta=THETA, rope_scaling=self.rope_scaling, rope_ext_factors=relax.prim_value(0),
            rotary_dim=D, enable_disaggregation=False, dtype="float32", target=tvm.target.Target.current())


def export(**kwargs) -> tvm.IRModule:
    spec = {"create_paged_kv_cache": {name: int for name in ("max_batch_size", "max_total_seq_len",
                                                             "prefill_chunk_size", "page_size",
                                                             "support_sliding_window")}
            | {"$": {"param_mode": "none", "effect_mode": "none"}}}
    with get_profile("cpu").tvm_target():
        mod, _ = CacheOnly(**kwargs).export_tvm(spec=spec)
    return mod


def _same(a, b) -> bool:
    strip = lambda f: f.without_attr("global_symbol").without_attr("kiln.attention")   # noqa: E731
    return tvm_ffi.structural_equal(strip(a), strip(b))


def test_replaces_the_cache_kernels_and_nothing_else():
    before = export()
    after = UseKilnCPUAttention()(before)
    for name, make in REPLACED.items():
        assert after[name].attrs["tirx.is_scheduled"] and after[name].attrs["global_symbol"] == \
            before[name].attrs["global_symbol"]
        assert _same(after[name], make()), name
        assert not _same(before[name], after[name]), f"{name}: the input module was changed in place"
    for name in UNTOUCHED:
        assert _same(after[name], before[name]), name


@pytest.mark.parametrize("profile,simd", [("x86-64-v3", 8), ("x86-64-avx512", 16), ("android", 8)])
def test_prefill_blocks_follow_the_targets_vector_registers(profile, simd):
    """The CPU pipeline's pass builds the prefill kernels for the target's float32 lanes (AVX2 8,
    AVX-512 16, NEON's 4 taken as 8), whatever the host."""
    from kiln.targets.cpu import _phase_passes
    chosen = next(p for p in _phase_passes(get_profile(profile), "schedule") if p.info.name == "UseKilnCPUAttention")
    after = chosen(export())
    assert _same(after["batch_prefill_ragged_kv"], attention_prefill_ragged_cpu(H_KV, H_Q, D, "float32", simd=simd))
    assert _same(after["batch_prefill_paged_kv_cpu"],
                 attention_paged_cpu(H_KV, H_Q, D, "float32", 16, decode=False, simd=simd))


@pytest.mark.parametrize("mcpu", ["x86-64-v3", "znver4"])
def test_decode_prefetches_the_next_page_into_l2(mcpu):
    """The decode kernel asks for the next page's key and value rows into L2 (prefetcht1), none into L1:
    into L1 the same kernel ran 1.6x slower at 1,024 tokens on a znver4 (targets/cpu/prefetch.py)."""
    kernel = attention_paged_cpu(H_KV, H_Q, D, "float32", 16, decode=True).with_attr("global_symbol", "main")
    built = tvm.compile(tvm.IRModule({"main": kernel}), target=tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
    asm = built.mod.inspect_source("s")
    assert "prefetcht1" in asm and "prefetcht0" not in asm


def test_leaves_inline_rope_alone():
    before = export(rope_mode=RopeMode.INLINE)           # RoPE inside attention: kiln's kernels assert it off
    after = UseKilnCPUAttention()(before)
    for name in REPLACED:
        assert _same(after[name], before[name]), name


def test_keeps_tvm_rope_for_scaled_rope():
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    before = export(rope_scaling=llama3)
    after = UseKilnCPUAttention()(before)
    assert _same(after["fused_rope"], before["fused_rope"])
    assert _same(after["batch_decode_paged_kv_cpu"], REPLACED["batch_decode_paged_kv_cpu"]())


def test_module_without_a_cache_is_unchanged():
    mod = tvm.IRModule({"main": REPLACED["batch_decode_paged_kv_cpu"]()})
    assert UseKilnCPUAttention()(mod).same_as(mod)


# ---------------------------------------------------------------------------------- FastActivations

@I.ir_module
class SiLUBefore:
    @R.function
    def main(x: R.Tensor((2, 8), "float32"), y: R.Tensor((2, 8), "float16")):
        with R.dataflow():
            a = R.nn.silu(x)
            b = R.sigmoid(x)
            c = R.nn.silu(y)                                  # float16: left to the default lowering
            d = R.nn.gelu_tanh(x)
            e = R.nn.gelu(x)
            R.output(a, b, c, d, e)
        return a, b, c, d, e


def test_fast_activations_before_after():
    after = FastActivations()(SiLUBefore)
    text = after["main"].script()
    assert "R.nn.silu(x)" not in text and "R.sigmoid" not in text and "R.nn.gelu" not in text
    assert "R.nn.silu(y)" in text
    fast = {"fast_silu", "fast_sigmoid", "fast_gelu_tanh", "fast_gelu"}
    assert {gv.name_hint for gv, f in after.functions_items() if isinstance(f, tvm.tirx.PrimFunc)} == fast
    for name in fast:                                    # a polynomial exp, no libm call left
        body = after[name].script()
        assert "T.reinterpret" in body and "T.exp(" not in body and "T.sigmoid(" not in body, body
        assert "T.erf(" not in body, body


class Gated(nn.Module):
    def __init__(self, activation: str):
        self.activation = activation

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        gate, up = op.split(x, 2, axis=-1)
        if self.activation == "silu":
            return op.silu(gate) * up
        return op.gelu(gate, approximate="tanh" if self.activation == "gelu_tanh" else "none") * up


def _gelu(g: np.ndarray) -> np.ndarray:
    return 0.5 * g * np.vectorize(math.erfc)(-g / math.sqrt(2.0))


REFERENCE = {"silu": lambda g: g / (1 + np.exp(-g)),
             "gelu_tanh": lambda g: 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3))),
             "gelu": _gelu}


@pytest.mark.parametrize("activation", sorted(REFERENCE))
def test_fast_activation_through_the_cpu_pipeline_matches_numpy(monkeypatch, activation):
    mod, _ = Gated(activation).export_tvm(spec={"forward": {"x": nn.spec.Tensor([1, "n", 64], "float32")}})
    profile = get_profile("cpu")
    x = np.random.default_rng(0).normal(0, 4, (1, 37, 64)).astype("float32")
    x[0, 0, :4] = [-100.0, 100.0, 0.0, -20.0]                      # saturation on both sides
    gate, up = x[..., :32].astype(np.float64), x[..., 32:].astype(np.float64)
    expected = REFERENCE[activation](gate) * up
    real = pipeline.phases
    for with_pass in (True, False):
        if not with_pass:
            monkeypatch.setattr(pipeline, "phases", lambda p: [(n, [q for q in ps if q.info.name != "FastActivations"])
                                                               for n, ps in real(p)])
        ex = relax.build(mod, target=profile.tvm_target(), relax_pipeline=pipeline.build_pipeline(profile))
        got = relax.VirtualMachine(ex, tvm.cpu())["forward"](tvm.runtime.tensor(x)).numpy()
        # relative error where the gate is in the negative tail (-6, -2)
        tail = np.broadcast_to((gate > -6) & (gate < -2), got.shape) & (expected != 0)
        tail_error = (np.abs(got - expected) / np.abs(np.where(expected != 0, expected, 1)))[tail].max()
        if with_pass or activation != "gelu":
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
            pass_tail_error = tail_error
        else:       # TVM's x (1 + erf(x / sqrt 2)) / 2 cancels there: 100x further off than the pass
            assert tail_error > 100 * pass_tail_error, (tail_error, pass_tail_error)


def test_fast_gelu_is_close_to_the_exact_one_everywhere():
    """fast_gelu (erfc of a non-negative argument) against float64 over [-12, 12]: relative error within
    4e-6 from x = -5 on (within 1e-6 from -1 on), absolute within 1e-11 below -5 (|gelu| < 1.5e-6
    there); +-100 saturate to 0 and 100. TVM's float32 formula is off by 5% at x = -5."""
    from tvm import te
    from kiln.targets.cpu.fast_activations import fast_gelu_te
    x = np.concatenate([np.linspace(-12, 12, 24001), [-100.0, 100.0, 0.0]]).astype("float32")
    X = te.placeholder(x.shape, "float32", name="x")
    lib = tvm.compile(tvm.IRModule({"main": te.create_prim_func([X, fast_gelu_te(X)])}),
                      target=get_profile("cpu").tvm_target())
    y = tvm.runtime.tensor(np.zeros_like(x))
    lib["main"](tvm.runtime.tensor(x), y)
    got, ref = y.numpy().astype(np.float64), _gelu(x.astype(np.float64))
    rel = np.abs(got - ref) / np.maximum(np.abs(ref), 1e-300)
    assert rel[(x >= -5) & (np.abs(ref) > 0)].max() < 4e-6
    assert rel[(x >= -1) & (np.abs(ref) > 0)].max() < 1e-6
    assert np.abs(got - ref)[x < -5].max() < 1e-11
    assert got[-3] == 0.0 and got[-2] == 100.0 and got[-1] == 0.0
