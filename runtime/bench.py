"""Offline benchmark of one artifact: prefill and decode throughput, TTFT, TPOT, peak RSS.

Each run prefills `batch` prompts of `prompt_len` random tokens in one ragged
call, then decodes `gen_len` tokens for all of them, timing each call: a greedy
server step (ModelRunner.decode_greedy: the tokens picked on the device where the
artifact can, only they copied back). Medians over `runs` after one warm-up run.

`profile_kernels` breaks one prefill and the mean decode step down by kernel,
timing every VM Call instruction through the VM's instrument hook. `decode_read_bytes`
is the weight bytes a batch-1 decode step reads: what a bandwidth floor divides by.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ._tvm import tvm
from tvm.runtime.vm import VMInstrumentReturnKind

from .contract import PARAMS_DIR, PARAMS_INDEX
from .model_runner import ModelRunner

# kiln's parameter names (models/causal_lm.py decoder_weight_map) of the token-embedding table and
# of an LM head of its own.
EMBEDDING, LM_HEAD = "model.embed_tokens.", "lm_head."


@dataclass(frozen=True)
class BenchResult:
    prefill_tok_s: float       # prompt tokens per second (all sequences)
    decode_tok_s: float        # generated tokens per second (all sequences)
    ttft_ms: float             # time to first token: the prefill call
    tpot_ms: float             # time per output token step (one batch_decode)
    peak_rss_mb: float
    prompt_len: int
    gen_len: int
    batch: int
    runs: int
    sampling: dict | None = None       # the decode steps' draw (Sampling.as_dict); None: greedy

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Sampling:
    """How the benchmarked decode steps pick tokens: drawn on the device (sample_tokens) as a sampled
    server step does, each step a fresh uniform per sequence. temperature 0 is greedy decoding."""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1 or not 0 <= self.min_p < 1:
            raise ValueError(f"invalid sampling for a benchmark: {self}; temperature >= 0, top_k >= 0, "
                             "0 < top_p <= 1, 0 <= min_p < 1")
        if self.temperature == 0 and (self.top_k or self.top_p < 1 or self.min_p):
            raise ValueError("top_k, top_p and min_p shape a sampled draw: give a temperature above 0 too "
                             "(temperature 0 decodes greedily)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def as_dict(self) -> dict:
        return asdict(self)

    def step(self, runner: ModelRunner, seqs: list[int], tokens: list[int], rng: np.random.Generator):
        """One decode step's next tokens [batch]: greedy, or drawn on the device."""
        if self.greedy:
            return runner.decode_greedy(seqs, tokens)
        params = np.array([[self.temperature, self.top_k, self.top_p, self.min_p, u] for u in rng.random(len(seqs))],
                          np.float32)
        return runner.decode_sampled(seqs, tokens, params)

    def check(self, runner: ModelRunner) -> None:
        if not self.greedy and not runner.samples_on_device:
            raise ValueError("this artifact has no sample_tokens kernel, so its sampled steps copy the logits "
                             "to the host: benchmark it greedily (temperature 0), or recompile it")


GREEDY = Sampling()


def decode_read_bytes(artifact_dir: str | Path) -> int:
    """The weight bytes one batch-1 decode step streams: every tensor of the artifact's parameters
    but the token-embedding table where the model has an LM head of its own (a step gathers one row
    of the table; a tied model's LM head is the table, read whole). The bandwidth floor divides the
    device's bandwidth by this (an 8B Llama-3's q4f16 table is 0.30 GB of its 5.65)."""
    index = json.loads((Path(artifact_dir) / PARAMS_DIR / PARAMS_INDEX).read_text())
    tensors = index["tensors"]
    untied = any(t["name"].startswith(LM_HEAD) for t in tensors)
    return sum(t["nbytes"] for t in tensors if not (untied and t["name"].startswith(EMBEDDING)))


def kv_tokens_needed(page_size: int, prompt_len: int, gen_len: int, batch: int) -> int:
    """KV capacity (tokens, in whole pages) that `batch` sequences of prompt_len + gen_len need."""
    return batch * -(-(prompt_len + gen_len) // page_size) * page_size


def _check_fits(runner: ModelRunner, prompt_len: int, gen_len: int, batch: int) -> None:
    if prompt_len + gen_len > runner.context_window:
        raise ValueError(f"prompt_len + gen_len ({prompt_len + gen_len}) exceeds the context window "
                         f"({runner.context_window})")
    if batch > runner.max_num_seqs:
        raise ValueError(f"batch {batch} exceeds the {runner.max_num_seqs} sequences this artifact runs at once; "
                         f"recompile it with `kiln compile --max-batch-size {batch}`")
    need = kv_tokens_needed(runner.page_size, prompt_len, gen_len, batch)
    have = runner.free_pages() * runner.page_size
    if need > have:
        raise ValueError(f"batch {batch} x {prompt_len + gen_len} tokens needs {need} tokens of KV cache; this runner "
                         f"holds {have} (give it max_total_tokens >= {need})")


def bench(runner: ModelRunner, prompt_len: int = 128, gen_len: int = 64, batch: int = 1, runs: int = 3,
          seed: int = 0, sampling: Sampling = GREEDY) -> BenchResult:
    _check_fits(runner, prompt_len, gen_len, batch)
    sampling.check(runner)
    rng = np.random.default_rng(seed)
    prefill_s, step_s = [], []
    for run in range(runs + 1):                                   # run 0 warms up
        seqs = list(range(run * batch, (run + 1) * batch))
        prompts = rng.integers(0, runner.vocab_size, size=(batch, prompt_len)).tolist()
        for s in seqs:
            runner.add_sequence(s)
        t0 = time.perf_counter()
        logits = runner.prefill(seqs, prompts)
        t1 = time.perf_counter()
        tokens, steps = logits.argmax(-1), []
        for _ in range(gen_len):
            t = time.perf_counter()
            tokens = sampling.step(runner, seqs, tokens.tolist(), rng)   # a server's decode step
            steps.append(time.perf_counter() - t)
        for s in seqs:
            runner.remove_sequence(s)
        if run:
            prefill_s.append(t1 - t0)
            step_s.append(statistics.median(steps))
    p, d = statistics.median(prefill_s), statistics.median(step_s)
    return BenchResult(prefill_tok_s=batch * prompt_len / p, decode_tok_s=batch / d, ttft_ms=p * 1e3,
                       tpot_ms=d * 1e3, peak_rss_mb=peak_rss_mb(),
                       prompt_len=prompt_len, gen_len=gen_len, batch=batch, runs=runs,
                       sampling=None if sampling.greedy else sampling.as_dict())


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: Linux's VmHWM (this program's own, from its exec on),
    else ru_maxrss. On Linux ru_maxrss also keeps the peak of the process that spawned it before the
    exec (a benchmark started from a script holding transformers' model read 1,407 MB for kiln's 480)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024                          # kB
    except OSError:
        pass
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024    # bytes on macOS, kB elsewhere


# ---- per-kernel profile -------------------------------------------------------------------------

VM_OVERHEAD = "VM overhead"
CUDA_GRAPHS = "CUDA graph replays (the kernels captured in them)"
_ATTENTION = "vm.builtin.attention_kv_cache_"      # the paged-KV attention kernels: kept by name
_CUDA_GRAPH = "vm.builtin.cuda_graph.run_or_capture"
_SHAPE_FUNCS = ("shape_func", "compute_symbolic_expr")   # host shape code the VM's shape lowering emits


def kernel_group(symbol: str) -> str:
    """The profile line a VM call counts towards: the VM's own builtins (alloc_tensor, make_shape,
    null_value, reshape, tuple_getitem, ...) and shape functions are one VM_OVERHEAD line; attention
    builtins and compiled kernels keep their symbol; a CUDA graph's replay (every kernel captured in
    it: most of a decode step on CUDA) is a line of its own."""
    if symbol.startswith(_ATTENTION):
        return symbol
    if symbol == _CUDA_GRAPH:
        return CUDA_GRAPHS
    if symbol.startswith("vm.builtin.") or symbol.startswith(_SHAPE_FUNCS):
        return VM_OVERHEAD
    return symbol


@dataclass(frozen=True)
class KernelTime:
    name: str                  # kernel symbol, or VM_OVERHEAD
    ms_per_step: float
    pct: float                 # of the instrumented step's wall time
    calls_per_step: float
    ms_per_call: float


@dataclass(frozen=True)
class StepProfile:
    wall_ms: float             # the step with the instrument on
    wall_ms_uninstrumented: float
    kernel_sum_ms: float       # sum over all VM calls, instrumented
    outside_ms: float          # wall_ms - kernel_sum_ms: Python, KV begin/end_forward, logits copy, callbacks
    outside_pct: float         # so that sum(k.pct) + outside_pct == 100
    calls_per_step: float
    overhead_us_per_call: float    # (wall_ms - wall_ms_uninstrumented) / calls: the instrument's cost
    kernels: tuple[KernelTime, ...]    # slowest first


@dataclass(frozen=True)
class KernelProfile:
    prefill: StepProfile       # one prefill of prompt_len tokens per sequence
    decode: StepProfile        # mean of gen_len decode steps
    prompt_len: int
    gen_len: int
    batch: int
    runs: int                  # each step is the mean over this many instrumented (and plain) runs

    def as_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        """Human-readable breakdown, one block per step kind."""
        runs = f"mean of {self.runs} run{'s' if self.runs > 1 else ''}"
        return "\n".join([_step_table(f"prefill of {self.prompt_len} tokens x {self.batch} ({runs})", self.prefill),
                          _step_table(f"decode step x {self.batch} (mean of {self.gen_len} steps, {runs})",
                                      self.decode)])


class _CallTimer:
    """A VM instrument: host time of every Call instruction, summed by symbol (nested calls excluded)."""

    def __init__(self, device: tvm.runtime.Device):
        # CPU kernels run synchronously; on a GPU wait for the queue so each call owns its kernel time.
        is_cpu = device.dlpack_device_type() == tvm.cpu().dlpack_device_type()
        self.sync = None if is_cpu else device.sync
        self.seconds: Counter[str] = Counter()      # float values: Counter.update adds them
        self.calls: Counter[str] = Counter()
        self._open: list[list[float]] = []      # [start, time spent in nested calls]

    def __call__(self, func, symbol: str, before_run: bool, ret_value, *args) -> int:
        if self.sync is not None:
            self.sync()
        now = time.perf_counter()
        if before_run:
            self._open.append([now, 0.0])
        else:
            start, nested = self._open.pop()
            self.seconds[symbol] += now - start - nested
            self.calls[symbol] += 1
            if self._open:
                self._open[-1][1] += now - start
        return int(VMInstrumentReturnKind.NO_OP)

    def take(self) -> tuple[Counter, Counter]:
        """(seconds, calls) by symbol recorded since the last take; resets."""
        out = self.seconds, self.calls
        self.seconds, self.calls = Counter(), Counter()
        return out


def _run_once(runner: ModelRunner, seqs: list[int], prompts: list[list[int]], gen_len: int,
              rng: np.random.Generator, after_prefill=lambda: None, sampling: Sampling = GREEDY) -> tuple[float, float]:
    """Prefill, then gen_len decode steps (greedy, or drawn as `sampling` says, its uniforms from
    `rng`): (prefill seconds, mean decode-step seconds)."""
    for s in seqs:
        runner.add_sequence(s)
    try:
        t0 = time.perf_counter()
        logits = runner.prefill(seqs, prompts)
        prefill_s = time.perf_counter() - t0
        tokens = logits.argmax(-1)
        after_prefill()
        decode_s = 0.0
        for _ in range(gen_len):
            t = time.perf_counter()
            tokens = sampling.step(runner, seqs, tokens.tolist(), rng)
            decode_s += time.perf_counter() - t
    finally:
        for s in seqs:
            runner.remove_sequence(s)
    return prefill_s, decode_s / gen_len


def profile_kernels(runner: ModelRunner, prompt_len: int = 128, gen_len: int = 64, batch: int = 1,
                    runs: int = 1, seed: int = 0, sampling: Sampling = GREEDY) -> KernelProfile:
    """Per-kernel time of one prefill and of the mean decode step.

    After a warm-up, runs the same prompts `runs` times without and `runs` times with a VM instrument
    that times each Call instruction on the host (interleaved), and averages. The instrument costs a
    few microseconds per call (mostly in the outside-VM-calls remainder, some in the ~1 us builtins of
    VM_OVERHEAD), which is why both wall times are reported. On a GPU every call syncs the
    device, so kernels are timed correctly but the instrumented run is slower.
    """
    _check_fits(runner, prompt_len, gen_len, batch)
    sampling.check(runner)
    if gen_len < 1 or runs < 1:
        raise ValueError(f"the profile needs gen_len >= 1 and runs >= 1 (got {gen_len}, {runs})")
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, runner.vocab_size, size=(batch, prompt_len)).tolist()
    seqs = list(range(batch))
    timer = _CallTimer(runner.device)
    plain, instrumented = [], []                      # (prefill seconds, decode-step seconds) per run
    prefill = (Counter(), Counter())                  # (seconds, calls) by symbol, summed over runs
    decode = (Counter(), Counter())
    _run_once(runner, seqs, prompts, gen_len, rng, sampling=sampling)              # warm-up
    for _ in range(runs):
        plain.append(_run_once(runner, seqs, prompts, gen_len, rng, sampling=sampling))
        runner.vm.set_instrument(timer)
        try:
            instrumented.append(_run_once(runner, seqs, prompts, gen_len, rng, sampling=sampling,
                                          after_prefill=lambda: _add(prefill, timer.take())))
        finally:
            runner.vm.set_instrument(None)                               # None removes the instrument
        _add(decode, timer.take())
    (plain_p, plain_d), (wall_p, wall_d) = np.mean(plain, axis=0), np.mean(instrumented, axis=0)
    return KernelProfile(prefill=_step_profile(*prefill, runs, wall_p, plain_p),
                         decode=_step_profile(*decode, runs * gen_len, wall_d, plain_d),
                         prompt_len=prompt_len, gen_len=gen_len, batch=batch, runs=runs)


def _add(total: tuple[Counter, Counter], part: tuple[Counter, Counter]) -> None:
    total[0].update(part[0])
    total[1].update(part[1])


def _step_profile(seconds: Counter, calls: Counter, steps: int, wall_s: float, plain_s: float) -> StepProfile:
    """Group symbols into profile lines and normalise to one step (wall_s and plain_s are per step)."""
    group_s, group_n = defaultdict(float), Counter()
    for symbol, s in seconds.items():
        group_s[kernel_group(symbol)] += s / steps
        group_n[kernel_group(symbol)] += calls[symbol]
    kernels = sorted((KernelTime(name=g, ms_per_step=s * 1e3, pct=100 * s / wall_s,
                                 calls_per_step=group_n[g] / steps, ms_per_call=s * 1e3 * steps / group_n[g])
                      for g, s in group_s.items()), key=lambda k: -k.ms_per_step)
    kernel_s = sum(group_s.values())
    n_calls = sum(calls.values()) / steps
    return StepProfile(wall_ms=wall_s * 1e3, wall_ms_uninstrumented=plain_s * 1e3, kernel_sum_ms=kernel_s * 1e3,
                       outside_ms=(wall_s - kernel_s) * 1e3, outside_pct=100 * (wall_s - kernel_s) / wall_s,
                       calls_per_step=n_calls, overhead_us_per_call=(wall_s - plain_s) * 1e6 / max(n_calls, 1),
                       kernels=tuple(kernels))


def _step_table(title: str, p: StepProfile) -> str:
    lines = [f"{title}: {p.wall_ms_uninstrumented:.2f} ms uninstrumented, {p.wall_ms:.2f} ms instrumented "
             f"({p.overhead_us_per_call:+.1f} us per VM call); VM calls sum to {p.kernel_sum_ms:.2f} ms "
             f"in {p.calls_per_step:.0f} calls",
             f"  {'ms/step':>9} {'%':>6} {'calls':>7} {'ms/call':>9}  kernel"]
    for k in p.kernels:
        lines.append(f"  {k.ms_per_step:9.3f} {k.pct:6.1f} {k.calls_per_step:7.0f} {k.ms_per_call:9.4f}  {k.name}")
    lines.append(f"  {p.outside_ms:9.3f} {p.outside_pct:6.1f} {'':>7} {'':>9}  "
                 "(outside VM calls: Python, KV begin/end_forward, logits copy, instrument callbacks)")
    return "\n".join(lines)
