"""Carry kiln to a lent GPU machine (the `device` tool) and set it up there.

The device machine has Python 3.12 with torch, transformers, tokenizers, jinja2, click, numpy,
safetensors and pytest, but no TVM and no network; the `device` tool carries at most 64 MiB per
call (the repository included) and a warm machine keeps what earlier calls left in ignored paths
for 30 s of idleness. TVM alone is 100 MB as a wheel (libtvm_compiler.so: 259 MB, 59 MB in xz),
and the SmolLM2 GGUF 98 MB. So:

    python tools/gpu_session.py stage            # here: .gpu/part-01 .. part-NN (each < 58 MiB)

then one `run` per part, each carrying only that part (the earlier ones stay there while the
machine is warm, so send the next call at once), the last one unpacking and checking:

    run(carry=[".gpu/part-01"], command="python3 tools/gpu_session.py receive")
    ...
    run(carry=[".gpu/part-NN", ".gpu/prebuilt"], command="python3 tools/gpu_session.py unpack && "
        ". .gpu/env.sh && python3 tools/gpu_checks.py all --out $OUT")

`unpack` joins the parts, checks their SHA-256, writes the wheels' files (apache-tvm,
apache-tvm-ffi for cp312, gguf: packed raw, so xz compresses the libraries) into .gpu/site,
lays kiln out there as symlinks into the checkout, and writes .gpu/env.sh (PYTHONPATH, the
SmolLM2 GGUF's path).
tools/gpu_checks.py says what each check measures (its modules: tools/gpu_*.py). `.gpu/` is git-ignored.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / ".gpu"
PART_BYTES = 58 * 2**20            # + the repository (~1.3 MB) stays under the tool's 64 MiB

def _pinned_tvm() -> tuple[str, ...]:
    """apache-tvm and apache-tvm-ffi as pyproject.toml pins them (the ffi version decides whether
    the tensor-core matmuls build: targets/gpu.py tensorize_works)."""
    import tomllib
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return tuple(d for d in deps if d.startswith("apache-tvm"))


# pytest-xdist (and its execnet): the `gpu` tests in parallel processes (gpu_rows.gpu_tests); the
# device's own pytest runs them.
WHEELS = (*_pinned_tvm(), "gguf==0.19.0", "pytest-xdist==3.8.0", "execnet==2.1.2")
# `kiln serve` (gpu_checks' "served" step), with what they need: the device has click and
# typing-extensions, not these (~8 MB of wheels). xgrammar stays behind: structured output is off there.
SERVE_WHEELS = ("fastapi", "uvicorn", "httptools", "uvloop", "prometheus-client")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")


def stage(python: str, with_smollm2: bool) -> None:
    """Download the wheels for the device's Python, pack TVM + wheels (+ the GGUF) into one xz
    stream, and cut it into parts."""
    wheels = GPU / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    download = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", python,
                "--implementation", "cp", "-d", str(wheels), *[f"--platform={p}" for p in PLATFORMS]]
    subprocess.run([*download, "--no-deps", *WHEELS], check=True)
    subprocess.run([*download, *SERVE_WHEELS], check=True)          # with what they need
    members = {w.name: w for w in sorted(wheels.glob("*.whl"))}
    if with_smollm2:
        from kiln.models.gguf import find_smollm2_gguf
        members["smollm2.gguf"] = find_smollm2_gguf()
    for old in GPU.glob("part-*"):
        shutil.rmtree(old)
    blob = GPU / "payload.tar.xz"
    print(f"packing {', '.join(members)} (xz, a few minutes)", flush=True)
    with lzma.open(blob, "wb", preset=6) as xz, tarfile.open(fileobj=xz, mode="w|") as tar:
        for name, path in members.items():
            if not name.endswith(".whl"):
                tar.add(path, arcname=name)
                continue
            # A wheel is a deflated zip laid out for site-packages: store its files raw, so that xz
            # sees the uncompressed libraries (libtvm_compiler.so: 259 MB -> 59 MB).
            with zipfile.ZipFile(path) as whl:
                for entry in whl.infolist():
                    if entry.is_dir():
                        continue
                    info = tarfile.TarInfo(f"site/{entry.filename}")
                    info.size, info.mode = entry.file_size, 0o755 if entry.filename.endswith(".so") else 0o644
                    with whl.open(entry) as f:
                        tar.addfile(info, f)
    digest, sizes = hashlib.sha256(blob.read_bytes()).hexdigest(), []
    with blob.open("rb") as f:
        n = 0
        while chunk := f.read(PART_BYTES):
            n += 1
            part = GPU / f"part-{n:02d}"
            part.mkdir()
            (part / "data").write_bytes(chunk)
            sizes.append(len(chunk))
    blob.unlink()
    manifest = {"parts": len(sizes), "sha256": digest, "bytes": sum(sizes), "members": list(members)}
    (GPU / f"part-{len(sizes):02d}" / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{len(sizes)} parts, {sum(sizes) / 2**20:.0f} MiB in all; carry one per call:")
    for n in range(1, len(sizes) + 1):
        last = n == len(sizes)
        command = ("export TQDM_DISABLE=1; python3 tools/gpu_session.py unpack && . .gpu/env.sh && "
                   "python3 tools/gpu_checks.py all --out $OUT --runs 2 --budget 420 2>&1 | tee $OUT/all.log"
                   if last else "python3 tools/gpu_session.py receive")
        carry = f'".gpu/part-{n:02d}"' + (', ".gpu/prebuilt"' if last else "")
        print(f'  run(carry=[{carry}], {"timeout_s=600, " if last else ""}command="{command}")')
    print("(before the last call: python tools/gpu_checks.py prebuild --target cuda-sm90 --device cpu "
          "--work /tmp/pbw)")


def receive() -> None:
    """Move a carried part where the next call's carry will not replace it."""
    kept = GPU / "received"
    kept.mkdir(parents=True, exist_ok=True)
    for part in sorted(GPU.glob("part-*")):
        shutil.copytree(part, kept / part.name, dirs_exist_ok=True)
    print("have:", " ".join(sorted(p.name for p in kept.iterdir())))


def unpack() -> None:
    receive()
    kept = GPU / "received"
    manifests = list(kept.glob("part-*/manifest.json"))
    if not manifests:
        sys.exit("no manifest: the last part was not carried")
    manifest = json.loads(manifests[0].read_text())
    names = [f"part-{n:02d}" for n in range(1, manifest["parts"] + 1)]
    missing = [n for n in names if not (kept / n / "data").is_file()]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: the machine went cold between calls; carry them again")
    blob = b"".join((kept / n / "data").read_bytes() for n in names)
    if hashlib.sha256(blob).hexdigest() != manifest["sha256"]:
        sys.exit("the joined parts do not match the staged SHA-256; stage and carry them again")
    site, models = GPU / "site", GPU / "models"
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    models.mkdir(exist_ok=True)
    with lzma.open(io.BytesIO(blob)) as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
        for member in tar:
            dest = site / member.name[len("site/"):] if member.name.startswith("site/") else models / member.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(tar.extractfile(member).read())
            dest.chmod(member.mode)
    _link_kiln(site / "_kiln" / "kiln")
    env = [f'export PYTHONPATH="{site / "_kiln"}:{site}${{PYTHONPATH:+:$PYTHONPATH}}"',
           "export PYTHONUNBUFFERED=1",
           f'export KILN_CACHE_DIR="{GPU / "cache"}"']
    if (models / "smollm2.gguf").is_file():
        env.append(f'export KILN_SMOLLM2_GGUF="{models / "smollm2.gguf"}"')
    (GPU / "env.sh").write_text("\n".join(env) + "\n")
    print("unpacked into", site, "; now: . .gpu/env.sh", flush=True)
    check = "import tvm, kiln; from kiln.targets.gpu import tensorize_works; d = tvm.cuda(0); " \
            "print('tvm', tvm.__version__, 'cuda', d.exist, d.exist and d.compute_version, " \
            "'tensor cores', tensorize_works())"
    subprocess.run(["bash", "-c", f". {GPU / 'env.sh'} && {sys.executable} -P -c \"{check}\""], check=False)


def _link_kiln(pkg: Path) -> None:
    """The `kiln` package as pyproject's package-dir lays it out, made of symlinks into this
    checkout (no build: the device's setuptools may predate the one pyproject asks for).
    Run the CLI as `python3 -P -m kiln.cli`: -P keeps the checkout's own kiln/ (no subpackages
    there) from shadowing it when the working directory is the checkout."""
    pkg.mkdir(parents=True)
    for f in (ROOT / "kiln").iterdir():
        if f.suffix == ".py":
            (pkg / f.name).symlink_to(f)
    for sub in ("models", "compiler", "targets", "runtime"):
        (pkg / sub).symlink_to(ROOT / sub)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("stage", help="here: build .gpu/part-*")
    st.add_argument("--python", default="3.12", help="the device's Python version [3.12]")
    st.add_argument("--no-smollm2", action="store_true", help="leave the SmolLM2 GGUF out (one part fewer)")
    sub.add_parser("receive", help="there: keep a carried part")
    sub.add_parser("unpack", help="there: join the parts and install TVM, the wheels and kiln into .gpu/site")
    args = ap.parse_args()
    os.chdir(ROOT)
    if args.cmd == "stage":
        stage(args.python, not args.no_smollm2)
    elif args.cmd == "receive":
        receive()
    else:
        unpack()


if __name__ == "__main__":
    main()
