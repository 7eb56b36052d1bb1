"""Per model family: lines of its model file, compile time, and the largest logit error against
transformers on a tiny random-init model (the numbers the model-zoo issue asks for).

    python tools/zoo_report.py [--json] [CASE ...]

Each family's tiny model (tests/numerics/test_families.py's CASES, plus Llama and Qwen2 from
tests/tiny_models.py) is compiled q0f32 for this CPU; the error is the max |logit - transformers'|
over every prompt position (batch_verify) and 5 greedy decode steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
def model_file(artifact: Path) -> str:
    """The model file (models/<name>.py) of the family an artifact was compiled as: its registered
    architecture's config class's module."""
    from kiln.models.registry import ARCHITECTURES
    from kiln.runtime.artifact import Artifact
    module = sys.modules[ARCHITECTURES[Artifact.load(artifact).config.model.arch].config_cls.__module__]
    return Path(module.__file__).name


def max_error(artifact: Path, ref, ids: list[int], steps: int = 5) -> float:
    from kiln.runtime.artifact import Artifact
    from kiln.runtime.model_runner import ModelRunner
    from tiny_models import reference_logits
    runner = ModelRunner(Artifact.load(artifact))
    runner.add_sequence(0)
    err = float(np.abs(runner.verify(0, ids) - reference_logits(ref, ids)).max())
    runner.add_sequence(1)
    logits, seq = runner.prefill([1], [ids])[0], list(ids)
    for _ in range(steps):
        seq.append(int(np.argmax(logits)))
        logits = runner.decode([1], [seq[-1]])[0]
        err = max(err, float(np.abs(logits - reference_logits(ref, seq)[-1]).max()))
    return err


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("cases", nargs="*", help="only these cases (default: every one)")
    args = ap.parse_args()
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "numerics")]
    import torch
    import transformers

    import kiln
    from test_families import CASES, IDS, write_family
    from tiny_models import write_tiny
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cases = {"llama": None, "qwen2": None, **{c: c for c in CASES}}
        unknown = set(args.cases) - set(cases)
        if unknown:
            ap.error(f"unknown case {', '.join(sorted(unknown))}; choose from {', '.join(cases)}")
        cases = {c: f for c, f in cases.items() if not args.cases or c in args.cases}
        for case, family_case in cases.items():
            if family_case is None:
                d = write_tiny("Llama" if case == "llama" else "Qwen2", tmp / case, tied=False)
                ref = getattr(transformers, "LlamaForCausalLM" if case == "llama" else "Qwen2ForCausalLM") \
                    .from_pretrained(d, dtype=torch.float32).eval()
            else:
                ref = write_family(family_case, tmp / case)
            start = time.perf_counter()
            art = kiln.compile(str(tmp / case), target="cpu", quant="q0f32", output=tmp / f"{case}-art")
            seconds = time.perf_counter() - start
            name = model_file(art)
            lines = len((ROOT / "models" / name).read_text().splitlines())
            rows.append({"case": case, "model_file": f"models/{name}", "lines": lines,
                         "compile_s": round(seconds, 1), "max_logit_error": max_error(art, ref, IDS)})
    for r in rows:
        print(json.dumps(r) if args.json else
              f"{r['case']:<20} {r['model_file']:<22} {r['lines']:>4} lines  compile {r['compile_s']:>5.1f} s  "
              f"max |Δlogit| {r['max_logit_error']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
