"""ModelRunner: calls an artifact's entry functions by name and drives the paged KV cache.

The only place the runtime touches TVM, through `tvm.runtime` alone (runtime/_tvm.py): the
artifact runs on a runtime-only TVM. Token ids are checked on the host
before any call (an out-of-range id would make the embedding gather read out
of bounds), and a prefill longer than the artifact's chunk is split.

Every call stays within the bounds the artifact's memory was planned for (compiler/spec.py
bound_shapes): at most a prefill chunk of tokens per forward, and at most max_batch_size sequences
or returned logit rows (a forward that scores more prompt positions is split).

A sliding-window artifact (runtime/sliding_window.py) gets a cache with TVM's per-sequence window
when every layer slides (enabled on each sequence as it is added), and every forward is checked
against the window's chunk bound: an append TVM's kernels would compute wrongly is refused.

On CUDA, with step_graphs, a decode step is captured whole as a CUDA graph and replayed with one
launch where its key allows (runtime/step_graph.py).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
from typing import Sequence

# TVM's CPU thread pool assumes x86 cores are hyperthreaded and uses half of them unless told;
# on these machines that halves throughput. Use every core this process may run on.
os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                             else os.cpu_count() or 1))

import numpy as np

from ._tvm import load_library, open_device, tvm
from tvm.runtime import ShapeTuple
from tvm.runtime.vm import VirtualMachine

from .artifact import Artifact, check_host
from .kv_caches import OwnedCache, TVMCache
from .forward_split import prefill_chunks, row_bounded
from . import huge_pages, library_gemm
from .device_tensors import _COPY_IN, _COPY_OUT, _VIEW, LaunchedTokens, _holding_gil, _to_host, _view  # noqa: F401
from .contract import LIBRARY_GEMM_COPIES, LIBRARY_GEMM_DECODE, LIBRARY_GEMM_ENTRY, OPTIONAL_ENTRY_FUNCTIONS
from .memory_budget import default_kv_tokens, runner_kv_tokens
from .protocol import InvalidRequestError
from .sliding_window import SlidingWindow
from .step_graph import CAPTURED, StepGraphs, capture_functions

@dataclasses.dataclass
class _Staging:
    """A device buffer _staged copies into, its host mirror (the same shape), the mirror's pointer and
    the buffer's views by shape."""
    device: object                      # tvm.runtime.Tensor
    host: np.ndarray
    pointer: ctypes.c_void_p
    views: dict


class ModelRunner:
    def __init__(self, artifact: Artifact, max_num_seqs: int | None = None, max_total_tokens: int | None = None,
                 memory_utilization: float | None = None, step_graphs: bool = False):
        """max_total_tokens: the KV capacity in tokens; or memory_utilization, the fraction of the device's
        memory this runner may take, the KV cache getting what the weights and activations leave
        (runtime/memory_budget.py). Neither: on CUDA and ROCm, DEFAULT_GPU_UTILIZATION where the device
        reports its memory; elsewhere default_kv_tokens. step_graphs: decode steps replayed as whole
        CUDA graphs (runtime/step_graph.py; CUDA artifacts only)."""
        if max_total_tokens is not None and memory_utilization is not None:
            raise ValueError("give the KV cache size once: as tokens (max_total_tokens) or as a share of the "
                             "device's memory (memory_utilization)")
        cfg = artifact.config
        self.artifact = artifact
        check_host(artifact)
        self.device = open_device(artifact.device)            # loads the device's TVM runtime if needed
        self.vocab_size = artifact.vocab_size
        self.context_window = artifact.context_window
        self.prefill_chunk = cfg.prefill_chunk_size
        self.page_size = cfg.kv_cache.page_size
        self.window = SlidingWindow.of(cfg.kv_cache)
        self.max_batch_size = cfg.max_batch_size          # sequences, or logit rows, per forward
        self.max_num_seqs = max_num_seqs or cfg.max_batch_size
        if not 1 <= self.max_num_seqs <= self.max_batch_size:
            raise ValueError(f"max_num_seqs {self.max_num_seqs} is outside what this artifact was compiled for "
                             f"(1 to {self.max_batch_size} sequences at once); pass at most {self.max_batch_size}"
                             " or recompile with `kiln compile --max-batch-size N`")
        if LIBRARY_GEMM_ENTRY in cfg.entry_functions:      # the library calls it: registered before the load
            library_gemm.register()
        self.module = load_library(artifact.lib_path)
        self.vm = VirtualMachine(self.module, self.device)
        params, loaded = [], 0
        # A CPU's weights on huge pages (runtime/huge_pages.py), elsewhere the device's own copies.
        arena = huge_pages.HostArena() if artifact.device == "cpu" and huge_pages.enabled() else None
        for a in artifact.iter_params():                      # one host copy at a time
            params.append(arena.tensor(a) if arena is not None else tvm.runtime.tensor(a, self.device))
            loaded += a.nbytes
        # Converted to TVM's array once: a Python list is converted on every call that takes it
        # (twice a decode step; 11 us for an 8B model's 450 tensors).
        self.params = tvm.runtime.convert(params)
        # batch_prefill and batch_decode with the device's BLAS for long forwards and wide steps, where
        # torch can run it here and its float weights fit (made now, before the KV cache takes the rest).
        self.gemm_weights, self.gemm_unusable = library_gemm.kept_weights(
            self.artifact, self.vm, self.device, self.params, max_total_tokens, memory_utilization, loaded)
        if self.gemm_unusable is None:
            loaded += cfg.library_gemm_bytes
        if max_total_tokens is None:
            max_total_tokens = runner_kv_tokens(artifact, self.device, self.max_num_seqs, memory_utilization, loaded)
        self.max_total_tokens = max_total_tokens or default_kv_tokens(artifact, self.max_num_seqs)
        self._buffers: dict[str, _Staging] = {}                 # _staged's device buffers
        with huge_pages.advised_new_mappings(artifact.device == "cpu"):
            if cfg.kv_cache.owner == "kiln":
                self.cache = OwnedCache(cfg.kv_cache, self.device, self.max_total_tokens, self._staged,
                                        self.max_num_seqs)
            else:
                self.cache = TVMCache(self.vm["create_paged_kv_cache"](
                    ShapeTuple([self.max_num_seqs]), ShapeTuple([self.max_total_tokens]),
                    ShapeTuple([self.prefill_chunk]), ShapeTuple([self.page_size]),
                    ShapeTuple([int(bool(self.window and self.window.per_sequence))])), self.window)
        self._fn = {name: self.vm[name] for name in ("embed", "batch_prefill", "batch_decode", "batch_verify")}
        for name in OPTIONAL_ENTRY_FUNCTIONS:
            if name in cfg.entry_functions:
                self._fn[name] = self.vm[name]
        if self.gemm_unusable is None:
            for name in LIBRARY_GEMM_COPIES:
                if name in cfg.entry_functions:
                    self._fn[name] = self.vm[name]
        # A GPU's forwards only queue kernels: they keep the GIL (see _holding_gil); a CPU's compute
        # on the calling thread, so they let it go (a server's event loop runs meanwhile), but for the
        # embedding's small gather.
        self.queues_work = artifact.device != "cpu"
        for name, fn in self._fn.items():
            fn.release_gil = not self.queues_work and name != "embed"
        self._shared: set[int] = set()          # sequences in a fork: their pages are shared blocks
        self._held: set[int] = set()            # every sequence in the KV cache (at most max_num_seqs)
        self.graphs: StepGraphs | None = None
        self._capture_fn = self._fn               # what a step graph is captured through (start_step_graphs)
        if step_graphs:
            self.start_step_graphs()

    def start_step_graphs(self) -> StepGraphs:
        """Decode steps replayed as whole CUDA graphs from here on (runtime/step_graph.py), captured
        through a second VM whose TVM graph stretches launch their kernels themselves."""
        if self.artifact.device != "cuda":
            raise ValueError(f"step graphs are CUDA graphs, and this artifact runs on {self.artifact.device}: "
                             "leave --step-graphs (step_graphs) off, or compile for a CUDA target")
        self._capture_fn = capture_functions(self.module, self.device, [n for n in CAPTURED if n in self._fn])
        for fn in self._capture_fn.values():      # as the runner's own on a GPU: they only queue work
            fn.release_gil = False
        self.graphs = StepGraphs(self.device)
        return self.graphs

    def stop_step_graphs(self) -> None:
        """Decode steps run plainly again; the graphs and their stream freed."""
        graphs, self.graphs, self._capture_fn = self.graphs, None, self._fn
        if graphs is not None:
            graphs.close()

    def library_gemm_note(self) -> str | None:
        """What the runner does with the artifact's library GEMM entries, in a clause for a load
        message; None where it has none."""
        return library_gemm.note(self.artifact.config, self.gemm_unusable)

    @property
    def greedy_on_device(self) -> bool:
        """Whether decode_greedy picks tokens where the logits are (artifacts built before
        greedy_tokens existed copy the logits back and take the argmax here)."""
        return "greedy_tokens" in self._fn

    # -- sequences --------------------------------------------------------------------
    @property
    def shares_kv(self) -> bool:
        """Whether sequences can share KV pages (forks: prefix caching, n > 1): not with a sliding window
        on TVM's cache (the cache kiln owns keeps every token: its forks are exact on any model), nor with
        recurrent layers (a state holds a sequence's every token: KVCacheLayout.rewind_problem)."""
        return self.window is None and not self.artifact.config.kv_cache.states

    def add_sequence(self, seq_id: int) -> None:
        self.cache.add(seq_id)
        self._held.add(seq_id)

    def remove_sequence(self, seq_id: int) -> None:
        self.cache.remove(seq_id)
        self._shared.discard(seq_id)
        self._held.discard(seq_id)

    @property
    def full(self) -> bool:
        """Whether the KV cache holds max_num_seqs sequences (the next add would fail)."""
        return len(self._held) >= self.max_num_seqs

    def fork_sequence(self, parent: int, child: int, fork_pos: int = -1) -> None:
        if self.window:
            raise RuntimeError("sliding-window sequences cannot be forked (TVM cannot share windowed KV "
                               "correctly); add the child and compute its prompt instead")
        self.cache.fork(parent, child, fork_pos)
        self._shared.update((parent, child))
        self._held.add(child)

    def rename_sequence(self, seq_id: int, new_id: int) -> None:
        """`new_id` takes over `seq_id` whole (a recurrent model's prefix-cache entry its next prompt
        continues: the state is the sequence's end, so it moves rather than forks). The cache kiln owns only."""
        self.cache.rename(seq_id, new_id)
        for held in (self._held, self._shared):
            if seq_id in held:
                held.discard(seq_id)
                held.add(new_id)

    def pop_tokens(self, seq_id: int, n: int) -> None:
        self.cache.pop(seq_id, n)

    def free_pages(self) -> int:
        return self.cache.free_pages()

    def sequence_length(self, seq_id: int) -> int:
        """Tokens TVM holds for the sequence (with a per-sequence window: at most window.kept)."""
        return self.cache.length(seq_id)

    def _check_window(self, seq_ids: Sequence[int], lengths: Sequence[int]) -> None:
        if self.window is None:
            return
        for seq_id, n in zip(seq_ids, lengths):
            held = self.sequence_length(seq_id)
            if n > self.window.max_chunk(held):
                raise ValueError(f"sequence {seq_id} appends {n} tokens after {held}, but the {self.window.size}-token "
                                 f"sliding window allows {self.window.max_chunk(held)} per forward; split the "
                                 "append (the Scheduler and ModelRunner.prefill do)")

    # -- forward passes ---------------------------------------------------------------
    def run(self, seq_ids: Sequence[int], tokens: Sequence[Sequence[int]], full: Sequence[bool] = ()):
        """One forward over a ragged batch: append each sequence's tokens; last-token logits [batch, vocab].

        All-single-token batches take the decode kernel; anything else batch_prefill (the caller
        keeps the total within the artifact's prefill chunk). With `full` (a flag per sequence),
        batch_prefill also gathers the flagged sequences' logits at every position and the result is
        (last-token logits, {row: logits [n, vocab] of that sequence's tokens}); more rows than
        max_batch_size are gathered over several forwards.
        """
        full = list(full) or [False] * len(seq_ids)
        if all(len(t) == 1 for t in tokens) and not any(full):
            return self.decode(seq_ids, [t[0] for t in tokens])
        self._check_forward(seq_ids, tokens)
        last, scored = {}, {}
        for part in row_bounded(list(zip(range(len(seq_ids)), tokens, full)), self.max_batch_size):
            rows = self._forward([seq_ids[i] for i, _, _ in part], [t for _, t, _ in part], [f for _, _, f in part])
            for (i, _, f), r in zip(part, rows):
                last[i] = r[-1]
                if f:
                    scored.setdefault(i, []).append(r)
        logits = np.stack([last[i] for i in range(len(seq_ids))])
        if not any(full):
            return logits                                                   # [batch, vocab]
        return logits, {i: np.concatenate(r) for i, r in scored.items()}

    def _check_forward(self, seq_ids, tokens) -> None:
        total = sum(len(t) for t in tokens)
        if total > self.prefill_chunk:
            raise ValueError(f"a forward of {total} tokens exceeds the artifact's prefill chunk ({self.prefill_chunk})")
        self._check_window(seq_ids, lengths=[len(t) for t in tokens])

    def _forward(self, seq_ids, tokens, full) -> list[np.ndarray]:
        """One batch_prefill call; per sequence the logits it returns: every position if full, else the last."""
        logits, spans = self._forward_on_device(seq_ids, tokens, full)
        logits = _to_host(logits, wait=self.queues_work)[0]                  # [positions, vocab]
        return np.split(logits, np.cumsum([len(p) for p in spans])[:-1])

    def _forward_on_device(self, seq_ids, tokens, full):
        """One batch_prefill call: (its logits [1, positions, vocab] on the device, each sequence's positions)."""
        lengths = [len(t) for t in tokens]
        flat = np.concatenate([np.asarray(t, dtype=np.int32) for t in tokens])
        embeds = self._embed(flat)                                          # [1, total, hidden]
        ends = np.cumsum(lengths, dtype=np.int32)
        spans = [np.arange(e - n, e, dtype=np.int32) if f else np.array([e - 1], np.int32)
                 for e, n, f in zip(ends, lengths, full)]                   # positions whose logits come back
        name = LIBRARY_GEMM_ENTRY if LIBRARY_GEMM_ENTRY in self._fn and len(flat) >= library_gemm.MIN_TOKENS \
            else "batch_prefill"
        positions = self._staged("positions", np.concatenate(spans))
        kv = self.cache.begin(seq_ids, lengths)
        weights = (self.gemm_weights,) if name == LIBRARY_GEMM_ENTRY else ()
        logits, _ = self._fn[name](embeds, positions, kv, self.params, *weights)
        self.cache.end()
        return logits, spans

    def prefill(self, seq_ids: Sequence[int], tokens: Sequence[Sequence[int]]) -> np.ndarray:
        """Append whole prompts, split into calls of at most prefill_chunk tokens; last-token logits."""
        last = {}
        limit = None
        if self.window:
            limit = lambda seq_id: self.window.max_chunk(self.sequence_length(seq_id))   # noqa: E731
        for chunk in prefill_chunks(list(seq_ids), [list(t) for t in tokens], self.prefill_chunk, limit):
            ids, _, pieces = zip(*chunk)
            last.update(zip(ids, self.run(ids, pieces)))
        return np.stack([last[s] for s in seq_ids])

    def decode(self, seq_ids: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """One token per sequence; next-token logits [batch, vocab]."""
        return _to_host(self._decode(seq_ids, tokens)[0], wait=self.queues_work)[:, 0, :]

    def decode_greedy(self, seq_ids: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """One token per sequence; each sequence's greedy next token [batch] (np.argmax of its
        logits: the first of equal maxima), chosen on the device when the artifact can."""
        return self.next_tokens(seq_ids, [[t] for t in tokens])

    @property
    def samples_on_device(self) -> bool:
        """Whether next_tokens can draw tokens where the logits are (the sample_tokens entry)."""
        return "sample_tokens" in self._fn

    def decode_sampled(self, seq_ids: Sequence[int], tokens: Sequence[int], params: np.ndarray) -> np.ndarray:
        """One token per sequence, drawn on the device from its logits as the row of `params` says
        (temperature, top_k, top_p, min_p, u: runtime/sampler.py device_params); [batch] int32."""
        return self.next_tokens(seq_ids, [[t] for t in tokens], params)

    def next_tokens(self, seq_ids: Sequence[int], tokens: Sequence[Sequence[int]],
                    params: np.ndarray | None = None) -> np.ndarray:
        """One forward over a ragged batch, as run() (decode steps, prefill chunks, or both), whose
        next token per sequence is picked where the logits are, so only the tokens come back:
        params None, each row's argmax (greedy_tokens; np.argmax of the copied logits for artifacts
        without it); else drawn by sample_tokens from the row of params [batch, 5]. [batch] int32."""
        return self.launch_next_tokens(seq_ids, tokens, params).wait()

    def launch_next_tokens(self, seq_ids: Sequence[int], tokens: Sequence[Sequence[int]],
                           params: np.ndarray | None = None, logits_rows: int = 0) -> "LaunchedTokens":
        """next_tokens without the wait: the forward is queued on the device (a GPU runs it while the
        caller goes on) and LaunchedTokens.wait() copies its tokens back, LaunchedTokens.logits() the
        logits of the first `logits_rows` sequences (for a host sampler). Until then the caller must
        not begin another forward on this KV cache: TVM's cache reuses one pinned host buffer and one
        device buffer for the page tables each forward copies, and on CUDA it copies them on a
        non-blocking stream of its own, which does not wait for the forward still queued (tools/README.md
        "The host gap"); adding, removing and forking sequences is host bookkeeping."""
        pick = "sample" if params is not None else "greedy" if self.greedy_on_device else "logits"
        # Staged first: the copy waits for the device, so after the forward it would wait for it.
        staged = None if params is None else self._staged("params", params.astype(np.float32))
        if all(len(t) == 1 for t in tokens):
            logits, picked = self._decode(seq_ids, [t[0] for t in tokens], pick, staged)   # [batch, 1, vocab]
        else:
            self._check_forward(seq_ids, tokens)
            logits, _ = self._forward_on_device(seq_ids, tokens, [False] * len(seq_ids))
            logits = _view(logits, [len(seq_ids), 1, logits.shape[-1]])
            picked = self._pick(pick, logits, staged)
        front = _view(logits, [logits_rows, 1, logits.shape[-1]]) if logits_rows else None
        if picked is None:
            return LaunchedTokens(logits, self.queues_work, argmax=True, front=front)
        return LaunchedTokens(picked, self.queues_work, front=front, count=len(seq_ids))

    def _pick(self, pick: str, logits, params=None, fn: dict | None = None):
        """The tokens [batch] drawn on the device from logits [batch, 1, vocab]: "greedy" (greedy_tokens),
        "sample" (sample_tokens, a row of the staged params a sequence); "logits": None (none picked).
        fn: the functions to call (the runner's own by default)."""
        fn = fn or self._fn
        if pick == "greedy":
            return fn["greedy_tokens"](logits)
        if pick == "sample":
            return fn["sample_tokens"](logits, params)
        return None

    def _decode(self, seq_ids: Sequence[int], tokens: Sequence[int], pick: str = "logits", params=None):
        """One decode step queued: (logits [batch, 1, vocab], its tokens picked as _pick says, or None)
        on the device; params: sample's, already staged. Replayed from a CUDA graph where the runner
        keeps them and the step may (_graph_key, runtime/step_graph.py)."""
        n = len(seq_ids)
        # Staged before any capture, as the params are: a graph reads the buffers it was captured with.
        ids = self._staged_ids(np.asarray(tokens, dtype=np.int32))
        library = LIBRARY_GEMM_DECODE in self._fn and n >= library_gemm.min_decode_rows(self.artifact.config)
        key = None if library else self._graph_key(pick, seq_ids)
        kv = self.cache.begin(seq_ids, [1] * n)

        def forward(fn: dict = self._fn):
            embeds = fn["embed"](ids, self.params)                                         # [batch, hidden]
            embeds = _view(embeds, [n, 1, embeds.shape[-1]])
            if library:
                logits, _ = fn[LIBRARY_GEMM_DECODE](embeds, kv, self.params, self.gemm_weights)
            else:
                logits, _ = fn["batch_decode"](embeds, kv, self.params)
            return logits, self._pick(pick, logits, params, fn)

        if key is None:
            out = forward()
        else:
            self.cache.copy_tables()           # the page tables copied here, not in the graph
            out = self.graphs.run(key, forward, lambda: forward(self._capture_fn))
        self.cache.end()
        return out

    def _graph_key(self, pick: str, seq_ids: Sequence[int]) -> tuple | None:
        """What a decode step's CUDA graph is kept by (pick, batch, the pages the sequences will hold), or
        None where the step runs plainly: no graphs, a sliding window, a sequence in a fork
        (runtime/step_graph.py says why)."""
        if self.graphs is None or self.window or self._shared.intersection(seq_ids):
            return None
        pages = sum(-(-(self.sequence_length(s) + 1) // self.page_size) for s in seq_ids)
        return pick, len(seq_ids), pages

    def verify(self, seq_id: int, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens to one sequence and return the logits at every position [n, vocab]."""
        self._check_window([seq_id], [len(tokens)])
        embeds = self._embed(np.asarray(tokens, dtype=np.int32))
        kv = self.cache.begin([seq_id], [len(tokens)])
        logits, _ = self._fn["batch_verify"](embeds, kv, self.params)
        self.cache.end()
        return _to_host(logits, wait=self.queues_work)[0]

    def check_drafts(self, seq_ids: Sequence[int], tokens: Sequence[Sequence[int]], greedy: bool) -> np.ndarray:
        """One forward appending each sequence's tokens (its newest token, then a draft); at every
        position, in order, the greedy next token [positions] (np.argmax of its logits: picked on the
        device where the artifact can, so only the tokens come back) or, greedy False, the logits
        [positions, vocab]: what a speculative step keeps of its drafts. At most max_batch_size
        positions in all (the rows a forward returns)."""
        self._check_forward(seq_ids, tokens)
        n = sum(len(t) for t in tokens)
        if n > self.max_batch_size:
            raise ValueError(f"{n} positions' logits in one forward exceed the artifact's max batch size "
                             f"({self.max_batch_size})")
        logits, _ = self._forward_on_device(seq_ids, tokens, [True] * len(seq_ids))   # [1, n, vocab]
        if greedy and self.greedy_on_device:
            return _to_host(self._fn["greedy_tokens"](_view(logits, [n, 1, logits.shape[-1]])), wait=self.queues_work)
        rows = _to_host(logits, wait=self.queues_work)[0]
        return np.argmax(rows, axis=1) if greedy else rows

    def last_hidden(self, seq_id: int, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens to one (new) sequence, a prefill chunk at a time; the final hidden state of the
        last token [hidden] (what embeddings pool). Needs an artifact with the batch_hidden entry."""
        if "batch_hidden" not in self._fn:
            raise InvalidRequestError("this artifact was compiled before kiln could return hidden states; "
                                      "recompile it with `kiln compile` to serve embeddings", "input")
        hidden, start = None, 0
        while start < len(tokens):
            take = self.prefill_chunk
            if self.window:                                     # the sliding window's bound per forward
                take = min(take, self.window.max_chunk(self.sequence_length(seq_id)))
            piece = np.asarray(tokens[start:start + take], dtype=np.int32)
            start += len(piece)
            embeds = self._embed(piece)
            positions = self._staged("positions", np.array([len(piece) - 1], np.int32))
            kv = self.cache.begin([seq_id], [len(piece)])
            hidden, _ = self._fn["batch_hidden"](embeds, positions, kv, self.params)
            self.cache.end()
        return _to_host(hidden, wait=self.queues_work)[0, 0]

    def _staged(self, name: str, array: np.ndarray):
        """`array` copied into the front of a device buffer kept for `name` (the ids, positions or
        sampling parameters of a call), as a view of its shape. The buffers are allocated once, at
        the bound of what a call passes (and grown if a call passes more): a fresh device tensor per
        call was a device allocation and free every step (on CUDA, cudaFree waits for the device).
        The runtime queues copies and kernels in order, so a copy into a buffer follows every
        kernel launched before it that reads the buffer. The copy also waits for the device
        (TVMTensorCopyFromBytes synchronises the stream): every forward stages its ids first, so it
        starts after the previous forward has finished, which is what keeps TVM's KV cache from
        overwriting the previous forward's page tables on the device (its copy stream is non-blocking).
        Each buffer keeps a host mirror the array is copied into, that mirror's pointer and its views by
        shape, so a call asks the device buffer nothing and makes no pointer (the ids' staging of a CPU
        decode step, its caches cold, took 134 us through a new view and pointer, 14 through kept ones)."""
        slot = self._buffers.get(name)
        rows = array.shape[0]
        if (slot is None or slot.host.shape[0] < rows or slot.host.shape[1:] != array.shape[1:]
                or slot.host.dtype != array.dtype):
            bound = max(rows, self.prefill_chunk, self.max_batch_size)
            host = np.empty((bound, *array.shape[1:]), array.dtype)
            slot = self._buffers[name] = _Staging(tvm.runtime.empty(host.shape, str(array.dtype), self.device),
                                                  host, host.ctypes.data_as(ctypes.c_void_p), {})
        view = slot.views.get(array.shape)
        if view is None:
            view = slot.views[array.shape] = _view(slot.device, array.shape)
        slot.host[:rows] = array
        _COPY_IN(view, slot.pointer, array.nbytes)
        return view

    def _staged_ids(self, ids: np.ndarray):
        if len(ids) > max(self.prefill_chunk, self.max_batch_size):         # the planned bound of `embed`
            raise ValueError(f"{len(ids)} tokens in one call exceed the artifact's prefill chunk "
                             f"({self.prefill_chunk})")
        return self._staged("ids", ids if ids.dtype == np.int32 else ids.astype(np.int32))

    def _embed(self, ids: np.ndarray):
        out = self._fn["embed"](self._staged_ids(ids), self.params)
        return _view(out, [1, *out.shape])                                             # [1, n, hidden]
