"""Speed of this checkout against another git revision of kiln, alternating in one run.

    python tools/compare_revisions.py --before HEAD~3                  # SmolLM2, --quant auto
    python tools/compare_revisions.py --before main --model DIR --quant q4f32 --rounds 7 --batch 4
    python tools/compare_revisions.py --before HEAD~1 --temperature 0.7 --top-p 0.9   # sampled decode

For a refactor that must change no speed. The other revision is checked out (git worktree) and
installed into a folder of its own (`pip install --no-deps --target`), each side compiles MODEL
with its own code into its own cache, then `kiln bench --json` runs alternately, before, after,
before, ... for --rounds, each in a fresh process with the side's code first on PYTHONPATH, so
machine noise hits both sides alike. Prints the per-round figures and the medians, and the
after/before ratios; --json writes them to a file too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("prefill_tok_s", "decode_tok_s", "ttft_ms", "tpot_ms")


def _run(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> str:
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr[-2000:]}")
    return out.stdout


def install_revision(rev: str, work: Path) -> Path:
    """kiln at `rev`, installed (no deps: the venv has them) into work/site; returns that folder."""
    tree, site = work / "tree", work / "site"
    _run(["git", "worktree", "add", "--detach", "-f", str(tree), rev], cwd=ROOT)
    try:
        _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(tree)])
    finally:
        _run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
    return site


def side_env(site: Path | None, cache: Path) -> dict:
    """The environment of one side: its code first on PYTHONPATH (None: this checkout), its own cache."""
    env = dict(os.environ, KILN_CACHE_DIR=str(cache))
    env["PYTHONPATH"] = str(site) if site else ""          # "": the installed (editable) checkout
    return env


def compile_side(env: dict, model: str, quant: str, out: Path) -> Path:
    code = ("import kiln, sys; print(kiln.__file__, file=sys.stderr); "
            f"print(kiln.compile({model!r}, target='cpu', quant={quant!r}, output={str(out)!r}))")
    return Path(_run([sys.executable, "-P", "-c", code], env=env, cwd=Path(tempfile.gettempdir())).strip())


def bench_side(env: dict, artifact: Path, args) -> dict:
    cmd = [sys.executable, "-P", "-m", "kiln.cli", "bench", str(artifact), "--prompt-len", str(args.prompt_len),
           "--gen-len", str(args.gen_len), "--batch", str(args.batch), "--runs", str(args.runs), "--json",
           "--temperature", str(args.temperature), "--top-p", str(args.top_p), "--top-k", str(args.top_k)]
    return json.loads(_run(cmd, env=env, cwd=Path(tempfile.gettempdir())).strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="git revision to compare against (e.g. HEAD~3, main)")
    ap.add_argument("--model", default="smollm2", help="model path or alias [smollm2]")
    ap.add_argument("--quant", default="auto")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3, help="kiln bench --runs per round")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0, help="sampled decode steps (kiln bench's) [0: greedy]")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kiln-compare-"))
    sides = {"before": side_env(install_revision(args.before, work / "before"), work / "cache-before"),
             "after": side_env(None, work / "cache-after")}
    artifacts = {name: compile_side(env, args.model, args.quant, work / f"art-{name}") for name, env in sides.items()}
    rounds: dict[str, list[dict]] = {name: [] for name in sides}
    for i in range(args.rounds):
        for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
            r = bench_side(sides[name], artifacts[name], args)
            rounds[name].append(r)
            print(f"round {i + 1} {name:<6} " + "  ".join(f"{m} {r[m]:.2f}" for m in METRICS), flush=True)
    medians = {name: {m: statistics.median(r[m] for r in rs) for m in METRICS} for name, rs in rounds.items()}
    sampled = f", temperature {args.temperature} top-p {args.top_p} top-k {args.top_k}" if args.temperature else ""
    print(f"\n{args.model} --quant {args.quant}, prompt {args.prompt_len}, gen {args.gen_len}, "
          f"batch {args.batch}{sampled}, medians of {args.rounds} alternating rounds (before = {args.before})")
    # Each round's two runs sit back to back: their ratio cancels noise that drifts over minutes.
    paired = {m: statistics.median(a[m] / b[m] for a, b in zip(rounds["after"], rounds["before"])) for m in METRICS}
    for m in METRICS:
        b, a = medians["before"][m], medians["after"][m]
        print(f"  {m:<14} before {b:9.2f}   after {a:9.2f}   after/before {a / b:.3f}   "
              f"median of per-round ratios {paired[m]:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"before_rev": args.before, "args": vars(args) | {"json": str(args.json)},
                                         "rounds": rounds, "medians": medians, "paired_ratios": paired}, indent=1))


if __name__ == "__main__":
    main()
