"""ClipTake: take in "fast" mode becomes "clip"; nothing else changes, and a compile prints no TOPI warning."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tvm
from tvm.script import ir as I
from tvm.script import relax as R

from kiln.compiler.passes.clip_take import ClipTake

pytestmark = pytest.mark.compiler


@I.ir_module
class Before:
    @R.function
    def main(table: R.Tensor((16, 4), "float32"), ids: R.Tensor(("n",), "int32")):
        a = R.take(table, ids, axis=0, mode="fast")
        b = R.take(table, ids, axis=0, mode="wrap")
        return (a, b)


@I.ir_module
class After:
    @R.function
    def main(table: R.Tensor((16, 4), "float32"), ids: R.Tensor(("n",), "int32")):
        a = R.take(table, ids, axis=0, mode="clip")
        b = R.take(table, ids, axis=0, mode="wrap")
        return (a, b)


def test_fast_take_becomes_clip():
    tvm.ir.assert_structural_equal(ClipTake()(Before), After)


def test_compile_prints_no_take_warning(tmp_path, tiny_dirs):
    proc = subprocess.run([sys.executable, "-m", "kiln.cli", "compile", str(tiny_dirs["tied"]), "--quant", "q0f32",
                           "-o", str(tmp_path / "a")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr
