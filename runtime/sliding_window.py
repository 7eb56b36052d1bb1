"""SlidingWindow: what an artifact's sliding-window layers ask of the runtime. Plain Python, no TVM.

A sliding layer lets the query at position q attend to keys in (q - size, q]: `size` tokens, itself
included (transformers' `kv_idx > q_idx - sliding_window`). TVM's paged KV cache (0.27,
src/runtime/vm/paged_kv_cache.cc) does this in one of two ways, and kiln picks by the layer kinds
the compiler recorded (runtime/contract.py KVCacheLayout; models/causal_lm.py builds the cache to
match):

per_sequence  every layer slides (Mistral). The cache is created with support_sliding_window=1
              and the window enabled per sequence with `kept` = size - 1 tokens: after each
              append TVM drops a sequence's oldest tokens beyond `kept` and frees the pages they
              leave (so a sequence holds at most ~kept + page_size tokens of pages), and applies
              RoPE inside attention. A new token attends to every kept token (no mask), so
              a forward is exact only while it ends within the first `size` tokens or appends
              one token: `max_chunk`. (A page freed in BeginForward may go to another sequence
              of the same forward: harmless, as with the window on TVM writes each layer's new
              KV after that layer's attention has read the pages.)
per_layer     some layers slide, others are full (Qwen2 with max_window_layers, Gemma 2/3). The
              full layers need every page, so nothing is freed; sliding layers read the last
              `size` cached tokens with a per-row mask over them, but the new tokens of one
              forward attend to each other without the window, and a row that sees no cached
              key comes out NaN: at most size - 1 tokens per sequence per forward.

Neither way shares KV correctly between sequences: TVM forks a windowed sequence only inside its
attention sinks, and per-layer windows are cut per shared block, not per sequence. Prefix reuse
and n > 1 forks are therefore off for sliding artifacts (each sequence computes its own prompt).
TVM's attention sinks (StreamingLLM's first tokens kept) are 0: no supported family has them, and TVM's
sinks renumber positions, which no Hugging Face model does. (The learned sinks of gpt-oss and its kin, a
logit per head, are another thing: the KV cache kiln owns applies them, and keeps every token of a
sliding layer, masking by position: artifacts compiled with it have no SlidingWindow here.)
"""

from __future__ import annotations

from dataclasses import dataclass

from .contract import KVCacheLayout


@dataclass(frozen=True)
class SlidingWindow:
    size: int                   # tokens a query attends to, itself included
    per_sequence: bool          # every layer slides: TVM keeps `kept` tokens per sequence, frees the rest

    def __post_init__(self) -> None:
        if self.size < 2:
            raise ValueError(f"a sliding window of {self.size} tokens is too small; it needs at least 2")

    @classmethod
    def of(cls, layout: KVCacheLayout) -> "SlidingWindow | None":
        """The artifact's window, None when no layer slides or the KV cache is kiln's (which keeps every
        token and masks each row by position: no bound per forward)."""
        if "sliding" not in layout.layer_kinds or layout.owner == "kiln":
            return None
        mode = layout.window_mode or ("per_sequence" if set(layout.layer_kinds) == {"sliding"} else "per_layer")
        return cls(int(layout.sliding_window), per_sequence=mode == "per_sequence")

    @property
    def kept(self) -> int:
        """Tokens TVM keeps per sequence with a per-sequence window: the cached keys a new token
        attends to besides itself."""
        return self.size - 1

    @property
    def attention_sink(self) -> int:
        return 0

    def max_chunk(self, start: int) -> int:
        """Most tokens one forward may append to a sequence that holds `start` tokens."""
        if self.per_sequence:
            return max(self.size - start, 1)
        return self.size - 1

    def max_pages(self, page_size: int) -> int | None:
        """Most pages TVM holds for one sequence, however long: None for per-layer windows (all kept)."""
        if not self.per_sequence:
            return None
        return -(-(self.kept + page_size - 1) // page_size)      # kept tokens, starting mid-page
