"""Every WGSL kernel of the webgpu artifact, validated by a real WebGPU implementation: wgpu-native
(naga's WGSL front end, then a compute pipeline on Mesa's lavapipe Vulkan driver, a CPU device).
q4f32 (the preset's default) and q4f16 (with the shader-f16 feature). The sources checked are the
ones the artifact's library carries."""

from __future__ import annotations

import re
import tarfile

import pytest

from gpu_kernels import build

pytestmark = pytest.mark.compiler
wgpu = pytest.importorskip("wgpu", reason="wgpu is not installed (pip install wgpu)")


@pytest.fixture(scope="module")
def adapter():
    try:
        found = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as e:  # no Vulkan loader or driver: wgpu raises its own error types
        pytest.skip(f"no WebGPU adapter here ({type(e).__name__}); apt-get install mesa-vulkan-drivers")
    if found is None:
        pytest.skip("no WebGPU adapter here; apt-get install mesa-vulkan-drivers")
    return found


def wgsl_kernels(source: str) -> dict[str, str]:
    """TVM's WebGPU source, one section per kernel (`// Function: NAME` then a rule), by name."""
    parts = re.split(r"^// Function: (\w+)\n//-+\n", source, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2) if parts[i + 1].strip()}


@pytest.mark.parametrize("quant", ["q4f32", pytest.param("q4f16", marks=pytest.mark.slow)])
def test_every_wgsl_kernel_validates(adapter, quant, tiny_dirs, tmp_path):
    features = ["shader-f16"] if quant.endswith("f16") else []
    if not set(features) <= set(adapter.features):
        pytest.skip(f"this WebGPU adapter lacks {features}")
    built = build(tiny_dirs["tied"], "webgpu", quant)
    lib = tmp_path / "lib.tar"
    built.profile.export(built.executable, lib)
    with tarfile.open(lib) as tar:
        carried = tar.extractfile("devc.o").read()
    kernels = wgsl_kernels(built.device_source())
    funcs = {n for n, f in built.prim_funcs().items() if 'thread="threadIdx.' in f.script()}
    assert {f for f in funcs if not any(k.startswith(f"{f}_kernel") for k in kernels)} == set()
    assert len(kernels) > 30
    device = adapter.request_device_sync(required_features=features)
    invalid = {}
    for name, code in kernels.items():
        assert code.rstrip().encode() in carried, f"{name}: not in the artifact's library"
        try:
            module = device.create_shader_module(code=code)
            device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": name})
        except Exception as e:  # wgpu's GPUValidationError and friends: the message is naga's
            invalid[name] = str(e).strip().splitlines()[-1][:200]
    assert not invalid, invalid
    if quant.endswith("f16"):
        assert any("enable f16;" in code for code in kernels.values())
