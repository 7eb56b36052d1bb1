"""ModelRunner: calls an artifact's entry functions by name and drives the paged KV cache.

The only place the runtime touches TVM, through `tvm.runtime` alone (runtime/_tvm.py): the
artifact runs on a runtime-only TVM. Token ids are checked on the host
before any call (an out-of-range id would make the embedding gather read out
of bounds), and a prefill longer than the artifact's chunk is split.
"""

from __future__ import annotations

import os
from typing import Sequence

# TVM's CPU thread pool assumes x86 cores are hyperthreaded and uses half of them unless told;
# on these machines that halves throughput. Use every core this process may run on.
os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                             else os.cpu_count() or 1))

import numpy as np

from ._tvm import open_device, tvm
from tvm.runtime import ShapeTuple
from tvm.runtime.vm import VirtualMachine

from .artifact import Artifact, check_host
from .protocol import InvalidRequestError

_KV = {name: tvm.get_global_func(f"vm.builtin.{name}") for name in (
    "kv_state_add_sequence", "kv_state_remove_sequence", "kv_state_fork_sequence", "kv_state_popn",
    "kv_state_begin_forward", "kv_state_end_forward", "attention_kv_cache_get_num_available_pages")}


class ModelRunner:
    def __init__(self, artifact: Artifact, max_num_seqs: int | None = None, max_total_tokens: int | None = None):
        cfg = artifact.config
        self.artifact = artifact
        check_host(artifact)
        self.device = open_device(artifact.device)            # loads the device's TVM runtime if needed
        self.vocab_size = artifact.vocab_size
        self.context_window = artifact.context_window
        self.prefill_chunk = cfg.prefill_chunk_size
        self.page_size = cfg.kv_cache.page_size
        self.max_num_seqs = max_num_seqs or cfg.max_batch_size
        # Room for one full-context sequence plus a partly filled page per other sequence.
        self.max_total_tokens = max_total_tokens or self.context_window + self.max_num_seqs * self.page_size
        self.vm = VirtualMachine(tvm.runtime.load_module(str(artifact.lib_path)), self.device)
        self.params = [tvm.runtime.tensor(a, self.device) for a in artifact.iter_params()]   # one host copy at a time
        self.kv = self.vm["create_paged_kv_cache"](
            ShapeTuple([self.max_num_seqs]), ShapeTuple([self.max_total_tokens]),
            ShapeTuple([self.prefill_chunk]), ShapeTuple([self.page_size]), ShapeTuple([0]))
        self._fn = {name: self.vm[name] for name in ("embed", "batch_prefill", "batch_decode", "batch_verify")}

    # -- sequences --------------------------------------------------------------------
    def add_sequence(self, seq_id: int) -> None:
        _KV["kv_state_add_sequence"](self.kv, seq_id)

    def remove_sequence(self, seq_id: int) -> None:
        _KV["kv_state_remove_sequence"](self.kv, seq_id)

    def fork_sequence(self, parent: int, child: int, fork_pos: int = -1) -> None:
        _KV["kv_state_fork_sequence"](self.kv, parent, child, fork_pos)

    def pop_tokens(self, seq_id: int, n: int) -> None:
        _KV["kv_state_popn"](self.kv, seq_id, n)

    def free_pages(self) -> int:
        return int(_KV["attention_kv_cache_get_num_available_pages"](self.kv))

    # -- forward passes ---------------------------------------------------------------
    def check_tokens(self, ids: Sequence[int]) -> np.ndarray:
        arr = np.asarray(ids, dtype=np.int64)
        if arr.ndim != 1:
            raise InvalidRequestError("token ids must be a flat list of integers", "prompt")
        bad = arr[(arr < 0) | (arr >= self.vocab_size)]
        if bad.size:
            raise InvalidRequestError(f"token id {int(bad[0])} is outside the vocabulary [0, {self.vocab_size}); "
                                      "pass ids produced by this model's tokenizer", "prompt")
        return arr.astype(np.int32)

    def run(self, seq_ids: Sequence[int], tokens: Sequence[Sequence[int]]) -> np.ndarray:
        """One forward over a ragged batch: append each sequence's tokens; last-token logits [batch, vocab].

        All-single-token batches take the decode kernel; anything else one batch_prefill call
        (the caller keeps the total within the artifact's prefill chunk).
        """
        if all(len(t) == 1 for t in tokens):
            return self.decode(seq_ids, [t[0] for t in tokens])
        lengths = [len(t) for t in tokens]
        flat = np.concatenate([np.asarray(t, dtype=np.int32) for t in tokens])
        embeds = self._embed(flat)                                          # [1, total, hidden]
        positions = np.cumsum(lengths, dtype=np.int32) - 1                  # last token of each
        _KV["kv_state_begin_forward"](self.kv, ShapeTuple(list(seq_ids)), ShapeTuple(lengths))
        logits, _ = self._fn["batch_prefill"](embeds, tvm.runtime.tensor(positions, self.device),
                                              self.kv, self.params)
        _KV["kv_state_end_forward"](self.kv)
        return logits.numpy()[0]                                            # [batch, vocab]

    def prefill(self, seq_ids: Sequence[int], tokens: Sequence[Sequence[int]]) -> np.ndarray:
        """Append whole prompts, split into calls of at most prefill_chunk tokens; last-token logits."""
        last = {}
        for chunk in _chunks(list(seq_ids), [list(t) for t in tokens], self.prefill_chunk):
            ids, _, pieces = zip(*chunk)
            last.update(zip(ids, self.run(ids, pieces)))
        return np.stack([last[s] for s in seq_ids])

    def decode(self, seq_ids: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """One token per sequence; next-token logits [batch, vocab]."""
        embeds = self._embed(np.asarray(tokens, dtype=np.int32))            # [1, batch, hidden]
        embeds = embeds._create_view(ShapeTuple([len(seq_ids), 1, embeds.shape[-1]]))      # [batch, 1, hidden]
        _KV["kv_state_begin_forward"](self.kv, ShapeTuple(list(seq_ids)), ShapeTuple([1] * len(seq_ids)))
        logits, _ = self._fn["batch_decode"](embeds, self.kv, self.params)
        _KV["kv_state_end_forward"](self.kv)
        return logits.numpy()[:, 0, :]

    def verify(self, seq_id: int, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens to one sequence and return the logits at every position [n, vocab]."""
        embeds = self._embed(np.asarray(tokens, dtype=np.int32))
        _KV["kv_state_begin_forward"](self.kv, ShapeTuple([seq_id]), ShapeTuple([len(tokens)]))
        logits, _ = self._fn["batch_verify"](embeds, self.kv, self.params)
        _KV["kv_state_end_forward"](self.kv)
        return logits.numpy()[0]

    def _embed(self, ids: np.ndarray):
        out = self._fn["embed"](tvm.runtime.tensor(ids.astype(np.int32), self.device), self.params)
        return out._create_view(ShapeTuple([1, *out.shape]))                      # [1, n, hidden]


def _chunks(seq_ids: list[int], tokens: list[list[int]], budget: int):
    """Split a ragged prefill into calls of at most `budget` tokens: yields [(seq_id, n, ids)]."""
    pending = [(s, np.asarray(t, dtype=np.int32)) for s, t in zip(seq_ids, tokens)]
    while pending:
        chunk, used, rest = [], 0, []
        for s, t in pending:
            take = min(len(t), budget - used)
            if take <= 0 or any(c[0] == s for c in chunk):
                rest.append((s, t))
                continue
            chunk.append((s, take, t[:take]))
            used += take
            if take < len(t):
                rest.append((s, t[take:]))
        pending = rest
        yield chunk
