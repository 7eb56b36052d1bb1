"""kiln.ensure_artifact's compile-on-first-use cache: reused while nothing changed, rebuilt when the
compiler or the target's tuning database changed (a stale artifact is never served)."""

from __future__ import annotations

import kiln
from kiln.targets import get_profile


def test_cache_key_follows_model_compiler_and_tuning(tiny_dirs, monkeypatch):
    model = str(tiny_dirs["tied"])
    first = kiln.ensure_artifact(model, quant="q0f32")
    assert kiln.ensure_artifact(model, quant="q0f32") == first            # reused: nothing changed

    monkeypatch.setattr(kiln, "compiler_fingerprint", lambda: "an-edited-compiler")
    edited = kiln.ensure_artifact(model, quant="q0f32")
    assert edited != first and kiln.is_artifact(edited)

    db = get_profile("cpu").tuning_db_path()
    db.parent.mkdir(parents=True, exist_ok=True)
    try:
        db.write_text('{"version": 1, "kernels": {}}')
        tuned = kiln.ensure_artifact(model, quant="q0f32")
        assert tuned not in (first, edited)
    finally:
        db.unlink()
