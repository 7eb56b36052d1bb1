"""compiler/codegen.py: kernels compiled as parts on threads give relax.build's executable, in the
process and exported (a shared library, a .tar of objects), and a part's failure reaches the caller;
with kept kernel objects (lib_cache.KernelObjects) only the kernels none holds are compiled, and the
library linked from the kept ones computes the same."""

from __future__ import annotations

import tarfile

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from kiln.compiler import codegen
from kiln.targets import get_profile


class _Block(nn.Module):
    def __init__(self) -> None:
        self.up = nn.Linear(16, 32, bias=True)
        self.down = nn.Linear(32, 8, bias=False)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.softmax(self.down(nn.op.silu(self.up(x))), axis=-1)


@pytest.fixture(scope="module")
def lowered():
    mod, params = _Block().export_tvm(spec={"forward": {"x": nn.spec.Tensor([2, 16], "float32")}})
    target = get_profile("cpu").tvm_target()
    with target:
        lowered = relax.get_pipeline("default")(mod)
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal([int(d) for d in p.shape]).astype("float32") for _, p in params]
    return lowered, target, weights


def _run(vm_source, weights, x) -> np.ndarray:
    vm = relax.VirtualMachine(vm_source, tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in (x, *weights)]
    return vm["forward"](*args).numpy()


def test_parts_give_relax_builds_executable(lowered, tmp_path):
    mod, target, weights = lowered
    kernels = sum(isinstance(f, tvm.tirx.PrimFunc) for _, f in mod.functions_items())
    assert kernels >= 3
    x = np.random.default_rng(1).standard_normal([2, 16]).astype("float32")
    whole = codegen.build(mod, target, False, parts=1)
    expected = _run(whole, weights, x)
    parted = codegen.build(mod, target, False, parts=3)
    assert len(parted.mod._collect_dso_modules()) == 3
    np.testing.assert_array_equal(_run(parted, weights, x), expected)
    parted.export_library(str(tmp_path / "lib.so"))
    np.testing.assert_array_equal(_run(tvm.runtime.load_module(str(tmp_path / "lib.so")), weights, x), expected)
    parted.export_library(str(tmp_path / "lib.tar"))
    with tarfile.open(tmp_path / "lib.tar") as tar:
        assert sorted(tar.getnames()) == ["devc.o", "lib0.o", "lib1.o", "lib2.o"]


def test_more_parts_than_kernels_and_a_system_library_build_whole(lowered):
    mod, target, _ = lowered
    kernels = sum(isinstance(f, tvm.tirx.PrimFunc) for _, f in mod.functions_items())
    assert len(codegen.build(mod, target, False, parts=kernels + 5).mod._collect_dso_modules()) == kernels
    assert len(codegen.build(mod, target, True, parts=3).mod._collect_dso_modules()) == 1


def test_a_failing_part_raises_in_the_caller(lowered, monkeypatch):
    mod, target, _ = lowered
    real = tvm.tirx.build

    def build(part, target):
        if "softmax" in " ".join(gv.name_hint for gv in part.get_global_vars()):
            raise RuntimeError("no code for softmax")
        return real(part, target=target)

    monkeypatch.setattr(tvm.tirx, "build", build)
    with pytest.raises(RuntimeError, match="no code for softmax"):
        codegen.build(mod, target, False, parts=3)


def test_kept_kernel_objects_are_linked_instead_of_compiled(lowered, tmp_path, monkeypatch):
    from kiln.compiler.lib_cache import KernelObjects, environment_digest
    mod, target, weights = lowered
    kernels = sum(isinstance(f, tvm.tirx.PrimFunc) for _, f in mod.functions_items())
    x = np.random.default_rng(1).standard_normal([2, 16]).astype("float32")
    expected = _run(codegen.build(mod, target, False, parts=1), weights, x)
    objects = KernelObjects(tmp_path / "kernels", environment_digest(target))
    first = codegen.build(mod, target, False, parts=3, objects=objects)
    assert first.reused == 0 and len(first.mod._collect_dso_modules()) == kernels       # a module per kernel
    first.export_library(str(tmp_path / "first.so"))
    assert len(list((tmp_path / "kernels").glob("*.o"))) == kernels
    compiled = []
    real = tvm.tirx.build
    monkeypatch.setattr(tvm.tirx, "build",
                        lambda m, target: compiled.append(len(m.get_global_vars())) or real(m, target=target))
    again = codegen.build(mod, target, False, parts=3, objects=objects)
    assert again.reused == kernels and compiled == [0]            # only the empty module the VM links to
    again.export_library(str(tmp_path / "again.so"))
    np.testing.assert_array_equal(_run(tvm.runtime.load_module(str(tmp_path / "again.so")), weights, x), expected)
    again.export_library(str(tmp_path / "again.tar"))
    with tarfile.open(tmp_path / "again.tar") as tar:
        assert sum(name.startswith("kept") for name in tar.getnames()) == kernels
    # An export that cannot link objects (TVM's own, to another format) compiles the kept ones after all.
    kept = codegen.build(mod, target, False, parts=3, objects=objects)
    kept.export_library(str(tmp_path / "lib.so.1"))
    assert kept.reused == 0 and compiled.count(1) == kernels
    np.testing.assert_array_equal(_run(kept, weights, x), expected)


def test_kernel_keys_reuse_the_library_keys_json_and_stay_the_same(lowered, tmp_path, monkeypatch):
    """A build's library key and its kernels' keys serialize the same PrimFuncs: with the library key's
    SavedJSON the kernels' keys write none again, and they are the keys written without it."""
    import hashlib

    from kiln.compiler.lib_cache import KernelObjects, SavedJSON, environment_digest, hash_functions
    mod, target, _ = lowered
    saves = []
    real = tvm.ir.save_json
    monkeypatch.setattr(tvm.ir, "save_json", lambda node: saves.append(type(node).__name__) or real(node))
    saved = SavedJSON()
    hash_functions(hashlib.sha256(), mod, saved)                          # the library's key
    kernels = saves.count("PrimFunc")
    assert kernels == sum(isinstance(f, tvm.tirx.PrimFunc) for _, f in mod.functions_items())
    memoized = codegen.build(mod, target, False, parts=3,
                             objects=KernelObjects(tmp_path / "kernels", environment_digest(target), saved))
    assert saves.count("PrimFunc") == kernels                             # no kernel written again
    memoized.export_library(str(tmp_path / "first.so"))
    plain = codegen.build(mod, target, False, parts=3,
                          objects=KernelObjects(tmp_path / "kernels", environment_digest(target)))
    assert plain.reused == kernels                                        # the same keys, found
