"""kiln.ensure_artifact's compile-on-first-use cache: reused while nothing changed, rebuilt when the
compiler or the target's tuning database changed (a stale artifact is never served), the stale entry
removed once its replacement is whole; `kiln cache list|clean`."""

from __future__ import annotations

import json
import os
import time

import pytest
from click.testing import CliRunner

import kiln
from kiln.cache import entries, parse_age
from kiln.cli import main
from kiln.targets import get_profile


def test_cache_key_follows_model_compiler_and_tuning(tiny_dirs, monkeypatch):
    model = str(tiny_dirs["tied"])
    first = kiln.ensure_artifact(model, quant="q0f32")
    assert kiln.ensure_artifact(model, quant="q0f32") == first            # reused: nothing changed

    monkeypatch.setattr(kiln, "compiler_fingerprint", lambda: "an-edited-compiler")
    edited = kiln.ensure_artifact(model, quant="q0f32")
    assert edited != first and kiln.is_artifact(edited)
    assert not first.exists(), "the superseded entry should be gone, not piled up"

    db = get_profile("cpu").tuning_db_path()
    db.parent.mkdir(parents=True, exist_ok=True)
    try:
        db.write_text('{"version": 1, "kernels": {}}')
        tuned = kiln.ensure_artifact(model, quant="q0f32")
        assert tuned not in (first, edited) and not edited.exists()
    finally:
        db.unlink()
    mine = [e for e in entries() if e.model == "tied" and e.quant == "q0f32"]
    assert [e.path for e in mine] == [tuned]


def test_cache_list_and_clean_by_age(tiny_dirs):
    path = kiln.ensure_artifact(str(tiny_dirs["untied"]), quant="q0f32")
    old = time.time() - 10 * 86400
    os.utime(path, (old, old))
    runner = CliRunner()
    rows = [json.loads(line) for line in runner.invoke(main, ["cache", "list", "--json"]).output.splitlines()]
    assert any(r["kind"] == "artifact" and r["path"] == str(path) and r["model"] == "untied" and r["bytes"] > 0
               for r in rows)
    kept = runner.invoke(main, ["cache", "clean", "--older-than", "30d"])
    assert kept.exit_code == 0 and path.exists()
    gone = runner.invoke(main, ["cache", "clean", "--older-than", "7d"])
    assert gone.exit_code == 0 and "removed" in gone.output and not path.exists()
    assert kiln.ensure_artifact(str(tiny_dirs["untied"]), quant="q0f32") == path      # recompiled on next use


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800), ("2w", 1209600)])
def test_parse_age(text, seconds):
    assert parse_age(text) == seconds


def test_bad_age_is_one_line():
    out = CliRunner().invoke(main, ["cache", "clean", "--older-than", "soon"])
    assert out.exit_code == 1 and "error: --older-than 'soon' is not an age" in out.output
