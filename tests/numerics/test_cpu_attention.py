"""kiln's CPU attention and RoPE kernels (targets/cpu/attention.py) against numpy references.

Each kernel is compiled alone for the host and called the way TVM's paged KV cache calls it:
ragged prefill (new tokens among themselves), paged prefill (new tokens against cached
pages), decode (one token per sequence), and the qkv split with RoPE. Page slots past a
sequence's length hold NaN, as stale cache memory may: they must never reach the output.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.relax.frontend.nn.llm.position_embedding import llama_rope_with_position_map

from kiln.targets import get_profile
from kiln.targets.cpu.attention import (
    attention_paged_cpu,
    attention_prefill_ragged_cpu,
    fast_exp2_kernel,
    split_rotary_cpu,
)

pytestmark = pytest.mark.numerics
PAGE = 16
SM_SCALE = 0.125
# (h_q, h_kv, head_dim): SmolLM2's GQA shape and the tiny test Llama's
SHAPES = [(9, 3, 64), (4, 2, 16)]
# float32 lanes the prefill kernels block for: AVX-512's 16, AVX2's 8 (each built and run on any x86 host)
SIMD = [16, 8]
DECODE_SHAPES = SHAPES + [(4, 1, 256)]     # Gemma 3 270M's: the head dim in several register chunks


def _build(func):
    return tvm.compile(tvm.IRModule({"main": func}), target=get_profile("cpu").tvm_target())["main"]


def _t(a):
    return tvm.runtime.tensor(a)


def reference(q, k, v, causal):
    """Softmax attention in float64; q [n, h_q, d], k/v [m, h_kv, d]; lse in log2 units."""
    n, h_q, _ = q.shape
    m, h_kv, _ = k.shape
    out, lse = np.zeros(q.shape), np.zeros((n, h_q))
    for h in range(h_q):
        s = q[:, h].astype(np.float64) @ k[:, h // (h_q // h_kv)].T.astype(np.float64) * SM_SCALE
        if causal:
            s = np.where(np.arange(m)[None, :] < m - n + np.arange(n)[:, None] + 1, s, -np.inf)
        mx = s.max(-1, keepdims=True)
        p = np.exp(s - mx)
        out[:, h] = p / p.sum(-1, keepdims=True) @ v[:, h // (h_q // h_kv)]
        lse[:, h] = (mx[:, 0] + np.log(p.sum(-1))) / np.log(2)
    return out, lse


@pytest.mark.parametrize("h_q,h_kv,d", SHAPES)
@pytest.mark.parametrize("causal", [1, 0])
@pytest.mark.parametrize("simd", SIMD)
def test_ragged_prefill(h_q, h_kv, d, causal, simd):
    rng = np.random.default_rng(0)
    lens = [130, 1, 37]                                 # over the 32-row / 64-column blocks, and one token
    ind = np.concatenate([[0], np.cumsum(lens)]).astype("int32")
    q, k, v = (rng.standard_normal((ind[-1], h, d)).astype("float32") for h in (h_q, h_kv, h_kv))
    out, lse = np.zeros_like(q), np.zeros((ind[-1], h_q), "float32")
    args = [_t(q), _t(ind), _t(k), _t(v), _t(ind), _t(np.zeros(ind[-1], "int32")),
            _t(np.zeros(len(lens), "int32")), _t(out), _t(lse)]
    _build(attention_prefill_ragged_cpu(h_kv, h_q, d, "float32", simd=simd))(*args, causal, 0, 1.0, 1e4, SM_SCALE)
    for b in range(len(lens)):
        rows = slice(ind[b], ind[b + 1])
        ref_out, ref_lse = reference(q[rows], k[rows], v[rows], causal)
        np.testing.assert_allclose(args[7].numpy()[rows], ref_out, atol=2e-6)
        np.testing.assert_allclose(args[8].numpy()[rows], ref_lse, atol=2e-6)


class PagedCache:
    """Sequences of kv_lens tokens scattered over shuffled pages; unused slots are NaN."""

    def __init__(self, h_kv: int, d: int, kv_lens: list[int], seed: int = 1):
        rng = np.random.default_rng(seed)
        self.kv_lens = kv_lens
        n_pages = [-(-n // PAGE) for n in kv_lens]
        self.pages = np.full((sum(n_pages) + 2, 2, h_kv, PAGE, d), np.nan, "float32")
        self.values = rng.permutation(len(self.pages))[:sum(n_pages)].astype("int32")
        self.indptr = np.concatenate([[0], np.cumsum(n_pages)]).astype("int32")
        self.last_len = np.array([n - (p - 1) * PAGE if p else 0 for n, p in zip(kv_lens, n_pages)], "int32")
        self.k, self.v = [], []
        for b, n in enumerate(kv_lens):
            kv = rng.standard_normal((2, n, h_kv, d)).astype("float32")
            for pos in range(n):
                page = self.values[self.indptr[b] + pos // PAGE]
                self.pages[page, :, :, pos % PAGE] = kv[:, pos]
            self.k.append(kv[0])
            self.v.append(kv[1])

    def args(self):
        return [_t(self.pages), _t(self.indptr), _t(self.values), _t(self.last_len)]

    def slide(self, windows: list[tuple[int, int]]) -> np.ndarray:
        """Each sequence's (sink's rows, window's first row) as a sliding window leaves its pages: NaN
        in the rows between. TVM's sliding-window length_info [3, batch]."""
        for b, (sink, first) in enumerate(windows):
            for pos in range(sink, first):
                self.pages[self.values[self.indptr[b] + pos // PAGE], :, :, pos % PAGE] = np.nan
        return np.stack([self.last_len, [f for _, f in windows], [s for s, _ in windows]]).astype("int32")


def check_row(out, lse, i: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """Row i of a paged kernel's output and lse against the reference over keys k and values v; with
    no keys, zeros and the empty-row lse TVM uses."""
    if not len(k):
        assert not out.numpy()[i].any() and (lse.numpy()[i] == -5e4).all()
        return
    ref_out, ref_lse = reference(q[i:i + 1], k, v, causal=0)
    np.testing.assert_allclose(out.numpy()[i], ref_out[0], atol=2e-6)
    np.testing.assert_allclose(lse.numpy()[i], ref_lse[0], atol=2e-6)


@pytest.mark.parametrize("h_q,h_kv,d", DECODE_SHAPES)
@pytest.mark.parametrize("simd", SIMD)
def test_decode(h_q, h_kv, d, simd):
    cache = PagedCache(h_kv, d, [37, 16, 200, 0, 1])
    batch = len(cache.kv_lens)
    q = np.random.default_rng(2).standard_normal((batch, h_q, d)).astype("float32")
    out, lse = _t(np.zeros_like(q)), _t(np.zeros((batch, h_q), "float32"))
    zeros = _t(np.zeros(batch, "int32"))
    _build(attention_paged_cpu(h_kv, h_q, d, "float32", PAGE, decode=True, simd=simd))(
        _t(q), *cache.args(), zeros, zeros, out, lse, 0, 1.0, 1e4, SM_SCALE)
    for b in range(batch):
        check_row(out, lse, b, q, cache.k[b], cache.v[b])          # (no keys: zeros, the empty-row lse)


@pytest.mark.parametrize("h_q,h_kv,d", DECODE_SHAPES)
@pytest.mark.parametrize("simd", SIMD)
def test_sliding_window_decode(h_q, h_kv, d, simd):
    """TVM's sliding-window decode signature: length_info [3, batch] (the last page's rows, the window's
    first row in the pages, the sink's rows); only the sink's rows and the window's count. The rows
    between hold NaN (memory the window left), and a whole page of them is skipped."""
    kv_lens = [37, 70, 200, 20, 0]
    windows = [(0, 5), (2, 40), (4, 20), (0, 0), (0, 0)]      # (sink, window's first row) per sequence
    cache = PagedCache(h_kv, d, kv_lens)
    batch = len(kv_lens)
    info = cache.slide(windows)
    q = np.random.default_rng(3).standard_normal((batch, h_q, d)).astype("float32")
    out, lse = _t(np.zeros_like(q)), _t(np.zeros((batch, h_q), "float32"))
    zeros = _t(np.zeros(batch, "int32"))
    _build(attention_paged_cpu(h_kv, h_q, d, "float32", PAGE, decode=True, sliding=True, simd=simd))(
        _t(q), _t(cache.pages), _t(cache.indptr), _t(cache.values), _t(info), zeros, zeros, out, lse,
        0, 1.0, 1e4, SM_SCALE)
    for b, (n, (sink, first)) in enumerate(zip(kv_lens, windows)):
        rows = np.r_[0:sink, first:n]
        check_row(out, lse, b, q, cache.k[b][rows], cache.v[b][rows])


@pytest.mark.parametrize("h_q,h_kv,d", SHAPES)
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("simd", SIMD)
def test_sliding_window_prefill(h_q, h_kv, d, causal, simd):
    """TVM's sliding-window prefill over the cache (batch_prefill_paged_kv_cpu_sliding_window): the
    sink's and the window's rows, and with `causal` TVM's cross mask for a window of WINDOW tokens:
    new row r sees the cache's last WINDOW - r - 1 logical rows (none from row WINDOW - 1 on). The
    rows between the sink and the window hold NaN, whole pages of them skipped."""
    window = 24
    kv_lens = [37, 70, 200, 20, 0, 90]
    windows = [(0, 5), (2, 40), (4, 180), (0, 0), (0, 0), (0, 70)]   # (sink, window's first row)
    q_lens = [5, 30, 17, 1, 3, 40]
    cache = PagedCache(h_kv, d, kv_lens)
    info = cache.slide(windows)
    q_ind = np.concatenate([[0], np.cumsum(q_lens)]).astype("int32")
    q = np.random.default_rng(5).standard_normal((q_ind[-1], h_q, d)).astype("float32")
    out, lse = _t(np.zeros_like(q)), _t(np.zeros((len(q), h_q), "float32"))
    _build(attention_paged_cpu(h_kv, h_q, d, "float32", PAGE, decode=False, sliding=True, window=window,
                                simd=simd))(
        _t(q), _t(q_ind), _t(cache.pages), _t(cache.indptr), _t(cache.values), _t(info),
        _t(np.zeros(len(q_lens), "int32")), _t(np.zeros(len(q), "int32")), out, lse, causal, 0, 1.0, 1e4, SM_SCALE)
    for b, (n, (sink, first)) in enumerate(zip(kv_lens, windows)):
        rows = np.r_[0:sink, first:n]                   # the cache's logical rows
        for r in range(q_lens[b]):
            seen = rows[max(len(rows) - max(window - r - 1, 0), 0):] if causal else rows
            check_row(out, lse, q_ind[b] + r, q, cache.k[b][seen], cache.v[b][seen])   # (none seen: zeros)


@pytest.mark.parametrize("h_q,h_kv,d", SHAPES)
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("simd", SIMD)
def test_paged_prefill(h_q, h_kv, d, causal, simd):
    cache = PagedCache(h_kv, d, [37, 16, 200, 5])
    q_lens = [5, 16, 40, 0]
    q_ind = np.concatenate([[0], np.cumsum(q_lens)]).astype("int32")
    q = np.random.default_rng(3).standard_normal((q_ind[-1], h_q, d)).astype("float32")
    out, lse = _t(np.zeros_like(q)), _t(np.zeros((len(q), h_q), "float32"))
    _build(attention_paged_cpu(h_kv, h_q, d, "float32", PAGE, decode=False, simd=simd))(
        _t(q), _t(q_ind), *cache.args(), _t(np.zeros(len(q_lens), "int32")), _t(np.zeros(len(q), "int32")),
        out, lse, causal, 0, 1.0, 1e4, SM_SCALE)
    for b, n in enumerate(q_lens):
        rows = slice(q_ind[b], q_ind[b + 1])
        if n:
            ref_out, ref_lse = reference(q[rows], cache.k[b], cache.v[b], causal)
            np.testing.assert_allclose(out.numpy()[rows], ref_out, atol=2e-6)
            np.testing.assert_allclose(lse.numpy()[rows], ref_lse, atol=2e-6)


def test_float16_decode_within_half_precision():
    h_q, h_kv, d = 4, 2, 16
    cache = PagedCache(h_kv, d, [50])
    q = np.random.default_rng(4).standard_normal((1, h_q, d)).astype("float32")
    out, lse = _t(np.zeros((1, h_q, d), "float16")), _t(np.zeros((1, h_q), "float32"))
    zeros = _t(np.zeros(1, "int32"))
    pages = cache.pages.astype("float16")
    _build(attention_paged_cpu(h_kv, h_q, d, "float16", PAGE, decode=True))(
        _t(q.astype("float16")), _t(pages), *cache.args()[1:], zeros, zeros, out, lse, 0, 1.0, 1e4, SM_SCALE)
    ref_out, _ = reference(q.astype("float16").astype("float32"), cache.k[0].astype("float16").astype("float32"),
                           cache.v[0].astype("float16").astype("float32"), causal=0)
    np.testing.assert_allclose(out.numpy()[0].astype("float32"), ref_out[0], atol=2e-3)


def test_rotary_split_matches_hf_rotate_half_and_tvm():
    h_q, h_kv, d, theta = 9, 3, 64, 100000.0
    n = 70
    rng = np.random.default_rng(5)
    qkv = rng.standard_normal((n, h_q + 2 * h_kv, d)).astype("float32")
    pos = rng.integers(0, 4000, n).astype("int32")
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2) / d)
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]
    rot = lambda x: np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)  # noqa: E731 (HF rotate_half)
    expected = [qkv[:, :h_q] * cos + rot(qkv[:, :h_q]) * sin,
                qkv[:, h_q:h_q + h_kv] * cos + rot(qkv[:, h_q:h_q + h_kv]) * sin, qkv[:, h_q + h_kv:]]
    results = []
    profile = get_profile("cpu")
    tvm_kernel = tvm.IRModule({"main": llama_rope_with_position_map(theta, 1.0, d, h_q, h_kv, "float32", {}, d)})
    with profile.tvm_target():
        tvm_kernel = tvm.transform.Sequential(profile.passes("schedule"))(tvm_kernel)
    for kernel in (split_rotary_cpu(theta, 1.0, d, h_q, h_kv, "float32"), tvm_kernel["main"]):
        outs = [_t(np.zeros((n, h, d), "float32")) for h in (h_q, h_kv, h_kv)]
        _build(kernel)(_t(qkv), _t(pos), *outs, 1)
        results.append([o.numpy() for o in outs])
    for got, want in zip(results[0], expected):
        np.testing.assert_allclose(got, want, atol=5e-4)      # float32 angles up to 4000 rad
    for got, tvm_got in zip(*results):
        np.testing.assert_allclose(got, tvm_got, atol=1e-6)   # same arithmetic as TVM's kernel
    outs = [_t(np.zeros((n, h, d), "float32")) for h in (h_q, h_kv, h_kv)]
    _build(split_rotary_cpu(theta, 1.0, d, h_q, h_kv, "float32"))(_t(qkv), _t(pos), *outs, 0)   # apply_rope=0
    for got, want in zip(outs, (qkv[:, :h_q], qkv[:, h_q:h_q + h_kv], qkv[:, h_q + h_kv:])):
        np.testing.assert_array_equal(got.numpy(), want)


def test_fast_exp2_relative_error():
    x = np.concatenate([np.linspace(-126, 0, 4000), np.linspace(0, 60, 800)]).astype("float32").reshape(-1, 16)
    buf = _t(x)
    _build(fast_exp2_kernel(16))(buf)
    rel = np.abs(buf.numpy() - np.exp2(x.astype(np.float64))) / np.exp2(x.astype(np.float64))
    assert rel.max() < 5e-7, rel.max()
