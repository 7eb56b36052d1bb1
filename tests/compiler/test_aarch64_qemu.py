"""`--target aarch64` run on this x86-64 machine: the artifact's lib.so, loaded by TVM's aarch64
runtime (runtime-only, as an app ships it) in an arm64 Debian root under QEMU user-mode emulation
(tools/aarch64_root.py), generates the x86 `cpu` build's greedy tokens with the same logits, and
passes its golden check against transformers; float32 and 4-bit weights."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.targets import ToolchainError

pytestmark = [pytest.mark.numerics, pytest.mark.slow]

TOOL = Path(__file__).parents[2] / "tools" / "aarch64_root.py"
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
report = check_artifact(sys.argv[1])
print(json.dumps({"machine": platform.machine(), "tokens": [o.token_ids for o in outs], "check_ok": report.ok,
                  "check": report.table()}))
"""


def _tool():
    spec = importlib.util.spec_from_file_location("aarch64_root", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def aarch64_root() -> Path:
    """The cached arm64 root; built here on CI (CI=true, as root), else skip saying how to build it.
    Session-scoped so that it is set up (or skips) before the session's compiled artifacts."""
    tool = _tool()
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


@pytest.fixture(scope="module", params=["q0f32", "q4f32"])
def builds(request, tiny_dirs, tiny_artifacts, tmp_path_factory) -> tuple[Path, Path]:
    """(aarch64 artifact, x86 `cpu` artifact) of the untied tiny Llama, in this quantization scheme."""
    quant, model = request.param, str(tiny_dirs["untied"])
    out = tmp_path_factory.mktemp(f"aarch64-{quant}")
    try:
        arm = kiln.compile(model, target="aarch64", quant=quant, output=out / "aarch64")
    except ToolchainError as e:
        pytest.skip(str(e))
    if quant == "q0f32":
        return arm, tiny_artifacts["untied"]
    return arm, kiln.compile(model, target="cpu", quant=quant, output=out / "cpu")


def _drive(python: list[str], env: dict[str, str], artifact: Path, logits: Path) -> dict:
    proc = subprocess.run([*python, "-c", DRIVER, str(artifact), str(logits), json.dumps(PROMPTS)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_aarch64_library_under_qemu_matches_the_x86_build(aarch64_root, builds, tmp_path):
    tool, (arm_artifact, x86_artifact) = _tool(), builds
    native = _drive([sys.executable, "-P"], {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}, x86_artifact,
                    tmp_path / "x86.npy")
    kiln_src = tool.kiln_tree(tmp_path / "src")          # this interpreter's kiln, for the emulated one
    arm = _drive(tool.python_command(aarch64_root), tool.python_env(aarch64_root, str(kiln_src)), arm_artifact,
                 tmp_path / "arm.npy")
    assert arm["machine"] == "aarch64"
    assert arm["tokens"] == native["tokens"]
    assert arm["check_ok"], arm["check"]
    arm_logits, x86_logits = np.load(tmp_path / "arm.npy"), np.load(tmp_path / "x86.npy")
    assert arm_logits.shape == x86_logits.shape == (len(PROMPTS[-1]), x86_logits.shape[-1])
    np.testing.assert_allclose(arm_logits, x86_logits, rtol=0, atol=1e-4)
