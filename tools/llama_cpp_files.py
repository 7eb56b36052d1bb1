"""Files of llama.cpp that kiln's GGUF tests check against, from llama-cpp-python's source distribution on PyPI
(vendor/llama.cpp), pinned so they stay those the tests were written against:

- its tokenizer test vectors: vocabulary-only GGUFs of real models (Llama 3, Llama 2, Phi-3, Qwen2, Qwen3.5, DeepSeek
  LLM and Coder, Falcon, Command R, MPT, GPT-2, StarCoder, Refact, Gemma 4) with texts and the ids their own Hugging
  Face tokenizers give (models/ggml-vocab-<name>.gguf, .gguf.inp, .gguf.out), which llama.cpp's test-tokenizer-0
  checks: tests/unit/test_gguf_vocab_vectors.py checks kiln's GGUF tokenizers against them;
- its converter (convert_hf_to_gguf.py, conversion/, its own gguf-py), which tests/numerics/test_gguf_converter.py
  runs over the GGUF tests' models to check that tests/gguf_writer.py writes what it writes.

    python tools/llama_cpp_files.py                        # fetch once (~77 MB download, ~65 MB kept), print the folder
    python tools/llama_cpp_files.py convert [--no-mtp] HF_DIR OUT.gguf [...]   # the converter (f32); flags: --f=v

pip downloads the sdist (its index and certificates); only these files are unpacked, into
~/.cache/kiln/llama-cpp/<version> ($KILN_LLAMA_CPP_FILES overrides), whole or not at all.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"          # llama-cpp-python's sdist (llama.cpp b7xxx) the vectors come from
# The vocabularies with vectors whose tokenizer kiln reads (bert-bge's WordPiece: not a GGUF tokenizer kiln reads)
NAMES = ("command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe", "llama-spm", "mpt",
         "phi-3", "qwen2", "qwen35", "refact", "starcoder")
SUFFIXES = (".gguf", ".gguf.inp", ".gguf.out")
SEPARATOR = "\n__ggml_vocab_test__\n"
CONVERTER = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/gguf/")     # below vendor/llama.cpp/


def files_dir() -> Path:
    """$KILN_LLAMA_CPP_FILES, else the cache folder for VERSION."""
    if os.environ.get("KILN_LLAMA_CPP_FILES"):
        return Path(os.environ["KILN_LLAMA_CPP_FILES"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kiln" / "llama-cpp" / VERSION


def files(name: str, folder: Path) -> tuple[Path, Path, Path]:
    """(the vocabulary GGUF, its texts, their ids) for one of NAMES."""
    return tuple(folder / "models" / f"ggml-vocab-{name}{suffix}" for suffix in SUFFIXES)


def is_fetched(folder: Path) -> bool:
    return all(path.is_file() for name in NAMES for path in files(name, folder)) and \
        (folder / "convert_hf_to_gguf.py").is_file() and (folder / "gguf-py" / "gguf" / "__init__.py").is_file()


def cases(name: str, folder: Path) -> list[tuple[str, list[int]]]:
    """(text, the ids its own tokenizer gives without special tokens) for each of a vocabulary's test texts."""
    _, inp, out = files(name, folder)
    texts = inp.read_text(encoding="utf-8").split(SEPARATOR)
    ids = out.read_text(encoding="utf-8").split("\n")
    if len(ids) < len(texts):
        raise ValueError(f"{out} lists ids for {len(ids)} of {len(texts)} texts; fetch the vectors again")
    return [(text, [int(i) for i in line.split()]) for text, line in zip(texts, ids)]


def _wanted(path: str) -> bool:
    """Whether a file below vendor/llama.cpp/ is one of the vectors of NAMES or the converter's."""
    vocabs = {f"models/ggml-vocab-{name}{suffix}" for name in NAMES for suffix in SUFFIXES}
    return path in vocabs or any(path == p or (p.endswith("/") and path.startswith(p) and path.endswith(".py"))
                                 for p in CONVERTER)


def fetch(folder: Path) -> Path:
    """Download llama-cpp-python's sdist with pip and unpack the vectors of NAMES and the converter into `folder` (a
    sibling folder first, renamed into place once whole). Returns `folder`."""
    if is_fetched(folder):
        return folder
    with tempfile.TemporaryDirectory() as tmp:
        print(f"downloading llama-cpp-python {VERSION}'s source distribution (~77 MB) for its tokenizer vectors",
              file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama_cpp_python=={VERSION}", "-d", tmp], check=True)
        sdist = next(Path(tmp).glob("*.tar.gz"))
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                inner = member.name.partition("/vendor/llama.cpp/")[2]
                if member.isfile() and inner and _wanted(inner):
                    (partial / inner).parent.mkdir(parents=True, exist_ok=True)
                    with tar.extractfile(member) as src, open(partial / inner, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        if not is_fetched(partial):
            shutil.rmtree(partial)
            raise SystemExit(f"llama-cpp-python {VERSION}'s sdist lacks some of the vectors of {NAMES} or the "
                             "converter; update VERSION / NAMES")
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    return folder


def convert(folder: Path, jobs: list[tuple[list[str], str, str]]) -> None:
    """Run llama.cpp's converter (its own gguf-py first on the path) on each (its flags, HF folder, GGUF path),
    float32, in this process. Its BPE pre-tokenizer check (a hash of the tokenizer's ids over a text, known only for
    released tokenizers) is answered "gpt-2", the tests' tokenizers being byte-level BPE with GPT-2's split."""
    import runpy
    sys.path[:0] = [str(folder), str(folder / "gguf-py")]
    import conversion.base
    conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"

    class AsWritten:
        """The converter is pinned to transformers 4.57, whose configs keep config.json's keys as written;
        transformers 5's fold some into others (GPT-NeoX's rotary_pct into rope_parameters, Granite 4.0's layer kinds
        renamed) and add keys of later models (Nemotron-H's experts' on a dense one), which the converter then
        misreads: it reads config.json as written (its own fallback where transformers cannot load a config)."""
        @staticmethod
        def from_pretrained(*args, **kwargs):
            raise ValueError("config.json as written")
    conversion.base.AutoConfig = AsWritten
    for flags, hf, out in jobs:
        sys.argv = ["convert_hf_to_gguf.py", *flags, hf, "--outfile", out, "--outtype", "f32"]
        runpy.run_path(str(folder / "convert_hf_to_gguf.py"), run_name="__main__")
        for classes in conversion.base.ModelBase._model_classes.values():    # --no-mtp / --mtp set a flag on the
            for cls in classes.values():                                    # class for good: cleared for the next job
                for flag in ("no_mtp", "mtp_only"):
                    if flag in vars(cls):
                        delattr(cls, flag)


def main() -> None:
    if sys.argv[1:2] == ["convert"]:
        jobs, flags, paths = [], [], []
        for arg in sys.argv[2:]:
            (flags if arg.startswith("--") and not paths else paths).append(arg)
            if len(paths) == 2:
                jobs.append((flags, *paths))
                flags, paths = [], []
        if not jobs or flags or paths:
            raise SystemExit("usage: python tools/llama_cpp_files.py convert [--flag[=value] ...] HF_DIR OUT.gguf "
                             "[...]   (flags: the converter's, for the pair after them)")
        convert(fetch(files_dir()), jobs)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=None, help="folder (default: $KILN_LLAMA_CPP_FILES or the cache)")
    args = parser.parse_args()
    print(fetch(args.dest or files_dir()))


if __name__ == "__main__":
    main()
