"""EngineConfig: how an Engine runs an artifact (its limits, KV cache size, sampling place, overlap and
speculative decoding), and how its KV capacity settings become the ModelRunner's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .artifact import Artifact
from .memory_budget import check_utilization


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int | None = None          # default: the artifact's max_batch_size
    # KV capacity, given one way at most. Default: on CUDA and ROCm, gpu_memory_utilization 0.9; elsewhere
    # one full context + a page per sequence.
    max_total_tokens: int | None = None      # as tokens
    kv_cache_bytes: int | None = None        # as memory (whole pages that fit)
    gpu_memory_utilization: float | None = None   # as the share of the device's memory the engine may take
    max_tokens_per_step: int | None = None   # chunked-prefill token budget; default: the artifact's prefill chunk
    policy: str = "fcfs"                     # or "priority"
    enable_prefix_cache: bool = True         # always off for a sliding-window artifact (its KV is never shared)
    # Recurrent artifacts (Mamba, Qwen3.5, ...): a prompt that agrees with the prefix cache for this many tokens
    # past its match (another conversation's system prompt) stops its prefill there once to cache its state
    # (runtime/scheduler.py): lower for short shared prefixes; each checkpoint takes a state slot.
    min_checkpoint: int = 64
    verify: bool = True                      # check artifact hashes on load
    chat_template: str | None = None         # jinja source replacing the artifact's (runtime/chat_templates.py)
    # Draw sampled decode tokens where the logits are (the artifact's sample_tokens) instead of copying
    # them back to the host Sampler. None: on for GPU artifacts (the per-row threshold search is slower than
    # numpy's partial sort on a CPU's few threads).
    device_sampling: bool | None = None
    # Decide (and launch, where the device picks the tokens) each step before the previous step's tokens
    # are detokenized, matched against stop strings and handed to callers, so that host work runs while
    # the device computes (a stop string found then costs the device the one token it computed past it).
    # None: on where forwards run asynchronously (GPUs); on a CPU the forward is the host's own work, so
    # there is nothing to overlap.
    overlap: bool | None = None
    # Speculative decoding by prompt lookup (vLLM's "ngram" method; runtime/speculative.py): in a step of
    # at most SPECULATE_UP_TO decodes whose logits nothing changes (no penalties, bias or grammar), each
    # request's draft, the up to this many tokens that followed the latest earlier occurrence of its last
    # prompt_lookup_max .. prompt_lookup_min tokens (prompt and output), is checked in the step's one
    # forward. Greedy requests keep the drafted tokens the model picks itself and its next one: greedy
    # decoding's tokens, more of them a forward where text repeats; sampled ones keep drafted tokens by
    # speculative sampling (sampling's distribution, other draws than without it). Drafts grow after one
    # kept whole, shrink after a miss and pause after one-token misses (speculative.Drafting). 0: off.
    speculative_tokens: int = 0
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    # The drafts from a draft model instead (vLLM's draft-model method, llama.cpp's --model-draft;
    # runtime/draft_model.py): an artifact of a smaller model with the same tokenizer, for the same
    # device, whose greedy tokens after each request's text are its draft. Same steps and rules as
    # above; speculative_tokens 0 means DRAFT_MODEL_TOKENS with a draft model. It is loaded first: on
    # CUDA and ROCm the engine's KV cache then gets what is left of gpu_memory_utilization beside it.
    draft_model: str | Path | None = None
    # Decode steps captured whole as CUDA graphs and replayed with one launch (runtime/step_graph.py):
    # CUDA artifacts only; off until a GPU run measures it (tools/gpu_checks.py `stepgraph`).
    step_graphs: bool = False


def kv_size(artifact: Artifact, config: EngineConfig) -> tuple[int | None, float | None]:
    """The KV capacity the config asks for, as ModelRunner takes it: (tokens, memory utilization),
    one of them set, or neither for the runner's default (on CUDA and ROCm: 0.9 of the device)."""
    given = [name for name in ("max_total_tokens", "kv_cache_bytes", "gpu_memory_utilization")
             if getattr(config, name) is not None]
    if len(given) > 1:
        raise ValueError(f"give the KV cache size once, not as {' and '.join(given)}")
    if config.gpu_memory_utilization is not None:
        check_utilization(config.gpu_memory_utilization)       # before any weight is loaded
    if config.kv_cache_bytes is not None:
        layout = artifact.config.kv_cache
        per_page = layout.bytes_per_token * layout.page_size
        pages = config.kv_cache_bytes // per_page
        if pages < 1:
            raise ValueError(f"a KV cache of {config.kv_cache_bytes} bytes holds no {layout.page_size}-token page "
                             f"of this model ({per_page} bytes); give at least {per_page} bytes")
        return pages * layout.page_size, None
    return config.max_total_tokens, config.gpu_memory_utilization
