"""targets/schedule_memo.py: a kernel's schedule is kept in the library cache and not made again; the
pipeline leaves the module a fresh schedule leaves (the same library key, transformers' logits); a
knob, the tuning database or a damaged file schedules anew; a kernel and its GEMV copy are kept
together (they are later joined by identity)."""

from __future__ import annotations

import pytest
import torch
import tvm
from tvm import tirx

import kiln
from kiln.compiler import lib_cache
from kiln.targets import schedule_memo
from tiny_models import assert_prefill_and_decode_match

pytestmark = pytest.mark.compiler
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
IDS = list(range(7, 30))


@pytest.fixture
def scheduled(tmp_path, monkeypatch):
    """A library cache of this test's own, and how many kernels each compile scheduled (those
    ScheduleOnce did not find kept), in order."""
    monkeypatch.setenv("KILN_LIB_CACHE", str(tmp_path / "libs"))
    counts = []
    opened, kept = schedule_memo.Scheduled.open.__func__, schedule_memo.Scheduled.keep

    def open_counted(cls, *args, **kwargs):
        counts.append(0)
        return opened(cls, *args, **kwargs)

    def keep_counted(self, key, funcs):
        counts[-1] += len(funcs)
        return kept(self, key, funcs)

    monkeypatch.setattr(schedule_memo.Scheduled, "open", classmethod(open_counted))
    monkeypatch.setattr(schedule_memo.Scheduled, "keep", keep_counted)
    return counts


def _compile(src, out, **kw):
    stages = []
    art = kiln.compile(str(src), target="cpu", quant="q0f32", output=out, golden=False,
                       progress=lambda stage, *_: stages.append(stage), **kw)
    return art, "compile:library reused" in stages


def test_kept_schedules_build_the_module_a_fresh_schedule_builds(scheduled, tiny_dirs, tmp_path):
    import transformers
    _, reused = _compile(tiny_dirs["tied"], tmp_path / "a")
    assert not reused and scheduled[-1] > 20
    kept = lib_cache.kept("scheduled")
    assert kept and len(kept) < scheduled[-1]                  # groups: a kernel with its GEMV copies
    for f in lib_cache.kernels():                             # only the library, found by the module's key
        f.path.unlink()
    art, reused = _compile(tiny_dirs["tied"], tmp_path / "b")
    assert reused and scheduled[-1] == 0                      # nothing scheduled, the same module
    assert (art / "lib.so").read_bytes() == (tmp_path / "a" / "lib.so").read_bytes()
    for lib in lib_cache.libraries():
        lib.path.unlink()
    art, reused = _compile(tiny_dirs["tied"], tmp_path / "c")  # compiled from the kept schedules
    assert not reused and scheduled[-1] == 0
    reference = transformers.LlamaForCausalLM.from_pretrained(tiny_dirs["tied"], dtype=torch.float32).eval()
    assert_prefill_and_decode_match(art, reference, IDS, 1e-4)


def test_a_knob_or_the_tuning_database_schedules_anew(scheduled, tiny_dirs, tmp_path, monkeypatch):
    from kiln.targets import get_profile
    from kiln.targets.cpu import schedule
    from kiln.targets.cpu.tuning import TuningDB
    _compile(tiny_dirs["untied"], tmp_path / "a")
    first = scheduled[-1]
    _compile(tiny_dirs["untied"], tmp_path / "b", context_window=64)     # kernels over symbolic lengths:
    assert first > 0 and scheduled[-1] == 0                               # the same ones, found
    monkeypatch.setattr(schedule, "A_BLOCK_BYTES", schedule.A_BLOCK_BYTES * 2)    # a knob a rule reads
    _compile(tiny_dirs["untied"], tmp_path / "c")
    assert scheduled[-1] == first
    monkeypatch.undo()
    monkeypatch.setenv("KILN_LIB_CACHE", str(tmp_path / "libs"))
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))        # where the tuning database lives
    TuningDB.for_profile(get_profile("cpu")).save()                     # an empty one: other bytes, another key
    _compile(tiny_dirs["untied"], tmp_path / "d")
    assert scheduled[-1] == first


def test_a_damaged_schedule_is_made_again_and_replaced(scheduled, tiny_dirs, tmp_path):
    _compile(tiny_dirs["tied"], tmp_path / "a")
    damaged = lib_cache.kept("scheduled")[0].path
    damaged.write_bytes(damaged.read_bytes()[:-10] + b"damaged!!!")
    for lib in lib_cache.libraries():
        lib.path.unlink()
    art, _ = _compile(tiny_dirs["tied"], tmp_path / "b")
    assert 0 < scheduled[-1] < scheduled[0]                   # that file's kernels alone
    assert kiln.Artifact.load(art)
    assert damaged.name in {f.path.name for f in lib_cache.kept("scheduled")}
    import hashlib
    assert hashlib.sha256(damaged.read_bytes()).hexdigest()[:16] == damaged.stem.split("-")[1]


def test_kernels_sharing_a_param_are_one_group():
    a, b, c = (tirx.Var(name, "handle") for name in "abc")
    first = tirx.PrimFunc([a, b], tirx.Evaluate(0))
    copy = tirx.PrimFunc([a, b], tirx.Evaluate(1))        # a copy scheduled apart keeps the params
    alone = tirx.PrimFunc([c], tirx.Evaluate(0))
    gvs = [tvm.ir.GlobalVar(name) for name in ("first", "alone", "copy")]
    groups = schedule_memo._sharing(list(zip(gvs, [first, alone, copy])))
    assert [[gv.name_hint for gv, _ in g] for g in groups] == [["first", "copy"], ["alone"]]
