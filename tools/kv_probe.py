"""A paged KV cache whose page tables are the forward's arguments, against TVM's PagedKVCache.

The design question behind "a KV cache kiln owns" (tools/README.md "The host gap"): TVM's cache
runs each layer's attention from C++ (split + rotary, KV append, attention: three kernels a layer,
launched outside the Relax graph, with arguments no kiln kernel can change), so RoPE and the append
cannot join the QKV GEMV's epilogue and a decode step cannot be one graph. The alternative keeps the
pages as tensors the runtime allocates, passes them and the step's page tables (page indptr, page
ids, the last page's fill, the new tokens' positions and slots) as inputs of the Relax function, and
calls the same kernels from the graph: split + rotary (call_tir), the append (call_tir_inplace into
the layer's pages), attention (call_tir). This probe builds both over a stack of attention layers
alone (no GEMVs: what differs is the cache's part), runs the same prompts and decode steps through
each, checks the in-graph one against a numpy reference and TVM's cache, and times a decode step of
each. Nothing here ships yet: it says whether the runtime part is worth building (the note of
2026-12-05 and tools/README.md say what it measured).

    python tools/kv_probe.py --target cpu            # a CPU build of SmolLM2's attention shape
    python tools/kv_probe.py --target cuda --shape 8b   # on a GPU machine (tools/gpu_checks.py kvprobe)

Both sides use TVM's own kernels (relax/frontend/nn/llm: llama_rope_with_position_map,
_kv_cache_transpose_append, _attention_decode(_cpu), and the paged _attention_prefill(_cpu) with the
causal mask over the cache after the append, where TVM's cache runs its ragged kernel on a first
prompt), so a difference in time is the cache's dispatch, not its kernels.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    page_size: int = 16
    rope_theta: float = 10000.0
    sinks: bool = False         # attention sinks (gpt-oss, Granite SWA, ...): TVM's cache cannot; the graph can

    def sink_logits(self) -> np.ndarray:
        """Each layer's and head's sink logit [layers, heads] (fixed values of the size trained ones take)."""
        layer, head = np.meshgrid(np.arange(self.layers), np.arange(self.heads), indexing="ij")
        return (1.5 * np.sin(1.7 * layer + head)).astype(np.float32)

    @property
    def fused_heads(self) -> int:
        return self.heads + 2 * self.kv_heads

    @property
    def sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)


SHAPES = {
    "tiny": Shape(layers=2, heads=4, kv_heads=2, head_dim=16, dtype="float32"),
    "tiny-sinks": Shape(layers=2, heads=4, kv_heads=2, head_dim=16, dtype="float32", sinks=True),
    "smollm2": Shape(layers=30, heads=9, kv_heads=3, head_dim=64, dtype="float32"),
    "8b": Shape(layers=32, heads=32, kv_heads=8, head_dim=128, dtype="float16", rope_theta=500000.0),
}


# ---- the page tables, kept on the host ------------------------------------------------------------

@dataclass
class PageTables:
    """Pages handed out to sequences, in token order, and the arrays a forward takes (one page pool
    shared by every layer: a page id names the same slot in each layer's pages tensor)."""
    num_pages: int
    page_size: int
    free: list = field(default_factory=list)
    pages: dict = field(default_factory=dict)      # seq id -> page ids
    lengths: dict = field(default_factory=dict)    # seq id -> tokens held

    def __post_init__(self):
        self.free = list(range(self.num_pages - 1, -1, -1))

    def add(self, seq: int) -> None:
        self.pages[seq], self.lengths[seq] = [], 0

    def forward(self, seqs: list[int], counts: list[int]) -> dict[str, np.ndarray]:
        """Grow each sequence by its count of tokens; the forward's arrays (int32): q_indptr, the
        sequences' page indptr and page ids, the last page's fill, each new token's position (RoPE)
        and slot (page id * page size + offset: where the append writes it)."""
        positions, slots = [], []
        for seq, n in zip(seqs, counts):
            start = self.lengths[seq]
            need = -(-(start + n) // self.page_size) - len(self.pages[seq])
            if need > len(self.free):
                raise RuntimeError(f"the probe's {self.num_pages} pages are full")
            self.pages[seq] += [self.free.pop() for _ in range(need)]
            for p in range(start, start + n):
                positions.append(p)
                slots.append(self.pages[seq][p // self.page_size] * self.page_size + p % self.page_size)
            self.lengths[seq] = start + n
        held = [self.pages[s] for s in seqs]
        return {
            "q_indptr": np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
            "page_indptr": np.concatenate([[0], np.cumsum([len(h) for h in held])]).astype(np.int32),
            "page_values": np.array([p for h in held for p in h] or [0], np.int32),
            "last_len": np.array([(self.lengths[s] - 1) % self.page_size + 1 for s in seqs], np.int32),
            "positions": np.array(positions, np.int32),
            "slots": np.array(slots, np.int32),
        }


# ---- the two modules ------------------------------------------------------------------------------

def _specialized(func, **values):
    """`func` with its scalar parameters bound by name (rotary_mode, sm_scale, ...): call_tir passes
    tensors, so the constants of a model go into the kernel."""
    from tvm import tirx
    binds = {}
    for p in func.params:
        if p.name in values:
            binds[p] = tirx.const(values[p.name], str(p.ty.dtype))
    return func.specialize(binds)


def _kernels(shape: Shape, target, kiln: bool):
    """The kernels of a layer for this shape: split + rotary, append, paged decode, paged prefill
    (causal). kiln: kiln's attention kernels (and its CPU split + rotary), what its artifacts run;
    else TVM's."""
    from tvm.relax.frontend.nn.llm import _decode_kernels as dk, _page_kernels as pk, _prefill_kernels as fk
    from tvm.relax.frontend.nn.llm.position_embedding import llama_rope_with_position_map
    s = shape
    cpu = target.kind.name == "llvm"
    scalars = {"rotary_mode": 0, "rope_scale": 1.0, "rope_theta": s.rope_theta, "sm_scale": s.sm_scale}
    rope = llama_rope_with_position_map(s.rope_theta, 1.0, s.head_dim, s.heads, s.kv_heads, s.dtype, {})
    with target:
        if kiln and cpu:
            from kiln.targets.cpu.attention import attention_paged_cpu, split_rotary_cpu
            from kiln.targets.cpu.schedule import attention_lanes
            simd = attention_lanes(target)
            rope = split_rotary_cpu(s.rope_theta, 1.0, s.head_dim, s.heads, s.kv_heads, s.dtype)
            decode, prefill = (attention_paged_cpu(s.kv_heads, s.heads, s.head_dim, s.dtype, s.page_size, decode=d,
                                                   simd=simd) for d in (True, False))
        elif kiln:
            from kiln.targets.decode_attention import decode_attention
            from kiln.targets.prefill_attention import prefill_attention
            decode = decode_attention(s.kv_heads, s.heads, s.head_dim, s.dtype, s.page_size)
            prefill = prefill_attention(s.kv_heads, s.heads, s.head_dim, s.dtype, page_size=s.page_size)
        elif cpu:
            decode = dk._attention_decode_cpu(s.kv_heads, s.heads, s.head_dim, s.dtype, False, {})
            prefill = fk._attention_prefill_cpu(s.kv_heads, s.heads, s.head_dim, s.dtype, False, {})
        else:
            decode = dk._attention_decode(s.kv_heads, s.heads, s.head_dim, s.dtype, False, {}, target)
            prefill = fk._attention_prefill(s.kv_heads, s.heads, s.head_dim, s.dtype, False, {}, target)
    return {
        "rope": _specialized(rope, apply_rope=1),
        "append": pk._kv_cache_transpose_append(s.kv_heads, s.head_dim, s.dtype, s.page_size),
        "decode": _specialized(decode, **scalars),
        "prefill": _specialized(prefill, causal=1, **scalars),
    }


def _kiln_swaps(mod, target):
    """TVM's cache module with kiln's kernels swapped in by name, as kiln's pipeline does."""
    if target.kind.name == "llvm":
        from kiln.targets.cpu.attention_pass import UseKilnCPUAttention
        from kiln.targets.cpu.schedule import attention_lanes
        return UseKilnCPUAttention(simd=attention_lanes(target))(mod)
    from kiln.targets.kiln_attention import UseKilnAttention
    return UseKilnAttention()(mod)


def build_modules(shape: Shape, target, kiln: bool = True):
    """(TVM cache's IRModule, the in-graph cache's IRModule), each with prefill and decode over
    `shape.layers` layers; layer l attends with the input's q/k/v scaled by (l + 1) / layers, and the
    functions return the sum of the layers' outputs (so every layer's cache counts)."""
    from tvm import relax, tirx
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn import Tensor, op
    from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, RopeMode, TIRPagedKVCache

    s = shape
    kernels = _kernels(s, target, kiln)

    def scaled(qkv: Tensor, layer: int) -> Tensor:
        return qkv * ((layer + 1) / s.layers) if layer + 1 < s.layers else qkv

    class TVMCache(nn.Module):
        def _stack(self, qkv: Tensor, cache: PagedKVCache) -> Tensor:
            total = None
            for layer in range(s.layers):
                out = cache.attention_with_fused_qkv(layer, scaled(qkv, layer), s.heads, sm_scale=s.sm_scale)
                total = out if total is None else total + out
            return total

        def prefill(self, qkv: Tensor, cache: PagedKVCache):
            return self._stack(qkv, cache), cache

        def decode(self, qkv: Tensor, cache: PagedKVCache):
            return self._stack(qkv, cache), cache

        def create_paged_kv_cache(self, max_batch_size, max_total_seq_len, prefill_chunk_size, page_size,
                                  support_sliding_window) -> PagedKVCache:
            return TIRPagedKVCache(
                attn_kind="mha", max_batch_size=max_batch_size, max_total_seq_len=max_total_seq_len,
                prefill_chunk_size=prefill_chunk_size, page_size=page_size,
                support_sliding_window=support_sliding_window,
                layer_partition=relax.ShapeExpr([0, s.layers]), num_hidden_layers=s.layers,
                num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, qk_head_dim=s.head_dim,
                v_head_dim=s.head_dim, mla_original_qk_head_dim=0, mla_original_v_head_dim=0,
                rope_mode=RopeMode.NORMAL, rope_scale=1, rope_theta=s.rope_theta, rope_scaling={},
                rope_ext_factors=relax.prim_value(0), rotary_dim=s.head_dim, enable_disaggregation=False,
                dtype=s.dtype, target=target)

    def attend(qkv: Tensor, pages: list, layer: int, tables: dict, kind: str) -> Tensor:
        """One layer in the graph: q, k, v split and rotated, k and v written into the layer's pages
        (in place: the new pages tensor aliases the input), then attention over the pages."""
        n = qkv.shape[0]
        q, k, v = op.tensor_ir_op(kernels["rope"], "kv_split_rotary", [qkv, tables["positions"]], out=[
            Tensor.placeholder([n, s.heads, s.head_dim], s.dtype),
            Tensor.placeholder([n, s.kv_heads, s.head_dim], s.dtype),
            Tensor.placeholder([n, s.kv_heads, s.head_dim], s.dtype)])
        pages[layer] = op.tensor_ir_inplace_op(kernels["append"], "kv_append", [pages[layer], k, v, tables["slots"]],
                                               inplace_indices=[0], out=Tensor.placeholder(pages[layer].shape, s.dtype))
        common = [pages[layer], tables["page_indptr"], tables["page_values"], tables["last_len"],
                  tables["rope_offset"], tables["positions"]]
        outs = [Tensor.placeholder([n, s.heads, s.head_dim], s.dtype), Tensor.placeholder([n, s.heads], "float32")]
        if kind == "decode":
            o, lse = op.tensor_ir_op(kernels["decode"], "kv_decode", [q, *common], out=outs)
        else:
            o, lse = op.tensor_ir_op(kernels["prefill"], "kv_prefill", [q, tables["q_indptr"], *common], out=outs)
        if s.sinks:                 # the sink's share of each row's softmax taken out: o * sigmoid(lse - sink)
            sink = nn.Tensor.from_const(s.sink_logits()[layer])                          # [heads]
            keep = op.sigmoid(lse * math.log(2.0) - op.broadcast_to(sink, lse.shape))    # the kernels' lse: base 2
            o = o * op.reshape(keep, [n, s.heads, 1]).astype(s.dtype)
        return o

    class InGraph(nn.Module):
        def _stack(self, qkv: Tensor, pages, tables: dict, kind: str):
            pages = list(pages)
            flat = op.reshape(qkv, [qkv.shape[0] * qkv.shape[1], s.fused_heads, s.head_dim])
            total = None
            for layer in range(s.layers):
                out = attend(scaled(flat, layer), pages, layer, tables, kind)
                total = out if total is None else total + out
            return op.reshape(total, [qkv.shape[0], qkv.shape[1], s.heads, s.head_dim]), tuple(pages)

        def prefill(self, qkv, pages, q_indptr, page_indptr, page_values, last_len, rope_offset, positions, slots):
            return self._stack(qkv, pages, dict(q_indptr=q_indptr, page_indptr=page_indptr, page_values=page_values,
                                                last_len=last_len, rope_offset=rope_offset, positions=positions,
                                                slots=slots), "prefill")

        def decode(self, qkv, pages, page_indptr, page_values, last_len, rope_offset, positions, slots):
            return self._stack(qkv, pages, dict(page_indptr=page_indptr, page_values=page_values, last_len=last_len,
                                                rope_offset=rope_offset, positions=positions, slots=slots), "decode")

    none = {"param_mode": "none", "effect_mode": "none"}
    qkv = {"prefill": nn.spec.Tensor([1, "seq_len", s.fused_heads, s.head_dim], s.dtype),
           "decode": nn.spec.Tensor(["batch_size", 1, s.fused_heads, s.head_dim], s.dtype)}
    kv = nn.spec.Object(object_type=PagedKVCache)
    tvm_spec = {
        "prefill": {"qkv": qkv["prefill"], "cache": kv, "$": none},
        "decode": {"qkv": qkv["decode"], "cache": kv, "$": none},
        "create_paged_kv_cache": {"max_batch_size": int, "max_total_seq_len": int, "prefill_chunk_size": int,
                                  "page_size": int, "support_sliding_window": int, "$": none},
    }
    pages = [nn.spec.Tensor(["num_pages", 2, s.kv_heads, s.page_size, s.head_dim], s.dtype) for _ in range(s.layers)]

    def ints(dim):
        return nn.spec.Tensor([dim], "int32")

    tables = {"page_indptr": ints("batch_plus_one"), "page_values": ints("nnz_pages"), "last_len": ints("batch"),
              "rope_offset": ints("batch"), "positions": ints("tokens"), "slots": ints("tokens")}
    graph_spec = {
        "prefill": {"qkv": qkv["prefill"], "pages": pages, "q_indptr": ints("batch_plus_one"), **tables, "$": none},
        "decode": {"qkv": qkv["decode"], "pages": pages, **tables, "$": none},
    }
    with target:
        tvm_mod, _ = TVMCache().export_tvm(spec=tvm_spec)
        graph_mod, _ = InGraph().export_tvm(spec=graph_spec)
        if kiln:
            tvm_mod = _kiln_swaps(tvm_mod, target)
    del tirx
    return tvm_mod, graph_mod


def compile_module(mod, target):
    """relax.build with TVM's default pipeline for the target (dlight's schedules on a GPU)."""
    import tvm
    from tvm import relax
    return tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))


# ---- running them ---------------------------------------------------------------------------------

def numpy_reference(shape: Shape, prompts: list[np.ndarray], steps: list[np.ndarray]) -> list[np.ndarray]:
    """What each forward returns, in float64: per layer, RoPE'd q/k (rotate-half, positions from 0),
    causal softmax attention with the GQA groups, summed over layers. prompts: each sequence's
    [n, fused, d]; steps: a decode step's [batch, fused, d] (one token a sequence)."""
    s = shape
    half = s.head_dim // 2
    inv = 1.0 / (s.rope_theta ** (np.arange(half, dtype=np.float64) * 2 / s.head_dim))

    def rope(x, pos):                      # x [n, h, d]
        ang = pos[:, None].astype(np.float64) * inv[None, :]
        cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))
        rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
        return x * cos[:, None, :] + rot * sin[:, None, :]

    sinks = s.sink_logits().astype(np.float64)
    keys = [[None] * len(prompts) for _ in range(s.layers)]
    vals = [[None] * len(prompts) for _ in range(s.layers)]
    group = s.heads // s.kv_heads

    def layer_out(layer, seq, qkv, start):
        qkv = qkv.astype(np.float64) * ((layer + 1) / s.layers if layer + 1 < s.layers else 1.0)
        pos = np.arange(start, start + len(qkv))
        q = rope(qkv[:, :s.heads], pos)
        k = rope(qkv[:, s.heads:s.heads + s.kv_heads], pos)
        v = qkv[:, s.heads + s.kv_heads:]
        keys[layer][seq] = k if keys[layer][seq] is None else np.concatenate([keys[layer][seq], k])
        vals[layer][seq] = v if vals[layer][seq] is None else np.concatenate([vals[layer][seq], v])
        kk, vv = keys[layer][seq], vals[layer][seq]
        out = np.zeros_like(q)
        for h in range(s.heads):
            scores = q[:, h] @ kk[:, h // group].T * s.sm_scale          # [n, total]
            mask = np.arange(len(kk))[None, :] <= (start + np.arange(len(q)))[:, None]
            scores = np.where(mask, scores, -np.inf)
            top = scores.max(1, keepdims=True)
            w = np.exp(scores - top)
            total = w.sum(1, keepdims=True) + (np.exp(sinks[layer, h] - top) if s.sinks else 0.0)
            out[:, h] = (w / total) @ vv[:, h // group]
        return out

    results, lengths = [], [0] * len(prompts)
    for seq, prompt in enumerate(prompts):
        results.append(sum(layer_out(layer, seq, prompt, 0) for layer in range(s.layers)))
        lengths[seq] = len(prompt)
    for step in steps:
        rows = []
        for seq in range(len(prompts)):
            rows.append(sum(layer_out(layer, seq, step[seq:seq + 1], lengths[seq]) for layer in range(s.layers)))
            lengths[seq] += 1
        results.append(np.concatenate(rows))
    return results


class TVMSide:
    def __init__(self, lib, device, shape: Shape, num_pages: int, max_batch: int, chunk: int):
        import tvm
        from tvm.runtime import ShapeTuple
        self.tvm, self.ShapeTuple, self.device = tvm, ShapeTuple, device
        self.vm = tvm.relax.VirtualMachine(lib, device)
        self.kv = self.vm["create_paged_kv_cache"](ShapeTuple([max_batch]), ShapeTuple([num_pages * shape.page_size]),
                                                   ShapeTuple([chunk]), ShapeTuple([shape.page_size]), ShapeTuple([0]))
        self.f = {n: tvm.get_global_func(f"vm.builtin.{n}") for n in (
            "kv_state_add_sequence", "kv_state_begin_forward", "kv_state_end_forward")}
        self.fn = {n: self.vm[n] for n in ("prefill", "decode")}

    def add(self, seq: int) -> None:
        self.f["kv_state_add_sequence"](self.kv, seq)

    def run(self, kind: str, seqs: list[int], qkv):
        counts = [qkv.shape[1]] if kind == "prefill" else [1] * len(seqs)
        self.f["kv_state_begin_forward"](self.kv, self.ShapeTuple(seqs), self.ShapeTuple(counts))
        out, _ = self.fn[kind](qkv, self.kv)
        self.f["kv_state_end_forward"](self.kv)
        return out


class GraphSide:
    """The in-graph cache's runtime part as kiln would own it: the pages allocated once (one tensor a
    layer, passed as one array, written in place), a forward's tables packed into one int32 host
    array and copied in one go to a device buffer whose views the function takes (views kept by
    their shapes)."""

    NAMES = {"prefill": ("q_indptr", "page_indptr", "page_values", "last_len", "rope_offset", "positions", "slots"),
             "decode": ("page_indptr", "page_values", "last_len", "rope_offset", "positions", "slots")}

    def __init__(self, lib, device, shape: Shape, num_pages: int, bound: int):
        import ctypes
        import tvm
        from kiln.runtime.device_tensors import _COPY_IN, _VIEW
        self.tvm, self.device, self.shape = tvm, device, shape
        self.copy_in, self.view = _COPY_IN, _VIEW
        self.vm = tvm.relax.VirtualMachine(lib, device)
        self.tables = PageTables(num_pages, shape.page_size)
        zeros = np.zeros((num_pages, 2, shape.kv_heads, shape.page_size, shape.head_dim), shape.dtype)
        self.pages = tvm.runtime.convert([tvm.runtime.tensor(zeros, device) for _ in range(shape.layers)])
        self.fn = {n: self.vm[n] for n in ("prefill", "decode")}
        self.host = np.zeros(bound, np.int32)
        self.pointer = self.host.ctypes.data_as(ctypes.c_void_p)
        self.staged = tvm.runtime.empty((bound,), "int32", device)
        self.views: dict = {}
        self.host_s = 0.0            # the tables' time on the host (Python here: a runtime would do it natively)

    def add(self, seq: int) -> None:
        self.tables.add(seq)

    def run(self, kind: str, seqs: list[int], qkv):
        from tvm.runtime import ShapeTuple
        started = time.perf_counter()
        counts = [qkv.shape[1]] if kind == "prefill" else [1] * len(seqs)
        t = self.tables.forward(seqs, counts)
        t["rope_offset"] = np.zeros(len(seqs), np.int32)
        arrays = [t[n] for n in self.NAMES[kind]]
        sizes = tuple(len(a) for a in arrays)
        end = sum(sizes)
        self.host[:end] = np.concatenate(arrays)
        views = self.views.get((kind, sizes))
        if views is None:                                   # the used front, then each table in it
            offsets = np.concatenate([[0], np.cumsum(sizes)])[:-1]
            views = self.views[(kind, sizes)] = [self.view(self.staged, ShapeTuple([n]), "int32", int(o) * 4)
                                                 for n, o in zip((end, *sizes), (0, *offsets))]
        self.copy_in(views[0], self.pointer, end * 4)
        self.host_s += time.perf_counter() - started
        out, _ = self.fn[kind](qkv, self.pages, *views[1:])      # the pages written in place: nothing to keep
        return out


def run_both(shape: Shape, target_name: str, prompt_lens: list[int], decode_steps: int, timed_steps: int,
             seed: int = 0, kiln: bool = True) -> dict:
    """Build, run the same prompts (one prefill each) and decode steps through both caches, compare
    them with each other and (small shapes) with numpy; then time decode steps of each."""
    import tvm
    from kiln.targets import get_profile
    target = get_profile("cpu" if target_name == "cpu" else f"cuda-{_sm().replace('_', '')}").tvm_target()
    device = tvm.cpu() if target_name == "cpu" else tvm.cuda()
    started = time.monotonic()
    tvm_mod, graph_mod = build_modules(shape, target, kiln)
    libs = [compile_module(m, target) for m in (tvm_mod, graph_mod)]
    result = {"shape": shape.__dict__, "target": str(target), "kernels": "kiln" if kiln else "tvm",
              "build_s": round(time.monotonic() - started, 1)}
    batch = len(prompt_lens)
    need = sum(-(-(n + decode_steps + timed_steps + 8) // shape.page_size) for n in prompt_lens) + 4
    chunk = max(max(prompt_lens), batch)          # a decode step is a forward of `batch` tokens
    sides = {"tvm": TVMSide(libs[0], device, shape, need, batch, chunk),
             "graph": GraphSide(libs[1], device, shape, need, bound=8 * (need + chunk + batch))}
    if shape.sinks:             # TVM's cache returns no log-sum-exp to apply them with: the graph alone
        del sides["tvm"]
    rng = np.random.default_rng(seed)
    prompts = [rng.standard_normal((n, shape.fused_heads, shape.head_dim)).astype(shape.dtype) for n in prompt_lens]
    steps = [rng.standard_normal((batch, shape.fused_heads, shape.head_dim)).astype(shape.dtype)
             for _ in range(decode_steps)]
    outs = {name: [] for name in sides}
    for name, side in sides.items():
        for seq, p in enumerate(prompts):
            side.add(seq)
            outs[name].append(side.run("prefill", [seq], tvm.runtime.tensor(p[None], device)).numpy()[0])
        for st in steps:
            step = side.run("decode", list(range(batch)), tvm.runtime.tensor(st[:, None], device))
            outs[name].append(step.numpy()[:, 0])
    if "tvm" in outs:
        diffs = [float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(outs["graph"], outs["tvm"])]
        result["graph_vs_tvm"] = {"prefill_max_diff": max(diffs[:batch]),
                                  "decode_max_diff": max(diffs[batch:] or [0.0])}
    if shape.layers * shape.heads * sum(prompt_lens) <= 200_000:
        ref = numpy_reference(shape, prompts, steps)
        result["vs_numpy"] = {name: max(float(np.abs(a.astype(np.float64) - r).max()) for a, r in zip(o, ref))
                              for name, o in outs.items()}
    if timed_steps:
        x = tvm.runtime.tensor(rng.standard_normal((batch, 1, shape.fused_heads, shape.head_dim)).astype(shape.dtype),
                               device)
        result["decode_step_us"] = {}
        for name, side in sides.items():
            for _ in range(3):
                side.run("decode", list(range(batch)), x)
            device.sync()
            t0 = time.perf_counter()
            for _ in range(timed_steps):
                side.run("decode", list(range(batch)), x)
            device.sync()
            result["decode_step_us"][name] = round((time.perf_counter() - t0) / timed_steps * 1e6, 1)
        result["decode_step_us"]["graph_tables"] = round(sides["graph"].host_s / (timed_steps + 3 + decode_steps
                                                                                  + batch) * 1e6, 1)
    return result


def _sm() -> str:
    import tvm
    major, minor = tvm.cuda().compute_version.split(".")
    return f"sm_{major}{minor}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    ap.add_argument("--prompts", default="128", help="prompt lengths, comma-separated: one sequence each")
    ap.add_argument("--decode-steps", type=int, default=4, help="decode steps compared")
    ap.add_argument("--timed-steps", type=int, default=200)
    ap.add_argument("--kernels", choices=("kiln", "tvm"), default="kiln",
                    help="attention kernels on both sides: kiln's (what its artifacts run) or TVM's")
    ap.add_argument("--out", help="write the result as JSON here too")
    args = ap.parse_args(argv)
    result = run_both(SHAPES[args.shape], args.target, [int(n) for n in args.prompts.split(",")],
                      args.decode_steps, args.timed_steps, kiln=args.kernels == "kiln")
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
