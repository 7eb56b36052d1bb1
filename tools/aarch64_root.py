"""An arm64 Debian root holding kiln's runtime dependencies, to run `--target aarch64` artifacts on
this x86-64 machine under QEMU user-mode emulation (tests/compiler/test_aarch64_qemu.py).

    python tools/aarch64_root.py                        # build once (as root), print its folder
    python tools/aarch64_root.py -- script.py ARGS       # run the emulated python3 (kiln importable)

The root is Debian bookworm arm64 (python3.11) unpacked by `debootstrap --foreign` (no second
stage: that would need binfmt_misc; every downloaded .deb is unpacked with dpkg-deb instead), plus
the aarch64 wheels of the runtime's packages at this venv's versions, unzipped by pip into
/opt/kiln-site. It is cached under ~/.cache/kiln/aarch64-root/, keyed by the suite and versions.
Needs root (debootstrap), `apt-get install qemu-user-static debootstrap`, a Debian mirror and PyPI.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SUITE, PYTHON = "bookworm", "3.11"          # bookworm's python3 is 3.11: the cp311 wheels below
# What `Engine` imports on a runtime-only TVM (TVM_USE_RUNTIME_LIB=1), with their own imports.
PACKAGES = ("apache-tvm", "apache-tvm-ffi", "ml_dtypes", "numpy", "typing_extensions", "tokenizers", "jinja2",
            "markupsafe")
PLATFORMS = ("manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64")
TOOLS = {"qemu-aarch64-static": "qemu-user-static", "debootstrap": "debootstrap", "dpkg-deb": "dpkg"}
SITE = "opt/kiln-site"


def pins() -> list[str]:
    """PACKAGES at the versions installed here, so the emulated runtime is the x86 build's."""
    return [f"{p}=={importlib.metadata.version(p)}" for p in PACKAGES]


def root_dir() -> Path:
    """$KILN_AARCH64_ROOT, else the cache folder for this suite and these versions."""
    if os.environ.get("KILN_AARCH64_ROOT"):
        return Path(os.environ["KILN_AARCH64_ROOT"])
    key = hashlib.sha256(" ".join([SUITE, *pins()]).encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kiln" / "aarch64-root" / f"{SUITE}-{key}"


def is_built(root: Path) -> bool:
    return (root / "usr/bin/python3").exists() and (root / SITE / "tvm").is_dir()


def missing_tools() -> str | None:
    """One line naming the missing host tools and the apt-get line that installs them, or None."""
    gone = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
    return f"apt-get install {' '.join(gone)}" if gone else None


def host_mirror() -> str:
    """The Debian mirror apt uses here (its sources), else deb.debian.org."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for f in files:
        text = f.read_text(errors="replace") if f.suffix in (".list", ".sources") and f.is_file() else ""
        for uri in re.findall(r"(?:^deb\s+(?:\[[^]]*\]\s+)?|^URIs:\s*)(\S+)", text, re.M):
            if uri.rstrip("/").endswith("/debian"):
                return uri
    return "http://deb.debian.org/debian"


def build(root: Path, log=sys.stderr) -> Path:
    """Make the root at `root` (in a sibling folder, renamed when complete); returns it."""
    if is_built(root):
        return root
    if os.geteuid() != 0:
        raise SystemExit("debootstrap needs root: run `sudo python tools/aarch64_root.py` once")
    if missing_tools():
        raise SystemExit(f"missing host tools: {missing_tools()}")
    tmp = root.with_name(f"{root.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)

    def run(*cmd: str) -> None:
        subprocess.run(cmd, check=True, stdout=log, stderr=log)

    try:
        run("debootstrap", "--foreign", "--arch=arm64", "--variant=minbase", "--include=python3", SUITE,
            str(tmp), host_mirror())
        debs = tmp / "var/cache/apt/archives"
        for deb in sorted(debs.glob("*.deb")):
            run("dpkg-deb", "-x", str(deb), str(tmp))
            deb.unlink()
        run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:", "--target",
            str(tmp / SITE), *[f"--platform={p}" for p in PLATFORMS], f"--python-version={PYTHON}",
            "--implementation=cp", *pins())
        tmp.rename(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if not is_built(root):           # else another process finished first
            raise
    return root


def python_command(root: Path) -> list[str]:
    """The emulated python3 (-P: no script folder on sys.path); pair it with python_env."""
    return ["qemu-aarch64-static", "-L", str(root), str(root / "usr/bin/python3"), "-P"]


def python_env(root: Path, *paths: str) -> dict[str, str]:
    """This environment with the root's site folder (then `paths`) on PYTHONPATH and the runtime-only
    TVM (libtvm_runtime alone, as an app ships it; the full library also loads, ~4x slower here)."""
    path = os.pathsep.join([str(root / SITE), *filter(None, paths)])
    return {**os.environ, "PYTHONPATH": path, "TVM_USE_RUNTIME_LIB": "1"}


def kiln_tree(dest: Path) -> Path:
    """dest/kiln: this interpreter's kiln package as symlinks, its mapped subpackages (runtime/,
    targets/, ...) included, so the emulated python3 imports the same source; returns dest."""
    import importlib.util
    import kiln
    pkg = dest / "kiln"
    pkg.mkdir(parents=True, exist_ok=True)
    for f in Path(kiln.__file__).parent.glob("*.py"):
        (pkg / f.name).symlink_to(f.resolve())
    for sub in ("compiler", "models", "runtime", "targets"):
        (pkg / sub).symlink_to(Path(importlib.util.find_spec(f"kiln.{sub}").origin).parent.resolve())
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("args", nargs=argparse.REMAINDER, help="after --: arguments for the emulated python3")
    opts = ap.parse_args()
    root = build(root_dir())
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    if not args:
        print(root)
        return
    with tempfile.TemporaryDirectory() as tmp:
        env = python_env(root, str(kiln_tree(Path(tmp))))
        sys.exit(subprocess.run(python_command(root) + args, env=env).returncode)


if __name__ == "__main__":
    main()
