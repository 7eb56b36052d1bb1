"""The tuning database (targets/cpu/tuning.py) and `kiln tune` (compiler/tune.py): the database
round-trips, is written atomically and ignored with a warning when bad; its knobs change the
schedule; tuning a tiny model writes entries that the next compile uses, with unchanged logits."""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pytest
import tvm
import tvm.s_tir.dlight as dl
import tvm_ffi
from tvm import relax, tirx
from tvm.relax.frontend import nn

import kiln
from kiln.targets import get_profile
from kiln.targets.cpu.schedule import CPUKnobs
from kiln.targets.cpu.tuning import TUNED_ATTR, TuneEntry, TuningDB, db_path, kernel_key, target_key, tuning_dir

pytestmark = pytest.mark.compiler

KNOBS = CPUKnobs(tile_m=4, tile_n=2, unroll_k=2)       # anything but the defaults (2, 4, 1)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each test gets its own cache: a database written here must not reach other tests' compiles."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def linear_func() -> tirx.PrimFunc:
    """The unscheduled NT matmul PrimFunc of nn.Linear(64, 96) over symbolic rows."""
    class Proj(nn.Module):
        def __init__(self) -> None:
            self.proj = nn.Linear(64, 96, bias=False)

        def forward(self, x: nn.Tensor) -> nn.Tensor:
            return self.proj(x)

    mod, _ = Proj().export_tvm(spec={"forward": {"x": nn.spec.Tensor([1, "m", 64], "float32")}})
    mod = tvm.transform.Sequential([relax.transform.FuseTransposeMatmul(), relax.transform.LegalizeOps(),
                                    relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
                                    relax.transform.FuseTIR()])(mod)
    (func,) = [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    return func


def entry(knobs: CPUKnobs = KNOBS) -> TuneEntry:
    return TuneEntry(knobs, 1.5, 200.0, 2.0, 250.0, "2025-01-01T00:00:00+00:00", "NT_matmul")


def schedule(func: tirx.PrimFunc, db: TuningDB) -> tirx.PrimFunc:
    profile = get_profile("cpu")
    with profile.tvm_target():
        return dl.ApplyDefaultSchedule(*profile.tuning_space().rules(db.lookup))(tvm.IRModule({"main": func}))["main"]


def test_db_round_trips_and_looks_up_by_kernel(tmp_path, linear_func):
    profile = get_profile("cpu")
    db = TuningDB.for_profile(profile)
    assert db.path == tuning_dir() / f"{target_key(profile)}.json" == db_path(profile)
    assert db.entries == {} and db.lookup(linear_func) is None           # no file yet: empty
    db.entries[kernel_key(linear_func)] = entry()
    db.save()

    data = json.loads(db.path.read_text())
    assert data["version"] == 1 and data["target"] == profile.target
    assert data["entries"][kernel_key(linear_func)]["knobs"]["tile_m"] == 4
    assert sorted(p.name for p in db.path.parent.iterdir()) == [db.path.name]   # no temp file left
    loaded = TuningDB.for_profile(profile)
    assert loaded.entries == db.entries
    renamed = linear_func.with_attr("global_symbol", "another_name")   # the key ignores names
    assert loaded.lookup(renamed) == KNOBS


def test_db_path_is_under_kiln_cache_dir_and_per_target():
    cpu = get_profile("cpu")
    assert tuning_dir() == kiln.cache_dir() / "tuning"
    other = dataclasses.replace(cpu, target={**cpu.target, "num-cores": 64})
    assert target_key(cpu).startswith("cpu-") and target_key(other) != target_key(cpu)


def test_save_is_atomic(tmp_path, monkeypatch):
    db = TuningDB(tmp_path / "db.json", {"kind": "llvm"}, {"k": entry()})
    db.save()
    before = db.path.read_text()

    def broken_dump(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("kiln.targets.cpu.tuning.json.dump", broken_dump)
    db.entries["k2"] = entry()
    with pytest.raises(OSError, match="disk full"):
        db.save()
    assert db.path.read_text() == before                                  # the old file is intact
    assert [p.name for p in tmp_path.iterdir()] == ["db.json"]            # and no temp file is left


@pytest.mark.parametrize("content, problem", [
    ("{not json", "Expecting property name"),
    ('{"version": 99, "target": {"kind": "llvm"}, "entries": {}}', "not a version-1"),
    ('{"version": 1, "target": {"kind": "cuda"}, "entries": {}}', "another target"),
    ('{"version": 1, "target": {"kind": "llvm"}, "entries": []}', "'entries' is not an object"),
])
def test_bad_db_is_ignored_with_a_warning(tmp_path, content, problem):
    path = tmp_path / "db.json"
    path.write_text(content)
    with pytest.warns(UserWarning, match=problem):
        db = TuningDB.load(path, {"kind": "llvm"})
    assert db.entries == {}


def test_bad_entry_is_dropped_the_rest_kept(tmp_path):
    path = tmp_path / "db.json"
    good = entry().to_json()
    path.write_text(json.dumps({"version": 1, "target": {"kind": "llvm"}, "entries": {
        "good": good, "bad_knobs": {**good, "knobs": {"tile_m": 0}}, "no_knobs": {"us_m1": 1.0}}}))
    with pytest.warns(UserWarning) as record:
        db = TuningDB.load(path, {"kind": "llvm"})
    assert set(db.entries) == {"good"} and len(record) == 2


def test_db_knobs_change_the_schedule(linear_func):
    profile = get_profile("cpu")
    default = schedule(linear_func, TuningDB.for_profile(profile))
    db = TuningDB.for_profile(profile)
    db.entries[kernel_key(linear_func)] = entry()
    tuned = schedule(linear_func, db)
    assert TUNED_ATTR not in default.attrs
    assert tuned.attrs[TUNED_ATTR] == "tile_m=4,tile_n=2,unroll_k=2"
    assert not tvm_ffi.structural_equal(default.without_attr("tirx.is_scheduled"),
                                        tuned.without_attr(TUNED_ATTR).without_attr("tirx.is_scheduled"))
    # Both schedules compute x @ W.T (7 rows: not a multiple of either row tile).
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 7, 64)).astype("float32"), rng.standard_normal((96, 64)).astype("float32")
    for func in (default, tuned):
        lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                          target=profile.tvm_target()).jit()
        out = tvm.runtime.tensor(np.zeros((1, 7, 96), "float32"))
        lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w), out)
        np.testing.assert_allclose(out.numpy(), x @ w.T, rtol=1e-4, atol=1e-4)


def test_tune_then_compile_uses_the_db(tiny_dirs, tiny_artifacts, tmp_path):
    from kiln.compiler.tune import TuneOptions, tune_model
    from kiln.runtime import Artifact
    from kiln.runtime.model_runner import ModelRunner

    events = []
    report = tune_model(TuneOptions(model=str(tiny_dirs["tied"]), quant="q0f32", budget_minutes=0.3,
                                    max_kernels=6), events.append)
    assert report.results and events and events[-1].kernels == len(report.results) + report.left
    db = TuningDB.for_profile(get_profile("cpu"))
    assert db.path == report.db_path and set(db.entries) == {r.key for r in report.results}
    for e in db.entries.values():
        assert e.default_us_m1 or e.default_us_m128
    # Make every entry non-default (the search may have kept the defaults) so the numerics
    # below run schedules the defaults never produce.
    db.entries = {k: dataclasses.replace(e, knobs=dataclasses.replace(e.knobs, tile_m=1, tile_n=8, unroll_k=2))
                  for k, e in db.entries.items()}
    db.save()

    tuned = kiln.compile(str(tiny_dirs["tied"]), target="cpu", quant="q0f32", output=tmp_path / "tuned")
    assert json.loads((tuned / "kiln-config.json").read_text())["tuned_kernels"] >= len(db.entries)
    assert json.loads((tiny_artifacts["tied"] / "kiln-config.json").read_text())["tuned_kernels"] == 0

    ids = [5, 17, 33, 2, 101, 7, 64, 250, 3, 11]
    logits = []
    for art in (tiny_artifacts["tied"], tuned):
        runner = ModelRunner(Artifact.load(art))
        runner.add_sequence(0)
        prefill = runner.verify(0, ids)                                    # [10, vocab]: rows > 4
        decode = runner.decode([0], [42])                                  # [1, vocab]: the GEMV copies
        logits.append(np.concatenate([prefill, decode]))
    scale = max(1.0, float(np.abs(logits[0]).max()))
    assert float(np.abs(logits[1] - logits[0]).max()) <= 1e-4 * scale


def test_tune_help_names_the_database_path():
    from click.testing import CliRunner

    from kiln.cli import main
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = CliRunner().invoke(main, ["tune", "--help"]).output
    assert "$KILN_CACHE_DIR/tuning/" in out and "--budget" in out


def test_the_matmul_form_is_a_knob_the_search_tries_and_the_db_keeps():
    """CPUKnobs.outer (QuantMatmul's outer-product tile, AVX2's default): the search tries the other
    form right after the one-row GEMV tiles, the label names it, and a database entry keeps it (an
    entry written before the knob existed reads as the inner form)."""
    from kiln.targets.cpu.tuning import knobs_label
    space = get_profile("cpu").tuning_space()
    for default in (CPUKnobs(vector_lanes=8, outer=True), CPUKnobs(vector_lanes=16, tile_n=8)):
        tried = space.candidates(default)
        assert tried[4] == dataclasses.replace(default, outer=not default.outer)
        assert all(k.outer == default.outer for k in tried[5:])
        assert dataclasses.replace(default, outer=not default.outer) not in space.candidates(default, rows_tile=False)
    assert knobs_label(CPUKnobs(vector_lanes=8, outer=True)) == "tile_m=2,tile_n=4,unroll_k=1,outer"
    assert knobs_label(CPUKnobs(vector_lanes=8)) == "tile_m=2,tile_n=4,unroll_k=1"
    saved = TuneEntry(knobs=CPUKnobs(vector_lanes=8, outer=True), us_m1=1.0, us_m128=2.0, default_us_m1=1.0,
                      default_us_m128=3.0, tuned_at="2026-12-03T00:00:00Z", function="f")
    assert TuneEntry.from_json(saved.to_json()).knobs.outer
    old = saved.to_json()
    del old["knobs"]["outer"]
    assert TuneEntry.from_json(old).knobs == CPUKnobs(vector_lanes=8)
    with pytest.raises(ValueError, match="outer"):
        CPUKnobs(outer="yes")
