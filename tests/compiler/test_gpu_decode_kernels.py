"""What a GPU decode step runs (issue 10): batch_decode, the function the runtime calls every
step at any batch size, read from a q4f16 CUDA build's scheduled IR."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.compiler


def _called(funcs: dict[str, str], relax_func: str) -> list[str]:
    return re.findall(r"R\.call_tir\(cls\.(\w+)", funcs[relax_func])


def test_batch_decode_matmuls_branch_on_rows(dumped_ir):
    """The MMA GEMV at one row (over a view of the first row), 2, 3-4, 5-8 and 9-16 rows, 32 x 32
    tensor-core tiles up to 64, dlight's tiled matmul above (targets/gpu.py LOW_BATCH_BRANCHES). The
    tiny model's K (64) is no multiple of the MMA GEMV's 128: dlight's GEMV and buckets take its
    branches (tests/compiler/test_mma_gemv.py builds the MMA GEMV's)."""
    funcs = dumped_ir("cuda", "schedule")
    matmuls = sorted({f for f in _called(funcs, "batch_decode") if "_NT_matmul" in f})
    assert len(matmuls) >= 5                     # qkv, o, gate-up, down, lm head
    for name in matmuls:
        bounds = re.findall(r"T\.tvm_thread_invariant\(batch_size <= T\.int64\((\d+)\)\)", funcs[name])
        assert bounds == ["1", "2", "4", "8", "16", "64"], name
        first = funcs[name].split("T.tvm_thread_invariant(batch_size <= T.int64(2))")[0]
        assert re.search(r"= T\.match_buffer\(\w+\[T\.int64\(0\), T\.int64\(0\), T\.int64\(0\):", first), name


def test_batch_decode_has_no_cast_kernels(dumped_ir):
    """AccumulateInFloat32 sums the matmuls in float32 and casts to float16: the cast is the
    quantized matmul's epilogue, not a kernel reading the float32 sums back."""
    called = _called(dumped_ir("cuda", "schedule"), "batch_decode")
    assert not [f for f in called if re.search(r"(^|_)cast\d*(_|$)", f)], called
    assert sum(f.endswith("_relax_astype") for f in called) >= 4


def test_narrow_tensor_core_branch_builds_for_cuda(tiny_dirs):
    """The branch for 5-64 rows: 32 x 32 wmma tiles (targets/narrow_tiles.py, 4 warps) build into the
    tiny model's CUDA library, a 128-thread tensor-core kernel for every matmul over batch_size
    rows; on a target without tensor cores the rule stands aside."""
    from gpu_kernels import build, cuda_kernels

    from kiln.targets import get_profile, gpu
    from kiln.targets.narrow_tiles import NarrowTensorCoreMatmul

    built = build(tiny_dirs["tied"], "cuda", "q4f16")
    source = built.executable.mod.imports[0].imports[0].inspect_source()
    narrow = {name: body for name, (threads, body) in cuda_kernels(source).items() if threads == 128}
    batch = [name for name, f in built.prim_funcs().items() if "_NT_matmul" in name and "batch_size" in f.script()]
    assert batch
    for name in batch:
        kernels = [body for k, body in narrow.items() if k.startswith(f"{name}_kernel")]
        assert any("wmma::mma_sync" in body for body in kernels), name
    func = built.prim_funcs()[batch[0]]
    assert NarrowTensorCoreMatmul().apply(func, get_profile("android-opencl").tvm_target(), False) is None
    assert [b for _, b in gpu.LOW_BATCH_BRANCHES if isinstance(b, NarrowTensorCoreMatmul)][0].rows == 32


def _q4_matmul(n: int, k: int):
    """[batch_size, 1, k] x kiln's q4 [n, k] (float32 sums) cast to float16, as batch_decode has it."""
    import tvm
    from tvm import te

    from kiln.compiler.quant_modules import QuantFormat, dequantize_element
    i64 = lambda v: tvm.tirx.IntImm("int64", v)                              # noqa: E731
    fmt = QuantFormat("q4", 32, "float16")
    rows = tvm.tirx.Var("batch_size", "int64")
    words = te.placeholder((i64(n), i64(k // 8)), "uint32", name="qweight")
    scale = te.placeholder((i64(n), i64(k // 32)), "float16", name="scale")
    x = te.placeholder((rows, i64(1), i64(k)), "float16", name="x")
    deq = te.compute((i64(n), i64(k)), lambda r, c: dequantize_element(fmt, "float16", words, scale, None, r, c),
                     name="dequantize")
    j = te.reduce_axis((i64(0), i64(k)), name="k")
    out = te.compute((rows, i64(1), i64(n)), lambda a, b, r: te.sum(
        x[a, b, j].astype("float32") * deq[r, j].astype("float32"), axis=j), name="NT_matmul")
    cast = te.compute(out.shape, lambda a, b, r: out[a, b, r].astype("float16"), name="compute")
    return te.create_prim_func([words, scale, x, cast])


def _scheduled(rule, func):
    """`rule` applied for cuda-sm90 (None where it refuses): the PrimFunc, named mm."""
    import tvm

    from kiln.targets import get_profile
    from kiln.targets.gpu import load_tensor_core_intrinsics, tensorize_works
    if not tensorize_works():
        pytest.skip("this apache-tvm-ffi crashes in Tensorize (targets/gpu.py tensorize_works)")
    load_tensor_core_intrinsics()
    with get_profile("cuda-sm90").tvm_target():
        sch = rule.apply(func, tvm.target.Target.current(), False)
    assert sch is not None
    func = sch.mod["main"] if isinstance(sch, tvm.s_tir.Schedule) else sch
    return func.with_attr("tirx.is_scheduled", True).with_attr("global_symbol", "mm")


def _cuda_build(func):
    """(device source, host LLVM IR) of `func` built alone for cuda-sm90."""
    import tvm

    from kiln.targets import get_profile
    lib = tvm.compile(tvm.IRModule({"mm": func}), target=get_profile("cuda-sm90").tvm_target()).mod
    return lib.imports[0].inspect_source(), lib.inspect_source()


def test_tensor_core_tiles_stage_4bit_groups_with_128_bit_loads(tmp_path):
    """NarrowTensorCoreMatmul(group_loads=True) (a gpu_checks variant): each thread stages a group of
    32 weight values, its 4 packed words in one 128-bit load into a 4-word register buffer (not one
    the size of the tile), dequantized into shared memory 4 values a store (TVM writes 8 32-bit lanes
    as a ulonglong4 nvcc refuses); the wmma tiles after; nvcc compiles it."""
    from gpu_kernels import nvcc_compiles

    from kiln.targets.narrow_tiles import NarrowTensorCoreMatmul
    rule = NarrowTensorCoreMatmul(warp_rows=2, warp_cols=2, k_frags=8, group_loads=True)
    source, _ = _cuda_build(_scheduled(rule, _q4_matmul(512, 1024)))
    assert re.search(r"uint qweight_local_ptr\[4\];", source)
    assert "*(uint4*)(qweight_local_ptr + 0) = *(uint4*)(qweight_ptr" in source
    assert "wmma::mma_sync" in source
    nvcc_compiles(source, tmp_path)


@pytest.mark.parametrize("group", [False, True])
def test_split_k_tiles_sum_the_slices_in_a_second_kernel(group, tmp_path):
    """With target_blocks (gpu_checks' splitk and tcsplit): the 8B's down projection (4096 columns:
    128 tiles) splits K in 8, each block's float32 sums to a workspace that is a parameter of the
    function, [slices, 1, rows padded to the tile, N] (no device allocation inside it: the host code
    asks for no workspace), added by a second, 256-thread kernel; nvcc compiles both. The gate-up
    projection (28,672 columns, 896 tiles) is not split."""
    from gpu_kernels import nvcc_compiles

    from kiln.targets.narrow_tiles import NarrowTensorCoreMatmul
    from kiln.targets.workspace_outputs import workspace_count
    extra = {"k_frags": 8, "group_loads": True} if group else {}
    rule = NarrowTensorCoreMatmul(warp_rows=2, warp_cols=2, target_blocks=1024, **extra)
    assert (rule.split_count(4096, 14336), rule.split_count(28672, 4096), rule.split_count(4096, 4096)) == (8, 1, 8)
    func = _scheduled(rule, _q4_matmul(4096, 14336))
    assert workspace_count(func) == 1
    ws = func.params[-1]
    assert str(ws.dtype) == "float32" and [int(d) for d in (ws.shape[0], ws.shape[1], ws.shape[3])] == [8, 1, 4096]
    assert "batch_size" in str(ws.shape[2])                  # the rows, padded to the tile
    source, host = _cuda_build(func)
    kernels = re.findall(r"__launch_bounds__\((\d+)\) (\w+)\(", source)
    assert sorted(set(kernels)) == [("128", "mm_kernel"), ("256", "mm_kernel_1")]
    assert "AllocWorkspace" not in host
    nvcc_compiles(source, tmp_path)
    assert workspace_count(_scheduled(rule, _q4_matmul(28672, 4096))) == 0


def test_split_k_calls_allocate_the_workspace(monkeypatch):
    """A projection built whole for cuda-sm90 with split tiles for 5-64 rows: the row-dispatched
    kernel takes the workspace after its output, the Relax call allocates it (two outputs, the
    planned memory of any tensor), and no kernel allocates device memory itself. With rows bounded
    by 2,048 (a prefill chunk: the workspace would be planned that large) K is not split."""
    import tvm
    from gpu_kernels import _Keep
    from tvm.relax.frontend import nn

    from kiln.compiler.build import build_lib
    from kiln.compiler.passes.accumulate_f32 import AccumulateInFloat32
    from kiln.targets import get_profile, gpu
    from kiln.targets.narrow_tiles import NarrowTensorCoreMatmul
    from kiln.targets.workspace_outputs import workspace_count

    class Proj(nn.Module):
        def __init__(self):
            self.proj = nn.Linear(2048, 512, bias=False, dtype="float16")

        def forward(self, x: nn.Tensor) -> nn.Tensor:
            return self.proj(x)

    split = NarrowTensorCoreMatmul(warp_rows=2, warp_cols=2, target_blocks=1024)
    monkeypatch.setattr(gpu, "LOW_BATCH_BRANCHES", (*gpu.LOW_BATCH_BRANCHES[:-1], (64, split)))
    mod, _ = Proj().export_tvm(spec={"forward": {"x": nn.spec.Tensor([1, "n", 2048], "float16")}})

    def bounded(rows: int) -> tvm.IRModule:                  # as compiler/spec.py bounds batch_size
        out = mod.clone()
        out["forward"] = mod["forward"].with_attr("tir_var_upper_bound", {"n": rows})
        return AccumulateInFloat32()(out)

    keep = _Keep("kiln_pipeline")
    with tvm.transform.PassContext(opt_level=3, instruments=[keep]):
        executable, _ = build_lib(bounded(256), get_profile("cuda-sm90"))
    scheduled = keep.mods["kiln_pipeline"]
    funcs = {gv.name_hint: f for gv, f in scheduled.functions_items() if workspace_count(f)}
    assert len(funcs) == 1 and int(list(funcs.values())[0].params[-1].shape[0]) == 8
    with tvm.transform.PassContext(opt_level=3, instruments=[keep]):       # rows up to 2,048: not split
        build_lib(bounded(2048), get_profile("cuda-sm90"))
    assert not any(workspace_count(f) for _, f in keep.mods["kiln_pipeline"].functions_items())
    assert "AllocWorkspace" not in executable.mod.imports[0].inspect_source()
    assert re.search(r"R\.vm\.alloc_tensor\([^)]*R\.dtype\(\"float32\"\)", scheduled["forward"].script())


def test_cuda_decodes_with_kilns_attention_kernel(dumped_ir, tmp_path):
    """The CUDA build's KV cache decodes through targets/decode_attention.py (both the plain and the
    sliding-window kernel, TVM's symbols kept); its keys and values load 16 bytes a thread (TVM's
    kernel gathers 2 bytes at a time: its pages' element offset leaves the rows' alignment
    unknown), and nvcc compiles it. A head dim that does not split into 16-byte lanes of a warp
    keeps TVM's kernel."""
    from gpu_kernels import build_prim_func, cuda_kernels, nvcc_compiles

    from kiln.targets.decode_attention import decode_attention, replacement
    funcs = dumped_ir("cuda", "schedule")
    for name in ("batch_decode_paged_kv", "batch_decode_paged_kv_sliding_window"):
        assert '"kiln.attention": True' in funcs[name], name
    kernels = build_prim_func("batch_decode_paged_kv", decode_attention(8, 32, 128, "float16", 16), "cuda-sm90")
    source = kernels.artifact_source
    bodies = cuda_kernels(source)
    for kernel in ("batch_decode_paged_kv_kernel", "batch_decode_paged_kv_kernel_1"):     # whole, split
        loads = re.findall(r"\*\(uint4\*\)\(\w+_rows_ptr \+ \d+\) = \*\(uint4\*\)\(pages_ptr \+", bodies[kernel][1])
        assert len(loads) == 8, kernel                      # keys and values of 4 unrolled tokens
    assert "make_uint4(pages_ptr[" not in source and "batch_decode_paged_kv_kernel_2" in source   # + the merge
    nvcc_compiles(source, tmp_path)
    with pytest.raises(ValueError, match="16-byte lanes"):
        decode_attention(8, 32, 96, "float16", 16)           # 12 lanes: does not tile a warp
    tvm_kernel = kernels.func("batch_decode_paged_kv")
    assert replacement("batch_prefill_paged_kv", tvm_kernel) is None


@pytest.mark.parametrize("name, page_size, source_ptr", [("batch_prefill_ragged_kv", None, "[kv]"),
                                                         ("batch_prefill_paged_kv", 16, "pages")])
def test_cuda_prefills_with_kilns_attention_kernels(dumped_ir, tmp_path, name, page_size, source_ptr):
    """The CUDA build's ragged and paged prefill kernels are targets/prefill_attention.py's (TVM's
    symbols kept; the sliding-window one stays TVM's): one 128-thread kernel for the 8B's heads,
    keys and values loaded 16 bytes a thread (2 unrolled tokens), nvcc compiles it."""
    from gpu_kernels import build_prim_func, cuda_kernels, nvcc_compiles

    from kiln.targets.prefill_attention import prefill_attention, prefill_replacement
    funcs = dumped_ir("cuda", "schedule")
    assert '"kiln.attention": True' in funcs[name]
    assert '"kiln.attention": True' not in funcs.get("batch_prefill_paged_kv_sliding_window", "")
    kernels = build_prim_func(name, prefill_attention(8, 32, 128, "float16", page_size=page_size), "cuda-sm90")
    source = kernels.artifact_source
    (threads, body), = cuda_kernels(source).values()
    assert threads == 128
    loads = re.findall(rf"\*\(uint4\*\)\(\w_rows_ptr \+ \d+\) = \*\(uint4\*\)\({source_ptr}_ptr \+", body)
    assert len(loads) == 4
    nvcc_compiles(source, tmp_path)
    assert prefill_replacement("batch_decode_paged_kv", kernels.func(name)) is None


@pytest.mark.parametrize("batch, tokens, splits", [(1, 128, 1), (1, 255, 1), (1, 4096, 16), (16, 4096, 2),
                                                   (64, 4096, 1), (1, 65536, 32), (3, 1024, 4)])
def test_decode_attention_splits_long_sequences_of_small_batches(batch, tokens, splits):
    """How many work-groups share a sequence (the 8B's 8 KV heads, 16-token pages): none at 128 tokens
    (one pass of the unsplit kernel), enough for ~256 work-groups at 4,096 tokens and batch 1, none
    once the batch alone makes 256."""
    import tvm

    from kiln.targets.decode_attention import split_count
    count = split_count(tvm.tirx.IntImm("int32", batch), tvm.tirx.IntImm("int32", batch * tokens // 16), 8, 16)
    assert int(count) == splits                             # (constants fold as the expression is built)


@pytest.mark.parametrize("width, dtype, lanes", [(4096, "float16", 4), (576, "float16", 4), (600, "float32", 4),
                                                 (6, "float16", 2), (7, "float32", 1)])
def test_add_rms_norm_reads_and_writes_vectors(width, dtype, lanes, tmp_path):
    """targets/gpu.py AddRMSNorm: a thread's elements of a row are `lanes` consecutive ones at a time
    (4 where the width divides, the widest vector Metal and WGSL have; 2; else 1), so the 8B's 4096-wide
    float16 rows are read and written 64 bits an access (the kernel had read and written 16 bits an
    access: in the cuda-sm90 SASS 48 loads and 32 stores a thread, now 16 and 8); the CUDA compiles
    with nvcc, and the kernel builds for WebGPU. Its numbers: test_opencl_kernels.py runs it on pocl."""
    from tvm import te
    from gpu_kernels import build_prim_func, cuda_kernels, nvcc_compiles

    from kiln.compiler.passes.fuse_add_rms_norm import add_rms_norm_te
    rows = te.var("batch_size", "int64")
    x, r = (te.placeholder((rows, 1, width), dtype, name=s) for s in ("x", "r"))
    w = te.placeholder((width,), dtype, name="w")
    func = te.create_prim_func([x, r, w, *add_rms_norm_te(x, r, w, 1e-5)])
    built = build_prim_func("add_norm", func, "cuda-sm90")
    source = built.artifact_source
    body = cuda_kernels(source)["add_norm_kernel"][1]
    vector = {"float16": {4: "half4", 2: "half2"}, "float32": {4: "float4", 2: "float2"}}[dtype].get(lanes)
    if vector:
        assert f"*({vector}*)(x_ptr" in body and f"*({vector}*)(T_rms_norm_ptr" in body
    else:
        assert "*(float4*)" not in body and "*(float2*)" not in body
    nvcc_compiles(source, tmp_path)
    build_prim_func("add_norm", func, "webgpu")
