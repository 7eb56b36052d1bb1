"""Speculative decoding (by prompt lookup, or by a draft model) against plain decoding, same
artifact, same run.

    python tools/bench_speculative.py                         # SmolLM2, compiled on first use for the CPU
    python tools/bench_speculative.py ARTIFACT --tokens 3 5 8 --rounds 5
    python tools/bench_speculative.py ARTIFACT --draft-model DRAFT --tokens 2 4   # draft model rows too

For each task (repeat a text, fix a text's typos, edit code, an open question), the decode rate of a
greedy chat reply (with --temperature, a seeded sampled one: speculative sampling), alternating an
Engine without speculation and one per --tokens value, --rounds times: the median decode tok/s (the
reply's tokens after the first over the time after the first token, so the prompt's prefill is left
out), forwards per token, draft tokens checked and kept. Greedy, every engine must produce the plain
one's tokens (checked; exactness is the point); sampled, each draws its own reply. One JSON line at
the end with everything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEXT = ("The kiln fires clay at high heat. Potters load it in the morning, close the door and raise the "
        "temperature slowly over many hours, so that the pots do not crack. When the firing ends the kiln "
        "cools for a day before anyone opens it, and the glaze has turned to glass.")
CODE = '''def mean(values):
    total = 0
    for v in values:
        total += v
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for v in values:
        total += (v - m) ** 2
    return total / len(values)
'''
TASKS = {
    "repeat": f"Repeat this text exactly, word for word:\n\n{TEXT}",
    "fix typos": "Fix the typos in this text and return all of it:\n\n"
                 + TEXT.replace("the ", "teh ", 3).replace("slowly", "slowy"),
    "edit code": f"Rename the function `mean` to `average` everywhere in this code and return the whole code:\n\n{CODE}",
    "open question": "Why is the sky blue? Answer in a few sentences.",
}


def measure(artifact: str, tokens: list[int], rounds: int = 3, max_tokens: int = 128,
            temperature: float = 0.0, draft_model: str | None = None, draft_tokens: list[int] = ()) -> dict:
    """Per task, per engine ("off", "k=K" by prompt lookup for each of `tokens`, "draft k=K" by the
    draft model for each of `draft_tokens`): median decode tok/s, forwards a token, drafted and kept tokens. Greedy (temperature 0), the plain engine's tokens are what every
    other must produce; sampled, each run draws its own (seeded) and forwards a token are per run."""
    from kiln import Engine, EngineConfig, SamplingParams
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=0)
    # One sequence and a small KV cache each: on a GPU an Engine would otherwise size its cache to most
    # of the device's memory, and the second one would find none left.
    small = dict(max_num_seqs=1, max_total_tokens=4096, enable_prefix_cache=False)
    engines = {"off": Engine(artifact, EngineConfig(**small))}
    for k in tokens:
        engines[f"k={k}"] = Engine(artifact, EngineConfig(speculative_tokens=k, **small))
    for k in draft_tokens if draft_model else ():
        engines[f"draft k={k}"] = Engine(artifact, EngineConfig(speculative_tokens=k, draft_model=draft_model, **small))
    for engine in engines.values():                                   # warm-up: every kernel once
        engine.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=8, temperature=0.0))
    rows: dict[str, dict] = {}
    for task, prompt in TASKS.items():
        messages = [{"role": "user", "content": prompt}]
        runs: dict[str, list] = {name: [] for name in engines}
        want = None
        for _ in range(rounds):
            for name, engine in engines.items():                      # alternated: drift hits all alike
                before, drafter = engine.stats(), engine.speculator.draft_model
                drafting = (drafter.calls, drafter.seconds) if drafter else (0, 0.0)
                start, first, ids = time.perf_counter(), None, []
                for delta in engine.chat_stream(messages, params):
                    first = first or time.perf_counter()
                    ids += delta.token_ids
                end, after = time.perf_counter(), engine.stats()
                if want is None:
                    want = ids
                if ids != want and not temperature:
                    raise AssertionError(f"{task}: {name} produced other tokens than plain decoding")
                runs[name].append({"tok_s": (len(ids) - 1) / max(end - first, 1e-9),   # after the prefill's
                                   "tokens": len(ids),
                                   "forwards": after.forwards - before.forwards,
                                   "drafted": after.draft_tokens - before.draft_tokens,
                                   "kept": after.accepted_draft_tokens - before.accepted_draft_tokens,
                                   "ttft_s": first - start,
                                   # the draft model's share: its propose() calls and their time
                                   "drafting_calls": drafter.calls - drafting[0] if drafter else 0,
                                   "drafting_s": drafter.seconds - drafting[1] if drafter else 0.0,
                                   "decode_s": end - first})
        rows[task] = {"tokens": len(want)}
        for name, rs in runs.items():
            rows[task][name] = {"decode_tok_s": round(statistics.median(r["tok_s"] for r in rs), 1),
                                "forwards_per_token": round(rs[0]["forwards"] / rs[0]["tokens"], 3),
                                "drafted": rs[0]["drafted"], "kept": rs[0]["kept"]}
            if rs[0]["drafting_calls"]:       # the draft model's time a call, and its share of the decode time
                rows[task][name]["drafting_ms_per_call"] = round(1e3 * rs[0]["drafting_s"] / rs[0]["drafting_calls"], 2)
                rows[task][name]["drafting_share"] = round(rs[0]["drafting_s"] / rs[0]["decode_s"], 3)
        off = rows[task]["off"]["decode_tok_s"]
        for name in engines:
            rows[task][name]["x_off"] = round(rows[task][name]["decode_tok_s"] / off, 2)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="smollm2", help="an artifact, or a model compiled for the CPU")
    ap.add_argument("--tokens", type=int, nargs="+", default=[5], help="speculative_tokens values to measure [5]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample at this temperature (seeded) instead of greedy: speculative sampling")
    ap.add_argument("--draft-model", help="also measure drafts by this model (an artifact, or a model compiled for "
                                          "the CPU) with the same --tokens values")
    args = ap.parse_args()
    import kiln
    artifact, draft = (m if m is None or kiln.is_artifact(m) else str(kiln.ensure_artifact(m))
                       for m in (args.model, args.draft_model))
    rows = measure(artifact, args.tokens, args.rounds, args.max_tokens, args.temperature, draft, args.tokens)
    names = ["off", *(f"k={k}" for k in args.tokens), *(f"draft k={k}" for k in args.tokens if draft)]
    print(f"{'task':14} {'tokens':>6}  " + "  ".join(f"{n:>24}" for n in names))
    for task, row in rows.items():
        cells = [f"{row[n]['decode_tok_s']:7.1f} tok/s {row[n]['x_off']:4.2f}x "
                 f"{row[n]['kept']:3d}/{row[n]['drafted']:<3d}" for n in names]
        print(f"{task:14} {row['tokens']:6d}  " + "  ".join(f"{c:>24}" for c in cells))
    print(json.dumps({"artifact": artifact, "draft_model": draft, "rounds": args.rounds, "rows": rows}))


if __name__ == "__main__":
    main()
