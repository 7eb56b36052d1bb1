"""Every WGSL kernel of the webgpu artifact, validated by a real WebGPU implementation: wgpu-native
(naga's WGSL front end, then a compute pipeline on Mesa's lavapipe Vulkan driver, a CPU device).
q4f32 (the preset's default) and q4f16 (with the shader-f16 feature). The sources checked are the
ones the artifact's library carries. The 4-bit GEMV then runs there against numpy."""

from __future__ import annotations

import re
import struct
import tarfile

import numpy as np
import pytest

from kiln.compiler.quant_modules import QuantFormat
from kiln.compiler.quant_pack import dequantize, quantize

from gpu_kernels import build, build_prim_func, buffers, is_q4_matmul, launch, shape_values
from sampling_cases import host_tokens, sampling_case

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


def invalid_kernels(device, kernels: dict[str, str]) -> dict[str, str]:
    """The kernels (name -> WGSL) WebGPU will not make a compute pipeline of, with naga's message."""
    invalid = {}
    for name, code in kernels.items():
        try:
            device.create_compute_pipeline(layout="auto", compute={
                "module": device.create_shader_module(code=code), "entry_point": name})
        except Exception as e:  # wgpu's GPUValidationError and friends: the message is naga's
            invalid[name] = str(e).strip().splitlines()[-1][:200]
    return invalid


def wgsl_kernels(source: str) -> dict[str, str]:
    """TVM's WebGPU source, one section per kernel (`// Function: NAME` then a rule), by name."""
    parts = re.split(r"^// Function: (\w+)\n//-+\n", source, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2) if parts[i + 1].strip()}


@pytest.fixture(scope="module")
def q4f32(tiny_dirs):
    return build(tiny_dirs["tied"], "webgpu", "q4f32")


@pytest.mark.parametrize("quant", ["q4f32", pytest.param("q4f16", marks=pytest.mark.slow)])
def test_every_wgsl_kernel_validates(adapter, quant, tiny_dirs, tmp_path, request):
    features = ["shader-f16"] if quant.endswith("f16") else []
    if not set(features) <= set(adapter.features):
        pytest.skip(f"this WebGPU adapter lacks {features}")
    built = request.getfixturevalue("q4f32") if quant == "q4f32" else build(tiny_dirs["tied"], "webgpu", quant)
    lib = tmp_path / "lib.tar"
    built.profile.export(built.executable, lib)
    with tarfile.open(lib) as tar:
        carried = tar.extractfile("devc.o").read()
    kernels = wgsl_kernels(built.device_source())
    funcs = {n for n, f in built.prim_funcs().items() if 'thread="threadIdx.' in f.script()}
    assert {f for f in funcs if not any(k.startswith(f"{f}_kernel") for k in kernels)} == set()
    assert len(kernels) > 30
    for name, code in kernels.items():
        assert code.rstrip().encode() in carried, f"{name}: not in the artifact's library"
    invalid = invalid_kernels(adapter.request_device_sync(required_features=features), kernels)
    assert not invalid, invalid
    if quant.endswith("f16"):
        assert any("enable f16;" in code for code in kernels.values())


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_recurrent_kernels_validate_on_webgpu(adapter, dtype):
    """The recurrent-state kernels' GPU forms (targets/recurrent.py: the conv in the artifact's dtype, the gated
    delta rule and without its delta Mamba-2's scan, float32 states; Mamba-1's scan) compiled for the webgpu
    preset, at Qwen3.5-9B's, Granite-4.0-H-Small's and Falcon Mamba 7B's sizes, pass WebGPU's validation."""
    from kiln.targets.recurrent import gated_delta, selective_scan, state_conv
    features = ["shader-f16"] if dtype == "float16" else []
    if not set(features) <= set(adapter.features):
        pytest.skip(f"this WebGPU adapter lacks {features}")
    device = adapter.request_device_sync(required_features=features)
    invalid = {}
    for name, func in (("recurrent_conv", state_conv(8192, 4, dtype, gpu=True)),
                       ("recurrent_delta", gated_delta(16, 32, 128, 128, gpu=True)),
                       ("recurrent_scan", gated_delta(1, 128, 128, 64, gpu=True, delta=False)),
                       ("recurrent_selective_scan", selective_scan(8192, 16, gpu=True))):
        kernels = wgsl_kernels(build_prim_func(name, func, "webgpu").artifact_source)
        assert kernels, name
        invalid.update(invalid_kernels(device, kernels))
    assert not invalid, invalid


@pytest.mark.parametrize("family", ["zamba2", "recurrent-gemma"])
def test_recurrent_families_kernels_validate_on_webgpu(family, tmp_path, request):
    """Every WGSL kernel of a tiny Zamba 2 (its dt floored at time_step_min: once a min against an infinity that
    WGSL cannot write) and RecurrentGemma (the RG-LRU's block-diagonal gates, its recurrence a scan with a head a
    channel) built for webgpu passes WebGPU's validation. (The model is written and built before the adapter is
    opened: torch's libraries loaded after lavapipe's crash in their initialisers.)"""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "numerics"))
    from test_recurrent_gemma import CONFIG as RECURRENT_GEMMA
    from test_zamba2 import CASES as ZAMBA2
    from tiny_models import write_widened
    model, config, cfg = {"zamba2": ("Zamba2ForCausalLM", "Zamba2Config", ZAMBA2["rope-adapters"]),
                          "recurrent-gemma": ("RecurrentGemmaForCausalLM", "RecurrentGemmaConfig", RECURRENT_GEMMA)
                          }[family]
    write_widened(model, config, cfg, tmp_path / "hf")
    kernels = wgsl_kernels(build(tmp_path / "hf", "webgpu", "q4f32").device_source())
    invalid = invalid_kernels(request.getfixturevalue("adapter").request_device_sync(), kernels)
    assert len(kernels) > 100 and not invalid, invalid


def _run_wgsl(device, code: str, entry: str, arrays: dict[str, np.ndarray], values: dict[str, int],
              blocks: tuple[int, int, int]) -> dict[str, np.ndarray]:
    """Dispatch one WGSL kernel: storage bindings by buffer name (NAME_ptr), the PODArgs uniform
    from `values` (packGridDimX: the last block index), and every storage buffer read back."""
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
    entries, storage = [], {}
    for binding, kind, var in re.findall(r"@binding\((\d+)\) var<(storage|uniform)[^>]*> (\w+) :", code):
        if kind == "storage":
            name = var.removesuffix("_ptr")
            storage[name] = buf = device.create_buffer_with_data(data=np.ascontiguousarray(arrays[name]), usage=usage)
        else:
            fields = re.search(r"struct PODArgs \{([^}]*)\}", code).group(1)
            packed = b""
            for field, kind_ in re.findall(r"(\w+): (\w+)", fields):
                value = blocks[0] - 1 if field == "packGridDimX" else values[field]
                packed += struct.pack({"i32": "<i", "u32": "<I", "f32": "<f"}[kind_], value)
            buf = device.create_buffer_with_data(data=packed + bytes(-len(packed) % 16),
                                                 usage=wgpu.BufferUsage.UNIFORM)
        entries.append({"binding": int(binding), "resource": {"buffer": buf, "offset": 0, "size": buf.size}})
    pipeline = device.create_compute_pipeline(layout="auto", compute={
        "module": device.create_shader_module(code=code), "entry_point": entry})
    group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, group)
    compute.dispatch_workgroups(*blocks)
    compute.end()
    device.queue.submit([encoder.finish()])
    return {n: np.frombuffer(device.queue.read_buffer(b), arrays[n].dtype).reshape(arrays[n].shape)
            for n, b in storage.items()}


def test_q4_gemv_runs_on_webgpu(adapter, q4f32):
    name = next(n for n, f in sorted(q4f32.prim_funcs().items()) if is_q4_matmul(f, "one"))
    func = q4f32.func(name)
    qweight, scale, x, out = buffers(func)
    n, k = int(qweight.shape[0]), int(qweight.shape[1]) * 8
    rng = np.random.default_rng(1)
    fmt = QuantFormat("q4", k // int(scale.shape[1]), "float32")
    planes = quantize(fmt, rng.normal(0, 0.5, (n, k)).astype(np.float32))
    xs = rng.normal(0, 1, (1, 1, k)).astype(np.float32)
    arrays = {qweight.name: planes["qweight"], scale.name: planes["scale"], x.name: xs,
              out.name: np.zeros((1, 1, n), np.float32)}
    values = shape_values(func, arrays)
    blocks, _threads = launch(func, values)
    got = _run_wgsl(adapter.request_device_sync(), wgsl_kernels(q4f32.device_source())[f"{name}_kernel"],
                    f"{name}_kernel", arrays, values, blocks)[out.name]
    np.testing.assert_allclose(got[0, 0], xs[0, 0] @ dequantize(fmt, planes).T, rtol=1e-4, atol=1e-4)


def test_sample_tokens_runs_on_webgpu(adapter, q4f32):
    """sample_tokens' WGSL (models/sampling.py: a work-group per row, the threshold searches in
    uint32 key arithmetic) draws the host Sampler's token in every row, given its uniform."""
    name = next(n for n in sorted(q4f32.prim_funcs()) if n.startswith("sample_tokens"))
    func = q4f32.func(name)
    logits, params, out = buffers(func)
    x, p = sampling_case(24, int(logits.shape[-1]), seed=11)
    arrays = {logits.name: x, params.name: p, out.name: np.full(24, -7, np.int32)}
    values = shape_values(func, arrays)
    blocks, _threads = launch(func, values)
    got = _run_wgsl(adapter.request_device_sync(), wgsl_kernels(q4f32.device_source())[f"{name}_kernel"],
                    f"{name}_kernel", arrays, values, blocks)[out.name]
    np.testing.assert_array_equal(got, host_tokens(x, p))
