"""`kiln check`: run an artifact on its golden prompts (contract.read_golden) and compare its logits
with the reference's top-k, on whatever device the artifact runs on.

Per prompt: the largest logit error over the golden top-k ids, top-1 agreement (the artifact's
argmax over the whole vocabulary is the reference's best id) and the KL divergence of the
reference's top-k distribution from the artifact's over the same ids (both renormalised over
those k), averaged over positions. TOLERANCES, one row per quantization scheme, decides pass/fail.
An artifact built with `--decode-activations int8` is checked twice a prompt: through prefill (whose
matmuls of 9 rows or more keep float activations) and one token a step through decode, the path its
int8 GEMVs take (the tolerance rows of its 4-bit schemes cover int8's rounding).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .artifact import Artifact
from .contract import GOLDEN_NAME, ArtifactError, GoldenPrompt, read_golden


@dataclass(frozen=True)
class Tolerance:
    max_logit_error: float          # over the golden top-k ids, every position
    kl: float                       # mean over positions
    top1: float                     # least fraction of positions whose argmax agrees


# The one tolerance table. Worst values measured against transformers float32 (tiny llama/qwen2 and
# SmolLM2-135M from its Q4_1 GGUF; max logit error / KL / top-1):
#   q0f32      8e-5 / 2e-11 / 100%   (RoPE theta 10x off, tiny llama: 0.6 / 6e-3 / 62%, under 4-bit noise)
#   q0f16      0.23 / 3e-4  / 94%
#   q8f32      0.67 / 3e-3 / 100% SmolLM2; tiny 0.035 / 5e-5 / 81% (tiny models' flat logits: near ties)
#   q4f32/f16  0.56 / 0.01 / 44% tiny; SmolLM2 (4-bit re-quantized from Q4_1) 8.7 / 0.47 / 57%
#   as-stored  SmolLM2 Q4_1 kept bit-exact: 8e-5 / 2e-11 / 100%; K-quants are re-quantized (4-bit row)
TOLERANCES = {
    "q0f32": Tolerance(max_logit_error=1e-3, kl=1e-6, top1=1.0),
    "q0f16": Tolerance(max_logit_error=0.5, kl=5e-3, top1=0.7),
    "q8f32": Tolerance(max_logit_error=1.5, kl=0.02, top1=0.7),
    "q4f32": Tolerance(max_logit_error=15.0, kl=1.0, top1=0.4),
    "q4f16": Tolerance(max_logit_error=15.0, kl=1.0, top1=0.4),
    "as-stored": Tolerance(max_logit_error=15.0, kl=1.0, top1=0.4),
    "as-stored-f16": Tolerance(max_logit_error=15.0, kl=1.0, top1=0.4),
}


# A model that rounds its activations to 8 bits (BitNet: models/layers.py act_quant): a value within float32's
# rounding of a grid midpoint may round the other way than the reference's, moving one code by one. Measured (tiny
# BitNet, q0f32, one such flip in 3 prompts): 0.02 / 4e-6 / 100%.
ROUNDED_ACTIVATIONS = Tolerance(max_logit_error=0.1, kl=1e-4, top1=0.9)


def tolerance_for(scheme: str, kv_dtype: str = "", rounded_activations: bool = False) -> Tolerance:
    """The scheme's row; a scheme without one gets the loosest. A float16 KV cache (`kiln compile
    --kv-cache-dtype float16`) rounds q, k and v as q0f16 does: at most as tight as q0f16's row; a model that
    rounds its activations to 8 bits, at most as tight as ROUNDED_ACTIVATIONS."""
    row = TOLERANCES.get(scheme, TOLERANCES["q4f16"])
    for looser, applies in ((TOLERANCES["q0f16"], kv_dtype == "float16"), (ROUNDED_ACTIVATIONS, rounded_activations)):
        if applies:
            row = Tolerance(max(row.max_logit_error, looser.max_logit_error), max(row.kl, looser.kl),
                            min(row.top1, looser.top1))
    return row


# ----------------------------------------------------------------------------- metrics
# top_ids, top_values: [n, k] (the reference's, best first); logits: [n, vocab] (the artifact's)

def max_logit_error(top_ids: np.ndarray, top_values: np.ndarray, logits: np.ndarray) -> float:
    return float(np.max(np.abs(np.take_along_axis(logits, top_ids, axis=-1) - top_values)))


def top1_agreement(top_ids: np.ndarray, logits: np.ndarray) -> float:
    return float(np.mean(np.argmax(logits, axis=-1) == top_ids[:, 0]))


def topk_kl(top_ids: np.ndarray, top_values: np.ndarray, logits: np.ndarray) -> float:
    """Mean over positions of KL(p || q), p and q the softmax over the top-k ids of reference and artifact."""
    log_p = _log_softmax(top_values.astype(np.float64))
    log_q = _log_softmax(np.take_along_axis(logits, top_ids, axis=-1).astype(np.float64))
    return float(np.mean(np.sum(np.exp(log_p) * (log_p - log_q), axis=-1)))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.sum(np.exp(x), axis=-1, keepdims=True))


# ----------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class PromptResult:
    tokens: int
    max_logit_error: float
    top1: float
    kl: float
    prompt: int | None = None       # the golden prompt's index (None: its place in the report)
    path: str = "prefill"           # or "decode": one token a step (int8 decode artifacts)

    def label(self, i: int) -> str:
        return f"{i if self.prompt is None else self.prompt}" + ("" if self.path == "prefill" else f" {self.path}")


@dataclass(frozen=True)
class CheckReport:
    artifact: str
    scheme: str
    reference: str
    device: str
    tolerance: Tolerance
    prompts: tuple[PromptResult, ...]

    @property
    def failures(self) -> list[str]:
        t, out = self.tolerance, []
        for i, r in enumerate(self.prompts):
            if r.max_logit_error > t.max_logit_error:
                out.append(f"prompt {r.label(i)}: max logit error {r.max_logit_error:.3g} > {t.max_logit_error:g}")
            if r.kl > t.kl:
                out.append(f"prompt {r.label(i)}: KL {r.kl:.3g} > {t.kl:g}")
            if r.top1 < t.top1:
                out.append(f"prompt {r.label(i)}: top-1 agreement {r.top1:.0%} < {t.top1:.0%}")
        return out

    @property
    def ok(self) -> bool:
        return not self.failures

    def reason(self) -> str:
        """One line: why the check failed."""
        f = self.failures
        return (f"{self.artifact} ({self.scheme}) disagrees with its golden logits ({self.reference}): "
                + "; ".join(f[:3]) + (f"; {len(f) - 3} more" if len(f) > 3 else ""))

    def table(self) -> str:
        t = self.tolerance
        lines = [f"{self.artifact}: {self.scheme} on {self.device} vs {self.reference}",
                 f"  {'prompt':>6} {'tokens':>6} {'max logit err':>14} {'top-1':>6} {'KL (top-k)':>11}"]
        lines += [f"  {r.label(i):>6} {r.tokens:>6} {r.max_logit_error:>14.3g} {r.top1:>6.0%} {r.kl:>11.3g}"
                  for i, r in enumerate(self.prompts)]
        lines.append(f"  {'limit':>13} {t.max_logit_error:>14g} {t.top1:>6.0%} {t.kl:>11g}   "
                     + ("ok" if self.ok else "FAILED"))
        return "\n".join(lines)


def golden_summary(golden: dict) -> str:
    """One line on an artifact's golden record (ArtifactConfig.golden), for `kiln info`."""
    if "file" in golden:
        return f"{golden['prompts']} prompts, top-{golden['top_k']} of {golden['reference']} (`kiln check`)"
    return f"none ({golden.get('skipped', 'compiled before kiln stored golden logits')})"


def runs_here(path: str | Path) -> None:
    """ArtifactError (one line) unless the artifact at path can run on this machine."""
    from ._tvm import open_device
    from .artifact import check_host
    art = Artifact.load(path)
    check_host(art)
    open_device(art.device)


def prompt_logits(runner, seq_id: int, ids) -> np.ndarray:
    """The logits at every position of ids [n, vocab], through batch_prefill as serving runs it (in
    pieces of at most a prefill chunk, and of what a sliding window allows per forward)."""
    runner.add_sequence(seq_id)
    try:
        out, start = [], 0
        while start < len(ids):
            take = runner.prefill_chunk
            if runner.window:
                take = min(take, runner.window.max_chunk(runner.sequence_length(seq_id)))
            _, full = runner.run([seq_id], [list(ids[start:start + take])], full=[True])
            out.append(full[0])
            start += take
        return np.concatenate(out)
    finally:
        runner.remove_sequence(seq_id)


def decode_logits(runner, seq_id: int, ids) -> np.ndarray:
    """The logits at every position of ids [n, vocab], one token a step: a prefill of the first,
    then a decode step a token (the one-row matmuls an int8 decode artifact's int8 GEMVs serve)."""
    runner.add_sequence(seq_id)
    try:
        _, full = runner.run([seq_id], [[int(ids[0])]], full=[True])
        return np.concatenate([full[0], *(runner.decode([seq_id], [int(t)]) for t in ids[1:])])
    finally:
        runner.remove_sequence(seq_id)


def check_artifact(path: str | Path, progress: Callable[[str, int, int], None] | None = None) -> CheckReport:
    """Run the artifact at path on its golden prompts. ArtifactError when a file fails its hash, when
    there are no golden logits, or when the artifact cannot run here."""
    from .model_runner import ModelRunner
    art = Artifact.load(path)
    golden = art.config.golden
    if GOLDEN_NAME not in art.config.files:
        why = golden.get("skipped", "compiled before kiln stored golden logits")
        raise ArtifactError(f"{art.path} has no golden logits ({why}): nothing to check against; recompile "
                            "it without --no-golden")
    prompts = read_golden(art.path)
    runner = ModelRunner(art, max_num_seqs=1)
    report = progress or (lambda *_: None)
    paths = {"prefill": prompt_logits}
    if art.config.quantization.get("decode_activations") == "int8":
        paths["decode"] = decode_logits
    results = []
    for i, p in enumerate(prompts):
        report("check", i, len(prompts))
        results += [_compare(p, run(runner, i, p.ids), i, path) for path, run in paths.items()]
    report("check", len(prompts), len(prompts))
    scheme = art.config.quantization.get("name", "")
    return CheckReport(art.name, scheme, golden.get("reference", "?"), art.device,
                       tolerance_for(scheme, art.config.kv_cache.dtype,
                                     art.config.quantization.get("model_activations") == "int8"), tuple(results))


def _compare(p: GoldenPrompt, logits: np.ndarray, index: int, path: str) -> PromptResult:
    if logits.shape[0] != len(p.ids) or int(p.top_ids.max()) >= logits.shape[-1]:
        raise ArtifactError(f"{GOLDEN_NAME} does not fit this artifact (ids beyond its vocabulary); recompile it")
    return PromptResult(len(p.ids), max_logit_error(p.top_ids, p.top_values, logits),
                        top1_agreement(p.top_ids, logits), topk_kl(p.top_ids, p.top_values, logits), index, path)
