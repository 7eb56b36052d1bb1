"""The one spec builder for every model's entry functions.

Every architecture exposes the same entry functions with the same signatures,
so the runtime can drive any artifact by name. Shapes use symbolic dims:
`seq_len` (tokens in one call), `batch_size` (sequences in one call).
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache

from kiln.models.owned_kv import cache_spec
from kiln.runtime.contract import ENTRY_FUNCTIONS, LIBRARY_GEMM_COPIES, OPTIONAL_ENTRY_FUNCTIONS


_PACKED = {"param_mode": "packed", "effect_mode": "none"}
_NO_PARAMS = {"param_mode": "none", "effect_mode": "none"}


def build_spec(model: nn.Module, hidden_size: int, vocab_size: int, dtype: str, library_gemm: bool = False) -> dict:
    """The export spec for a causal LM whose methods are named as ENTRY_FUNCTIONS; with `library_gemm`,
    also the LIBRARY_GEMM_COPIES (batch_prefill and batch_decode again, their matmuls later routed to
    the device's BLAS). A model whose KV cache kiln owns (`owned_layout`, models/owned_kv.py) takes the
    cache's pages and page tables instead of TVM's cache object, and has no create_paged_kv_cache."""
    owned = getattr(model, "owned_layout", None)
    width = getattr(model, "embed_width", hidden_size)      # what `embed` returns a token (Gemma 4: more than hidden)

    def kv(tokens="seq_len"):
        return nn.spec.Object(object_type=PagedKVCache) if owned is None else cache_spec(owned, tokens)

    def embeds(*shape):
        return nn.spec.Tensor([*shape, width], dtype)

    spec = {
        "embed": {"input_ids": nn.spec.Tensor(["seq_len"], "int32"), "$": _PACKED},
        "prefill": {"input_embed": embeds(1, "seq_len"), "paged_kv_cache": kv(), "$": _PACKED},
        "decode": {"input_embed": embeds(1, 1), "paged_kv_cache": kv(1), "$": _PACKED},
        "batch_prefill": {"input_embeds": embeds(1, "seq_len"),
                          "logit_positions": nn.spec.Tensor(["batch_size"], "int32"),
                          "paged_kv_cache": kv(), "$": _PACKED},
        "batch_hidden": {"input_embeds": embeds(1, "seq_len"),
                         "logit_positions": nn.spec.Tensor(["batch_size"], "int32"),
                         "paged_kv_cache": kv(), "$": _PACKED},
        "batch_decode": {"input_embeds": embeds("batch_size", 1), "paged_kv_cache": kv("batch_size"), "$": _PACKED},
        "batch_verify": {"input_embeds": embeds(1, "seq_len"), "paged_kv_cache": kv(), "$": _PACKED},
        "greedy_tokens": {"logits": nn.spec.Tensor(["batch_size", 1, vocab_size], "float32"), "$": _NO_PARAMS},
        "sample_tokens": {"logits": nn.spec.Tensor(["batch_size", 1, vocab_size], "float32"),
                          "params": nn.spec.Tensor(["batch_size", 5], "float32"), "$": _NO_PARAMS},
        "create_paged_kv_cache": {
            "max_batch_size": int, "max_total_seq_len": int, "prefill_chunk_size": int,
            "page_size": int, "support_sliding_window": int, "$": _NO_PARAMS},
    }
    if owned is not None:
        del spec["create_paged_kv_cache"]
    missing = [name for name in (*ENTRY_FUNCTIONS, *OPTIONAL_ENTRY_FUNCTIONS)
               if name in spec and not callable(getattr(model, name, None))]
    if missing:
        raise TypeError(f"{type(model).__name__} lacks entry functions {missing}")
    for name, original in LIBRARY_GEMM_COPIES.items() if library_gemm else ():
        setattr(model, name, getattr(model, original))
        spec[name] = dict(spec[original])                              # export_tvm takes its "$" out
    return spec


# Entry functions whose output TVM may size at the bound: all but batch_verify, whose output is
# the logits at every position (a prefill chunk times the vocabulary at the bound).
_BOUNDED_OUTPUT = ("embed", "prefill", "decode", "batch_prefill", "batch_hidden", "batch_decode",
                   "greedy_tokens", "sample_tokens", *LIBRARY_GEMM_COPIES)


def bound_shapes(mod, prefill_chunk: int, max_batch_size: int):
    """Give each entry function upper bounds for `seq_len` and `batch_size`, so TVM plans its memory
    once, at those sizes, instead of allocating per call shape (the VM's pool keeps one buffer per
    size it has seen, so a server's memory would grow with every new prompt length and batch).

    The runner keeps every call within them (runtime/model_runner.py): a forward's tokens within
    the chunk, its sequences and returned logit rows within max_batch_size.
    """
    for gv, func in list(mod.functions_items()):
        name = gv.name_hint
        if not isinstance(func, relax.Function) or name not in (*ENTRY_FUNCTIONS, *OPTIONAL_ENTRY_FUNCTIONS,
                                                                 *LIBRARY_GEMM_COPIES):
            continue
        seq_len = max(prefill_chunk, max_batch_size) if name == "embed" else prefill_chunk  # decode embeds a batch
        func = func.with_attr("tir_var_upper_bound", {"seq_len": seq_len, "batch_size": max_batch_size})
        func = func.with_attr("tir_non_negative_var", ["seq_len", "batch_size"])
        if name in _BOUNDED_OUTPUT:
            func = func.with_attr("relax.memory_plan_dynamic_func_output", True)
        mod[gv] = func
    return mod
