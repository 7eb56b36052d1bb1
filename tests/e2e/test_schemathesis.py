"""schemathesis fuzzes every route /openapi.json documents against a live tiny-model server: no case
may answer 5xx (its not_a_server_error check), whatever the body, and every answer matches the reply
schema documented for its status (response_schema_conformance). Against the engine in a process of its
own only: the routes and their validation are the same in both of test_server's modes, and that one
also carries every error across the pipe (the thread mode's fuzz run took another ~100 s of the suite)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_server import server  # noqa: F401 (the served tiny model fixture)

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("server", ["engine-process"], indirect=True)
def test_no_generated_request_gets_a_5xx_or_an_undocumented_reply(server, tmp_path):
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    if st is None:
        pytest.skip("schemathesis is not installed (pip install schemathesis)")
    run = subprocess.run([st, "run", f"{server.url}/openapi.json", "--checks", "not_a_server_error,response_schema_conformance",
                          "--max-examples", "25", "--phases", "coverage,fuzzing", "--seed", "1",
                          "--request-timeout", "60"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    tail = run.stdout[-3000:]
    assert run.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail.split("Test cases:")[-1], tail
