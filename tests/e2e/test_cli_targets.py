"""`kiln targets`: every preset listed with what it builds and whether it builds and runs here."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kiln.cli import main
from kiln.targets import UNSUPPORTED, names

pytestmark = pytest.mark.e2e


def test_targets_lists_every_preset():
    result = CliRunner().invoke(main, ["targets", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["preset"]: r for r in map(json.loads, result.output.splitlines())}
    assert list(rows) == [*names(), *UNSUPPORTED]                # vulkan: listed, with why it does not build
    assert rows["vulkan"]["builds_here"].startswith("no (") and rows["vulkan"]["lib"] is None
    assert rows["metal"]["lib"] == "lib.dylib" and rows["metal"]["runs_here"] is False
    assert rows["ios"]["lib"] == "lib.tar" and rows["android-opencl"]["device"] == "opencl"
    assert rows["cpu"]["runs_here"] is True and rows["cpu"]["builds_here"] == "yes"
    assert rows["cpu"]["default_quant"] == "q4f32" and rows["cuda"]["default_quant"] == "q4f16"
    assert rows["android"]["lib"] == "lib.tar" and rows["android"]["runs_here"] is False
    assert rows["cuda"]["runs_here"] is False                   # no GPU on the machines this suite runs on
    rocm = rows["rocm-gfx1100"]
    assert rocm["device"] == "rocm" and (rocm["builds_here"] == "yes" or "apt-get install lld-22" in rocm["builds_here"])
    text = CliRunner().invoke(main, ["targets"]).output
    header, *lines = text.splitlines()
    assert header.split()[:3] == ["preset", "device", "library"]
    assert [line.split()[0] for line in lines] == list(rows)
