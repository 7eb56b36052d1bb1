"""`kiln compile --decode-activations int8`: the CPU's GEMVs of 1-8 rows over 4-bit weights take int8
activations (targets/cpu/int8_gemv.py). A tiny Llama at q4f32 compiled both ways: prefill over many
rows (every position, batch_verify) gives the exact build's logits; decode steps of one and of two
sequences, within x's 8-bit rounding of them (and not equal: the int8 kernels ran); the artifact
records the choice; targets without the kernel refuse the option in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln.runtime import Artifact
from kiln.runtime.model_runner import ModelRunner
from kiln.targets import get_profile

pytestmark = pytest.mark.numerics
IDS = [int(i) for i in np.random.default_rng(11).integers(0, 512, size=21)]


@pytest.fixture(scope="module")
def builds(tiny_dirs, tmp_path_factory):
    if not get_profile("cpu").int8_decode:
        pytest.skip("this CPU has no int8 GEMV (x86-64 with AVX2)")
    out = tmp_path_factory.mktemp("int8-decode")
    return {mode: kiln.compile(str(tiny_dirs["untied"]), target="cpu", quant="q4f32", output=out / mode,
                               golden=False, decode_activations=mode) for mode in ("exact", "int8")}


def _greedy(art, steps: int = 4) -> list[int]:
    runner = ModelRunner(Artifact.load(art))
    runner.add_sequence(0)
    logits, out = runner.prefill([0], [IDS])[0], []
    for _ in range(steps):
        out.append(int(np.argmax(logits)))
        logits = runner.decode([0], [out[-1]])[0]
    return out


def _logits(art, tokens: list[int]):
    """(every prefill position's logits, then the decode steps' fed `tokens`)."""
    runner = ModelRunner(Artifact.load(art))
    runner.add_sequence(0)
    verify = runner.verify(0, IDS)
    runner.add_sequence(1)
    runner.prefill([1], [IDS])
    steps = [runner.decode([1], [t])[0] for t in tokens]
    runner.add_sequence(2)
    runner.prefill([2], [IDS[:9]])
    steps.extend(runner.decode([1, 2], [tokens[0], tokens[1]]))      # two sequences: the 2-row kernels
    return verify, np.stack(steps)


def test_int8_decode_is_within_rounding_and_prefill_exact(builds):
    tokens = _greedy(builds["exact"])                       # both builds fed the same tokens
    exact_verify, exact_steps = _logits(builds["exact"], tokens)
    int8_verify, int8_steps = _logits(builds["int8"], tokens)
    np.testing.assert_allclose(int8_verify, exact_verify, rtol=0, atol=1e-5)        # many rows: exact kernels
    scale = np.abs(exact_steps).max()
    diff = np.abs(int8_steps - exact_steps).max()
    assert scale > 0.5, "logits too small for the tolerance to mean anything"
    assert 1e-6 < diff < 0.1 * scale, (diff, scale)     # measured 0.073 with logits up to 2.05 (3.5%)
    config = json.loads((builds["int8"] / "kiln-config.json").read_text())
    assert config["quantization"]["decode_activations"] == "int8"
    assert json.loads((builds["exact"] / "kiln-config.json").read_text())["quantization"]["decode_activations"] \
        == "exact"
    from click.testing import CliRunner
    from kiln.cli import main
    info = CliRunner().invoke(main, ["info", str(builds["int8"])])
    assert info.exit_code == 0 and "q4f32, int8 activations in decode's GEMVs" in info.output, info.output


def test_int8_build_generates(builds):
    from kiln import Engine, SamplingParams
    out = Engine(builds["int8"]).generate(IDS, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert len(out.token_ids) == 6


def test_targets_without_the_kernel_refuse(tiny_dirs, tmp_path):
    from kiln.compiler import CompileOptions
    with pytest.raises(ValueError, match="--decode-activations int8: the webgpu target has no int8 GEMV") as e:
        kiln.compile(str(tiny_dirs["tied"]), target="webgpu", output=tmp_path / "a", golden=False,
                     decode_activations="int8")
    assert all(name in str(e.value) for name in ("x86-64-v3", "aarch64", "android"))
    assert not (tmp_path / "a").exists()
    with pytest.raises(ValueError, match="--decode-activations 'int4' is not one of exact, int8"):
        CompileOptions(model="x", decode_activations="int4").validate()


def test_kiln_check_runs_an_int8_build_through_decode_too(tiny_dirs, tmp_path):
    """`kiln check` on an int8 decode artifact compares every golden prompt twice: through prefill
    (exact here: its rows are too many for the int8 GEMVs) and one token a step through decode (the
    int8 GEMVs, so other logits), both within the q4 tolerance; the decode rows are labelled."""
    from kiln.runtime.check import check_artifact, decode_logits, prompt_logits
    if not get_profile("cpu").int8_decode:
        pytest.skip("this CPU has no int8 GEMV (x86-64 with AVX2)")
    art = kiln.compile(str(tiny_dirs["untied"]), target="cpu", quant="q4f32", output=tmp_path / "a",
                       decode_activations="int8")
    report = check_artifact(art)
    assert report.ok, report.table()
    paths = [(r.prompt, r.path) for r in report.prompts]
    assert paths == [(i, path) for i in range(len(paths) // 2) for path in ("prefill", "decode")]
    assert " decode " in report.table()
    runner = ModelRunner(Artifact.load(art), max_num_seqs=1)
    by_steps, by_prefill = decode_logits(runner, 0, IDS[:12]), prompt_logits(runner, 0, IDS[:12])
    assert by_steps.shape == by_prefill.shape
    assert 0 < np.abs(by_steps - by_prefill).max() < 0.1 * np.abs(by_prefill).max()
