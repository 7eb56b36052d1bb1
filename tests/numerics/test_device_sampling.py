"""sample_tokens (models/sampling.py) against the host Sampler: the kernel on its own (the CPU
variant; the GPU variant runs on OpenCL in tests/compiler/test_opencl_kernels.py), and engines
whose sampled decode steps draw on the device."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from kiln.models.sampling import EXP_FLOOR, sample_kernel, vector_exp
from kiln.runtime import Engine, EngineConfig, SamplingParams
from kiln.runtime.sampler import device_params

from sampling_cases import host_tokens, sampling_case

pytestmark = pytest.mark.numerics


@pytest.mark.parametrize("vocab", [7, 1000, 49152])
def test_kernel_draws_the_samplers_tokens(vocab):
    """Greedy rows (temperature 0, top_k 1, tied maxima), temperature alone, top-k, top-p, min-p and
    their mixes: the token numpy's Sampler draws with the same uniform, in every row."""
    name = "sample_tokens"
    lib = tvm.compile(tvm.IRModule({name: sample_kernel(vocab, gpu=False).with_attr("global_symbol", name)}),
                      target={"kind": "llvm"})
    logits, params = sampling_case(48, vocab, seed=vocab)
    out = tvm.runtime.tensor(np.zeros(len(params), np.int32))
    lib[name](tvm.runtime.tensor(logits), tvm.runtime.tensor(params), out)
    np.testing.assert_array_equal(out.numpy(), host_tokens(logits, params))


def test_vector_exp_is_float32_exp():
    """The CPU variant's weights exp(x - max): vector_exp, built vectorised for this CPU, within 2e-7
    of exp in float64 (numpy's own float32 exp: ~2e-7) from EXP_FLOOR to 0, exactly 1 at 0 (the row's
    maximum), 0 below the floor and for -inf (masked logits)."""
    n = 1 << 16

    @T.prim_func(s_tir=True)
    def exp16(a: T.Buffer((n,), "float32"), b: T.Buffer((n,), "float32")):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        for c in range(n // 16):
            for i in T.vectorized(16):
                b[c * 16 + i] = vector_exp(a[c * 16 + i])

    lib = tvm.compile(exp16, target={"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})
    rng = np.random.default_rng(0)
    d = np.concatenate([np.linspace(EXP_FLOOR, 0, n // 2), -np.abs(rng.standard_normal(n // 2 - 4)) * 20,
                        [0, -np.inf, EXP_FLOOR - 1e-3, -1e30]]).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros(n, np.float32))
    lib(tvm.runtime.tensor(d), out)
    y, ref = out.numpy(), np.exp(d.astype(np.float64))
    kept = d >= EXP_FLOOR
    assert np.abs(y[kept] / ref[kept] - 1).max() < 2e-7
    assert (y[d == 0] == 1).all() and (y[~kept] == 0).all()


def _prompts(n: int) -> list[list[int]]:
    rng = np.random.default_rng(3)
    return [rng.integers(3, 200, rng.integers(4, 20)).tolist() for _ in range(n)]


def test_engine_draws_sampled_tokens_on_the_device(tiny_artifacts):
    """Seeded sampled requests (temperature, top-k, top-p, min-p) give the same tokens whether their
    steps draw on the device or on the host: decode steps, and steps where later arrivals' prompt
    chunks (one of them split over several steps) run beside the decodes; a greedy request
    among them. A logprobs request sends its steps to the host."""
    params = [SamplingParams(max_tokens=12, temperature=t, top_k=k, top_p=p, min_p=m, seed=i, ignore_eos=True)
              for i, (t, k, p, m) in enumerate([(0.8, 0, 1.0, 0.0), (1.0, 20, 0.9, 0.0), (0.6, 0, 0.8, 0.05),
                                                (1.2, 5, 1.0, 0.0), (0.0, 0, 1.0, 0.0)])]
    prompts = _prompts(5)
    prompts[3] = list(range(3, 90))                              # longer than one step's token budget
    outputs = {}
    for on_device in (True, False):
        engine = Engine(tiny_artifacts["tied"], EngineConfig(enable_prefix_cache=False, device_sampling=on_device,
                                                             max_tokens_per_step=40))
        calls = []
        launch = engine.runner.launch_next_tokens
        engine.runner.launch_next_tokens = lambda *a, **k: calls.append([len(t) for t in a[1]]) or launch(*a, **k)
        requests = [engine.add_request(p, sp)[0] for p, sp in zip(prompts[:2], params[:2])]
        for _ in range(3):
            engine.step()
        requests += [engine.add_request(p, sp)[0] for p, sp in zip(prompts[2:], params[2:])]
        while engine.has_work:
            engine.step()
        if on_device:
            assert any(max(c) > 1 and min(c) == 1 for c in calls)     # prompt chunks beside decodes
            assert any(len(c) == 5 and max(c) == 1 for c in calls)    # plain decode steps
        else:
            assert not calls
        outputs[on_device] = [r.output_ids for r in requests]
    assert outputs[True] == outputs[False]
    assert len({tuple(o) for o in outputs[True]}) == 5


@pytest.mark.parametrize("device_sampling", [False, True])
@pytest.mark.parametrize("overlap", [False, True])
def test_plain_rows_stay_on_the_device_beside_host_sampled_rows(tiny_artifacts, device_sampling, overlap):
    """A step mixing plain rows with rows the host Sampler must draw (logprobs, a repetition penalty,
    logit bias) picks the plain rows' tokens on the device and copies back only the others' logits:
    every request generates what it generates alone, logprobs included."""
    prompts = _prompts(5)
    common = dict(max_tokens=6, ignore_eos=True)
    sampled = dict(temperature=0.9, top_k=20, seed=4) if device_sampling else dict(temperature=0.0)
    params = [SamplingParams(temperature=0.0, logprobs=True, top_logprobs=2, **common),
              SamplingParams(temperature=0.0, **common),
              SamplingParams(temperature=0.8, seed=3, repetition_penalty=1.3, **common),
              SamplingParams(**sampled, **common),
              SamplingParams(temperature=0.0, logit_bias={7: 5.0}, **common)]
    config = EngineConfig(device_sampling=device_sampling, overlap=overlap, enable_prefix_cache=False)
    engine = Engine(tiny_artifacts["tied"], config)
    host_rows = []
    launch = engine.runner.launch_next_tokens
    engine.runner.launch_next_tokens = lambda *a, **k: host_rows.append(k.get("logits_rows", 0)) or launch(*a, **k)
    requests = [engine.add_request(p, sp)[0] for p, sp in zip(prompts, params)]
    while engine.has_work:
        engine.step()
    assert host_rows and max(host_rows) == 3                      # three rows to the host, two on the device
    alone = Engine(tiny_artifacts["tied"], EngineConfig(device_sampling=device_sampling, enable_prefix_cache=False))
    for r, p, sp in zip(requests, prompts, params):
        ref = alone.generate(p, sp)
        assert r.output_ids == ref.token_ids
        if sp.logprobs:
            assert [lp.token_id for lp in r.logprobs] == [lp.token_id for lp in ref.logprobs]
            np.testing.assert_allclose([lp.logprob for lp in r.logprobs], [lp.logprob for lp in ref.logprobs],
                                       atol=1e-5)


def test_device_params_take_the_samplers_draw(tiny_artifacts):
    """device_params consumes one uniform per sampled row from the request's own generator (as the
    host Sampler does) and none for a greedy row."""
    engine = Engine(tiny_artifacts["tied"], EngineConfig(device_sampling=True))
    sampled = engine.add_request([5, 6, 7], SamplingParams(max_tokens=8, temperature=0.7, top_k=3, top_p=0.5,
                                                           min_p=0.1, seed=9))[0]
    greedy = engine.add_request([5, 6, 7], SamplingParams(max_tokens=8, temperature=0.0, seed=9))[0]
    rows = device_params([sampled, greedy])
    want_u = np.random.default_rng((9, 0)).random()
    np.testing.assert_allclose(rows[0], [0.7, 3, 0.5, 0.1, want_u], rtol=1e-6)
    assert not rows[1].any()
    assert greedy.rng.random() == np.random.default_rng((9, 0)).random()      # untouched


def test_device_sampling_refused_for_an_artifact_without_the_kernel(tiny_artifacts, tmp_path):
    """An artifact compiled before sample_tokens existed samples on the host by default; asking for
    device sampling is refused in one line naming the fixes, not silently ignored."""
    import json
    import shutil
    old = shutil.copytree(tiny_artifacts["tied"], tmp_path / "old")
    config = json.loads((old / "kiln-config.json").read_text())
    config["entry_functions"] = [f for f in config["entry_functions"] if f != "sample_tokens"]
    (old / "kiln-config.json").write_text(json.dumps(config))
    assert not Engine(old, EngineConfig(device_sampling=None)).samples_on_device
    with pytest.raises(ValueError, match="recompile it with `kiln compile`, or sample on the host"):
        Engine(old, EngineConfig(device_sampling=True))
