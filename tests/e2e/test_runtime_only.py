"""An artifact on less than the full install: a runtime-only TVM (TVM_USE_RUNTIME_LIB=1, only
libtvm_runtime loaded, as an app ships it), a device whose driver is missing, a server without
xgrammar. Each either works the same or fails in one line that says what is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.runtime import ArtifactError, Engine, InvalidRequestError, SamplingParams

pytestmark = pytest.mark.e2e

PROMPTS = [[1, 2, 3, 4, 5], list(range(20, 60))]
GREEDY = dict(max_tokens=12, temperature=0.0, ignore_eos=True)
# Run in a fresh interpreter: generate, then report what that interpreter loaded.
GENERATE = """
import json, sys
from kiln import Engine, SamplingParams
outs = Engine(sys.argv[1]).generate(json.loads(sys.argv[2]), SamplingParams(**json.loads(sys.argv[3])))
try:
    from tvm import relax
    relax = True
except Exception:
    relax = False
import tvm.base
maps = open("/proc/self/maps").read() if sys.platform.startswith("linux") else ""
print(json.dumps({"tokens": [o.token_ids for o in outs], "relax": relax, "runtime_only": tvm.base._RUNTIME_ONLY,
                  "libtvm_compiler": "libtvm_compiler" in maps,
                  "kiln_compiler": any(m.startswith(("kiln.compiler", "kiln.models")) for m in sys.modules)}))
"""


def python(args: list[str], cwd: Path, runtime_only: bool) -> subprocess.CompletedProcess:
    """A fresh interpreter (-P: the checkout's kiln/ folder does not shadow the package)."""
    env = {k: v for k, v in os.environ.items() if k != "TVM_USE_RUNTIME_LIB"}
    if runtime_only:
        env["TVM_USE_RUNTIME_LIB"] = "1"
    return subprocess.run([sys.executable, "-P", *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=env)


def test_runtime_only_tvm_generates_the_same_tokens(tiny_artifacts, tmp_path):
    art = tiny_artifacts["untied"]
    expected = [o.token_ids for o in Engine(art).generate(PROMPTS, SamplingParams(**GREEDY))]
    proc = python(["-c", GENERATE, str(art), json.dumps(PROMPTS), json.dumps(GREEDY)], tmp_path, runtime_only=True)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["tokens"] == expected
    assert got["runtime_only"] and not got["relax"] and not got["kiln_compiler"]
    assert not got["libtvm_compiler"]


# -- a device whose driver is missing ------------------------------------------------------------
def _has_cuda() -> bool:
    from kiln.runtime._tvm import open_device
    try:
        open_device("cuda")
        return True
    except ArtifactError:
        return False


@pytest.fixture(scope="module")
def cuda_artifact(tiny_dirs, tmp_path_factory) -> Path:
    if _has_cuda():
        pytest.skip("this machine has a CUDA device: a CUDA artifact loads here")
    import kiln
    return kiln.compile(str(tiny_dirs["tied"]), target="cuda", quant="q0f16",
                        output=tmp_path_factory.mktemp("cuda") / "art")


def test_cuda_artifact_without_the_driver_is_one_clear_error(cuda_artifact):
    with pytest.raises(ArtifactError, match="runs on cuda") as e:
        Engine(cuda_artifact)
    message = str(e.value)
    assert "\n" not in message and "libtvm_runtime_cuda" in message and "--target cpu" in message


@pytest.mark.parametrize("runtime_only", [True, False], ids=["runtime-only", "full"])
def test_cuda_artifact_from_the_cli_is_one_line(cuda_artifact, tmp_path, runtime_only):
    proc = python(["-m", "kiln.cli", "generate", str(cuda_artifact), "--ids", "1,2,3"], tmp_path, runtime_only)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the artifact runs on cuda"), proc.stderr


# -- structured output without xgrammar ------------------------------------------------------------
def test_response_format_without_xgrammar_is_a_400(tiny_artifacts, monkeypatch):
    from fastapi.testclient import TestClient

    from kiln.runtime.async_engine import AsyncEngine
    from kiln.runtime.server import create_app
    monkeypatch.setitem(sys.modules, "xgrammar", None)          # as if it were not installed
    engine = Engine(tiny_artifacts["tied"])
    with pytest.raises(InvalidRequestError, match=r"kiln\[serve\]"):
        engine.generate([1, 2, 3], SamplingParams(max_tokens=4, response_format={"type": "json_object"}))
    aengine = AsyncEngine(engine)
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    try:
        with TestClient(create_app(aengine)) as client:
            refused = client.post("/v1/chat/completions", json={**body, "response_format": {"type": "json_object"}})
            plain = client.post("/v1/chat/completions", json=body)
    finally:
        aengine.stop()
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "response_format" and "kiln[serve]" in error["message"]
    assert plain.status_code == 200                              # the server still answers the rest
