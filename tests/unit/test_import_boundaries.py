"""What the runtime may import (DESIGN.md, "Who may import whom"), checked in fresh interpreters and
on the source: the scheduler and page/prefix accounting load no TVM, the runtime uses tvm.runtime
only, and `kiln serve` without the serve extra says how to install it in one line."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import kiln.runtime

pytestmark = pytest.mark.unit

RUNTIME = Path(kiln.runtime.__file__).resolve().parent
# tvm names the runtime may use: tvm.runtime (with its vm), the library paths, and the FFI helpers
# that `import tvm` puts at the top level.
TVM_ALLOWED = {"tvm", "tvm.runtime", "tvm.runtime.vm", "tvm.libinfo"}
TVM_ATTRS = {"runtime", "cpu", "get_global_func", "libinfo", "__file__", "__version__"}


def run_python(code: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """A fresh interpreter (-P: the checkout's kiln/ folder does not shadow the package)."""
    return subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


@pytest.mark.parametrize("modules", [
    ["kiln.runtime.scheduler", "kiln.runtime.kv_pages", "kiln.runtime.prefix_cache"],
    ["kiln", "kiln.runtime", "kiln.runtime.sequence", "kiln.runtime.protocol", "kiln.runtime.contract"],
])
def test_plain_python_modules_load_no_tvm(modules, tmp_path):
    code = (f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('tvm', 'tvm_ffi', 'torch'))))")
    proc = run_python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def _imports(path: Path) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import in a runtime source file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:                                   # relative: resolve against kiln.runtime
                base = ".".join(["kiln", "runtime"][:3 - node.level] + ([base] if base else []))
            out.append((base, node.lineno))
            out += [(f"{base}.{a.name}", node.lineno) for a in node.names if base in ("tvm", "tvm.runtime")]
    return out


@pytest.mark.parametrize("path", sorted(RUNTIME.glob("*.py")), ids=lambda p: p.name)
def test_runtime_uses_tvm_runtime_only_and_no_compiler(path):
    for name, line in _imports(path):
        where = f"{path.name}:{line} imports {name}"
        if name.split(".")[0] == "tvm":
            assert name in TVM_ALLOWED or name.startswith("tvm.runtime."), where
        assert not name.startswith(("kiln.compiler", "kiln.models", "kiln.targets")), where
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "tvm":
            assert node.attr in TVM_ATTRS, f"{path.name}:{node.lineno} uses tvm.{node.attr}"


@pytest.mark.parametrize("missing", ["fastapi", "uvicorn", "prometheus_client"])
def test_serve_without_the_serve_extra_says_how_to_install_it(missing, tmp_path):
    code = (f"import sys\nsys.modules[{missing!r}] = None\n"       # as if it were not installed
            "from kiln.cli import main\nmain(['serve', 'no-such-model'])")
    proc = run_python(code, tmp_path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and missing in lines[0] and 'pip install "kiln[serve]"' in lines[0], proc.stderr
