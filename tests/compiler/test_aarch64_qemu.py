"""`--target aarch64` run on this x86-64 machine: the artifact's lib.so, loaded by TVM's aarch64
runtime (runtime-only, as an app ships it) in an arm64 Debian root under QEMU user-mode emulation
(tools/aarch64_root.py), generates the x86 `cpu` build's greedy tokens with the same logits, and
passes its golden check against transformers; float32 and 4-bit weights; and a recurrent hybrid (Qwen3.5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from conftest import tool_module
from kiln.targets import ToolchainError

pytestmark = [pytest.mark.numerics, pytest.mark.slow]

PROMPTS = [[1, 2, 3, 4, 5], list(range(20, 60))]
# Run by the emulated python3 and by this one: greedy tokens, the logits at every position of the
# second prompt (saved to argv[2]), and `kiln check` against the golden logits.
DRIVER = """
import json, platform, sys
import numpy as np
from kiln import Engine, SamplingParams
from kiln.runtime.check import check_artifact, prompt_logits
prompts = json.loads(sys.argv[3])
engine = Engine(sys.argv[1])
outs = engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
np.save(sys.argv[2], prompt_logits(engine.runner, len(prompts), prompts[-1]))
runner, seq = engine.runner, len(prompts)                 # 4 decode steps of one sequence, given tokens
runner.add_sequence(seq)
runner.prefill([seq], [prompts[-1]])
step = [runner.decode([seq], [token])[0] for token in (5, 6, 7, 8)]
runner.remove_sequence(seq)
np.save(sys.argv[2].replace(".npy", "-decode.npy"), np.stack(step))
report = check_artifact(sys.argv[1])
print(json.dumps({"machine": platform.machine(), "tokens": [o.token_ids for o in outs], "check_ok": report.ok,
                  "check": report.table()}))
"""


@pytest.fixture(scope="session")
def aarch64_root() -> Path:
    """The cached arm64 root; built here on CI (CI=true, as root), else skip saying how to build it.
    Session-scoped so that it is set up (or skips) before the session's compiled artifacts."""
    tool = tool_module("aarch64_root")
    if tool.missing_tools():
        pytest.skip(f"QEMU user-mode emulation needs host tools: {tool.missing_tools()}")
    root = tool.root_dir()
    if tool.is_built(root):
        return root
    if os.environ.get("CI", "").lower() != "true" or os.geteuid() != 0:
        pytest.skip(f"no arm64 root at {root}: build it once with `python tools/aarch64_root.py` (as root, ~30 s)")
    log = root.parent / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(log, "w") as f:
            return tool.build(root, log=f)
    except (subprocess.CalledProcessError, SystemExit) as e:
        pytest.fail(f"building the arm64 root failed ({e}); the end of {log}:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module", params=["q0f32", "q4f32", "q4f32-int8"])
def builds(request, tiny_dirs, tiny_artifacts, tmp_path_factory) -> tuple[Path, Path]:
    """(aarch64 artifact, x86 `cpu` artifact) of the untied tiny Llama, in this quantization scheme;
    "-int8": both with --decode-activations int8 (AArch64's sdot, x86's vpdpbusd or AVX2: the same
    integer sums on the same int8 codes)."""
    quant, model = request.param, str(tiny_dirs["untied"])
    options = {"decode_activations": "int8"} if quant.endswith("-int8") else {}
    quant = quant.removesuffix("-int8")
    out = tmp_path_factory.mktemp(f"aarch64-{request.param}")
    try:
        arm = kiln.compile(model, target="aarch64", quant=quant, output=out / "aarch64", **options)
    except ToolchainError as e:
        pytest.skip(str(e))
    if quant == "q0f32":
        return arm, tiny_artifacts["untied"]
    return arm, kiln.compile(model, target="cpu", quant=quant, output=out / "cpu", **options)


def _drive(python: list[str], env: dict[str, str], artifact: Path, logits: Path) -> dict:
    proc = subprocess.run([*python, "-c", DRIVER, str(artifact), str(logits), json.dumps(PROMPTS)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_aarch64_library_under_qemu_matches_the_x86_build(aarch64_root, builds, tmp_path):
    tool, (arm_artifact, x86_artifact) = tool_module("aarch64_root"), builds
    native = _drive([sys.executable, "-P"], {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}, x86_artifact,
                    tmp_path / "x86.npy")
    kiln_src = tool.kiln_tree(tmp_path / "src")          # this interpreter's kiln, for the emulated one
    arm = _drive(tool.python_command(aarch64_root), tool.python_env(aarch64_root, str(kiln_src)), arm_artifact,
                 tmp_path / "arm.npy")
    assert arm["machine"] == "aarch64"
    assert arm["check_ok"], arm["check"]
    arm_logits, x86_logits = np.load(tmp_path / "arm.npy"), np.load(tmp_path / "x86.npy")
    assert arm_logits.shape == x86_logits.shape == (len(PROMPTS[-1]), x86_logits.shape[-1])
    arm_steps, x86_steps = np.load(tmp_path / "arm-decode.npy"), np.load(tmp_path / "x86-decode.npy")
    if "int8" in arm_artifact.parent.name:
        # The int8 GEMVs' integer sums are the same on both, but an activation that the two CPUs' float
        # kernels (norms, attention) leave a rounding apart can land on either side of an int8 code's
        # half-way point, so the logits agree to int8's resolution, not float32's (greedy tokens may
        # part at a near-tie): within twice int8's own error (3.5% of the largest logit against exact,
        # tests/numerics/test_int8_decode.py; 5.4% measured here). The kernels alone:
        # test_int8_gemv_sdot_under_qemu_matches_numpy_int8_arithmetic below.
        for got, want in ((arm_steps, x86_steps), (arm_logits, x86_logits)):
            np.testing.assert_allclose(got, want, rtol=0, atol=0.1 * np.abs(want).max())
        return
    assert arm["tokens"] == native["tokens"]
    np.testing.assert_allclose(arm_steps, x86_steps, rtol=0, atol=1e-4)
    np.testing.assert_allclose(arm_logits, x86_logits, rtol=0, atol=1e-4)


def _both_builds(aarch64_root: Path, tmp_path: Path, quant: str) -> tuple[dict, dict]:
    """tmp_path/hf built in `quant` for AArch64 and for this CPU, each driven (DRIVER: its logits saved as arm.npy /
    x86.npy in tmp_path): (the emulated run's result, the native one's)."""
    try:
        arm = kiln.compile(str(tmp_path / "hf"), target="aarch64", quant=quant, output=tmp_path / "aarch64")
    except ToolchainError as e:
        pytest.skip(str(e))
    x86 = kiln.compile(str(tmp_path / "hf"), target="cpu", quant=quant, output=tmp_path / "cpu")
    tool, native_env = tool_module("aarch64_root"), {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    native = _drive([sys.executable, "-P"], native_env, x86, tmp_path / "x86.npy")
    emulated_env = tool.python_env(aarch64_root, str(tool.kiln_tree(tmp_path / "src")))
    return _drive(tool.python_command(aarch64_root), emulated_env, arm, tmp_path / "arm.npy"), native


def test_a_recurrent_hybrid_under_qemu_matches_the_x86_build(aarch64_root, tmp_path):
    """Qwen3.5's gated DeltaNet layers (their state slots, targets/recurrent.py's CPU kernels) built for AArch64: the
    emulated run gives the x86 build's tokens and logits, prefill and decode, and passes its golden check."""
    from tiny_models import write_widened
    config = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8,
                  linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=256, eos_token_id=2,
                  bos_token_id=None, pad_token_id=0, tie_word_embeddings=False)      # (test_qwen3_5.py's)
    write_widened("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", config, tmp_path / "hf", seed=1)
    got, native = _both_builds(aarch64_root, tmp_path, "q0f32")
    assert got["machine"] == "aarch64" and got["check_ok"], got["check"]
    assert got["tokens"] == native["tokens"]
    for name in ("arm.npy", "arm-decode.npy"):
        np.testing.assert_allclose(np.load(tmp_path / name), np.load(tmp_path / name.replace("arm", "x86")), rtol=0,
                                   atol=1e-4)


def test_a_mixture_of_experts_at_q4f16_under_qemu_matches_the_x86_build(aarch64_root, tmp_path):
    """OLMoE's experts at q4f16 built for AArch64, whose float16 dequantize the grouped expert kernel now writes
    (targets/cpu/expert_matmul.py; it fell back to RowReduction's schedule before): the emulated run's logits, prefill
    and decode, are the x86 build's to float16's rounding (the two builds' kernels sum in other orders; 0.13% of the
    largest logit measured, 0.0038 of 2.88)."""
    from tiny_models import write_widened
    config = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, max_position_embeddings=256,
                  eos_token_id=2, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False)
    write_widened("OlmoeForCausalLM", "OlmoeConfig", config, tmp_path / "hf", seed=1)
    assert _both_builds(aarch64_root, tmp_path, "q4f16")[0]["machine"] == "aarch64"
    for name in ("arm.npy", "arm-decode.npy"):
        want = np.load(tmp_path / name.replace("arm", "x86"))
        np.testing.assert_allclose(np.load(tmp_path / name), want, rtol=0, atol=0.01 * np.abs(want).max())


# Run by the emulated python3: the kernel library on each saved x (argv[2]'s npz: the planes in
# argv[3]'s order, then x0, x1, ...), its outputs saved to argv[5] (argv[4]: the output width).
KERNEL_DRIVER = """
import json, platform, sys
import numpy as np
import tvm
lib, data = tvm.runtime.load_module(sys.argv[1]), np.load(sys.argv[2])
order, n = json.loads(sys.argv[3]), int(sys.argv[4])
dev = tvm.cpu()
planes = [tvm.runtime.tensor(data[name], dev) for name in order]
outs = {}
for name in (f for f in data.files if f.startswith("x")):
    y = tvm.runtime.tensor(np.zeros((*data[name].shape[:-1], n), np.float32), dev)
    lib["main"](*planes, tvm.runtime.tensor(data[name], dev), y)
    outs[name] = y.numpy()
np.savez(sys.argv[5], **outs)
print(platform.machine())
"""


def test_int8_gemv_sdot_under_qemu_matches_numpy_int8_arithmetic(aarch64_root, tmp_path):
    """targets/cpu/int8_gemv.py's AArch64 form (`--decode-activations int8` on --target aarch64 adds
    +dotprod to its target: sdot), built as a compile builds it and run on the emulated CPU: one
    row, then 3 and 6 (the 4-row passes), against numpy doing the kernel's int8 arithmetic."""
    from kiln.compiler.quant_modules import QuantFormat
    from kiln.targets import get_profile
    from kiln.targets.link import find_lld, lld_exporter
    from test_cpu_int8_gemv import _built, int8_reference, random_planes
    if find_lld("elf") is None:
        pytest.skip("no ld.lld to link the AArch64 library")
    target = get_profile("aarch64").with_int8_decode().target
    assert "+dotprod" in target["mattr"] and "+dotprod" not in get_profile("aarch64").target["mattr"]
    n, k = 40, 384
    lib = _built("q4m", 32, "float16", n, k, target)
    assert "sdot\t" in lib.mod.inspect_source("s")
    lld_exporter("elf")(lib, tmp_path / "gemv.so")
    fmt = QuantFormat("q4m", 32, "float16")
    rng = np.random.default_rng(5)
    planes = random_planes(fmt, n, k, rng)
    xs = {f"x{rows}": rng.standard_normal((rows, 1, k)).astype(np.float32) for rows in (1, 3, 6)}
    xs["x1"][0, 0, 32:64] = 0                    # a chunk of zeros: dx 0
    np.savez(tmp_path / "in.npz", **planes, **xs)
    tool = tool_module("aarch64_root")
    proc = subprocess.run([*tool.python_command(aarch64_root), "-c", KERNEL_DRIVER, str(tmp_path / "gemv.so"),
                           str(tmp_path / "in.npz"), json.dumps(list(planes)), str(n), str(tmp_path / "out.npz")],
                          capture_output=True, text=True, env=tool.python_env(aarch64_root), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == ["aarch64"]
    got = np.load(tmp_path / "out.npz")
    for name, x in xs.items():
        for r in range(x.shape[0]):
            want = int8_reference(fmt, planes, x[r, 0])
            np.testing.assert_allclose(got[name][r, 0], want, rtol=1e-5, atol=2e-5 * np.abs(want).max(),
                                       err_msg=f"{name} row {r}")
