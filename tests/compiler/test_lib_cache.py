"""compiler/lib_cache.py: a compile whose pipeline leaves a module built before for the same target
copies that library instead of generating it again (another checkpoint of the same architecture, a
recompile), and computes what a fresh build computes; anything that changes the kernels builds
anew; a damaged entry is built again; KILN_LIB_CACHE=0 and --dump-ir build without it; `kiln cache`
lists and cleans the libraries."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from click.testing import CliRunner

import kiln
from kiln.cli import main
from kiln.compiler import lib_cache
from tiny_models import assert_prefill_and_decode_match, write_tiny_llama

pytestmark = pytest.mark.compiler
QUICK_LLVM = True      # compiles at LLVM -O0 (tests/conftest.py _quick_llvm): tiny models, builds most of the time
IDS = list(range(7, 30))


@pytest.fixture
def libs(tmp_path, monkeypatch):
    """A library cache of this test's own (the suite's is shared between its workers)."""
    root = tmp_path / "libs"
    monkeypatch.setenv("KILN_LIB_CACHE", str(root))
    return root


def _compile(src, out, quant="q0f32", **kw):
    """(artifact, whether its library came from the cache)."""
    return _compile_counted(src, out, quant, **kw)[:2]


def _compile_counted(src, out, quant="q0f32", **kw):
    """(artifact, whether its library came from the cache, how many kernels' objects it reused)."""
    stages = []
    art = kiln.compile(str(src), target="cpu", quant=quant, output=out, golden=False,
                       progress=lambda stage, *_: stages.append(stage), **kw)
    reused = [int(s.split(":")[1].split()[0]) for s in stages if s.endswith(" kernels reused")]
    return art, "compile:library reused" in stages, sum(reused)


def test_another_checkpoint_of_the_same_shapes_reuses_the_library_and_matches_transformers(libs, tmp_path):
    import transformers
    first, reused = _compile(write_tiny_llama(tmp_path / "a", tied=True, seed=3), tmp_path / "art-a")
    assert not reused and len(lib_cache.libraries()) == 1
    other = write_tiny_llama(tmp_path / "b", tied=True, seed=4)          # other weights, the same module
    second, reused = _compile(other, tmp_path / "art-b")
    assert reused and len(lib_cache.libraries()) == 1
    assert (second / "lib.so").read_bytes() == (first / "lib.so").read_bytes()
    reference = transformers.LlamaForCausalLM.from_pretrained(other, dtype=torch.float32).eval()
    assert_prefill_and_decode_match(second, reference, IDS, 1e-4)        # its own weights, the cached kernels


def test_what_changes_the_kernels_builds_anew(libs, tiny_dirs, tmp_path):
    """...and builds only the kernels no earlier build compiled: another quantization shares the
    attention, norm and sampling kernels; another context window, every kernel (their shapes are
    symbolic); the library linked from kept objects gives transformers' logits."""
    import transformers
    _, _, reused = _compile_counted(tiny_dirs["tied"], tmp_path / "q0")
    total = len(lib_cache.kernels())
    assert reused == 0 and total > 20
    _, whole, reused = _compile_counted(tiny_dirs["tied"], tmp_path / "q4", quant="q4f32")
    assert not whole and 0 < reused < total                                            # other kernels
    art, whole, reused = _compile_counted(tiny_dirs["tied"], tmp_path / "ctx", context_window=64)
    assert not whole and reused == total                                               # other shapes
    reference = transformers.LlamaForCausalLM.from_pretrained(tiny_dirs["tied"], dtype=torch.float32).eval()
    assert_prefill_and_decode_match(art, reference, IDS, 1e-4)
    assert not _compile(tiny_dirs["untied"], tmp_path / "untied")[1]                   # another module
    assert len(lib_cache.libraries()) == 4
    assert _compile(tiny_dirs["tied"], tmp_path / "again", quant="q4f32")[1]


def test_a_damaged_entry_is_built_again_and_replaced(libs, tiny_dirs, tmp_path):
    _compile(tiny_dirs["tied"], tmp_path / "a")
    (entry,) = lib_cache.libraries()
    data = bytearray(entry.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.path.write_bytes(bytes(data))
    art, reused = _compile(tiny_dirs["tied"], tmp_path / "b")
    assert not reused
    assert kiln.Artifact.load(art) and entry.path.read_bytes() == (art / "lib.so").read_bytes() != bytes(data)
    assert _compile(tiny_dirs["tied"], tmp_path / "c")[1]
    # A damaged kernel object is compiled again (and replaced); the others are linked as kept.
    objects = lib_cache.kernels()
    damaged = objects[0].path
    damaged.write_bytes(damaged.read_bytes()[:-8] + b"damaged!")
    art, whole, reused = _compile_counted(tiny_dirs["tied"], tmp_path / "d", context_window=64)
    assert not whole and reused == len(objects) - 1
    assert hashlib.sha256(damaged.read_bytes()).hexdigest()[:16] == damaged.stem.split("-")[1]
    assert kiln.Artifact.load(art)


def test_off_and_dump_ir_build_without_the_cache(tmp_path, tiny_dirs, monkeypatch):
    monkeypatch.setenv("KILN_LIB_CACHE", "0")
    assert lib_cache.cache_root() is None
    assert not _compile(tiny_dirs["tied"], tmp_path / "a")[1]
    monkeypatch.setenv("KILN_LIB_CACHE", str(tmp_path / "libs"))
    _compile(tiny_dirs["tied"], tmp_path / "b")
    art, reused = _compile(tiny_dirs["tied"], tmp_path / "c", dump_ir=tmp_path / "ir")
    assert not reused and (tmp_path / "ir" / "4-finalize.py").is_file()


def test_cache_list_and_clean_count_the_libraries(libs, tiny_dirs, tmp_path):
    from kiln.targets.cpu.attention import attention_paged_cpu
    from kiln.targets.kernel_memo import parsed_once
    _compile(tiny_dirs["tied"], tmp_path / "a")
    parsed_once()(attention_paged_cpu.__wrapped__)(2, 4, 16, "float32", 16, True)    # a parse this cache keeps
    runner = CliRunner()
    listed = runner.invoke(main, ["cache", "list"])
    assert listed.exit_code == 0 and "1 built libraries" in listed.output and str(libs) in listed.output
    rows = [json.loads(line) for line in runner.invoke(main, ["cache", "list", "--json"]).output.splitlines()]
    (lib,) = [r for r in rows if r["kind"] == "library"]
    assert lib["path"] == str(lib_cache.libraries()[0].path) and lib["bytes"] > 0
    kept = runner.invoke(main, ["cache", "clean", "--older-than", "7d"])
    assert kept.exit_code == 0 and len(lib_cache.libraries()) == 1
    kernels = [r for r in rows if r["kind"] == "kernel"]
    assert kernels and {r["path"] for r in kernels} == {str(k.path) for k in lib_cache.kernels()}
    assert f"{len(kernels)} compiled kernels" in listed.output
    parsed = [r for r in rows if r["kind"] == "parsed"]
    assert parsed and {r["path"] for r in parsed} == {str(k.path) for k in lib_cache.parsed_kernels()}
    assert f"{len(parsed)} parsed kernels" in listed.output
    scheduled = [r for r in rows if r["kind"] == "scheduled"]          # targets/schedule_memo.py
    assert scheduled and {r["path"] for r in scheduled} == {str(k.path) for k in lib_cache.kept("scheduled")}
    assert f"{len(scheduled)} scheduled kernels" in listed.output
    gone = runner.invoke(main, ["cache", "clean"])
    assert gone.exit_code == 0 and "1 built libraries" in gone.output
    assert f"{len(kernels)} compiled kernels" in gone.output and f"{len(parsed)} parsed kernels" in gone.output
    assert f"{len(scheduled)} scheduled kernels" in gone.output
    assert lib_cache.libraries() == lib_cache.kernels() == lib_cache.parsed_kernels() == []
    assert lib_cache.kept("scheduled") == []
    assert not list(libs.glob("*.sha256"))
