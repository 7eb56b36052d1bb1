"""llama.cpp's tokenizer test vectors: vocabulary-only GGUFs of real models (Llama 3, Llama 2, Phi-3, Qwen2, Qwen3.5,
DeepSeek LLM and Coder, Falcon, Command R, MPT, GPT-2, StarCoder, Refact, Gemma 4) with texts and the ids their own
Hugging Face tokenizers give (ggml-vocab-<name>.gguf, .gguf.inp, .gguf.out), which llama.cpp's test-tokenizer-0
checks. tests/unit/test_gguf_vocab_vectors.py checks kiln's GGUF tokenizers against them.

    python tools/llama_vocabs.py            # fetch once (~77 MB download, ~62 MB kept), print the folder

They ship in llama-cpp-python's source distribution on PyPI (vendor/llama.cpp/models), pinned here so the vectors
stay those the test was written against; pip downloads it (its index and certificates), then only the vectors are
unpacked, into ~/.cache/kiln/llama-vocabs/<version> ($KILN_LLAMA_VOCABS overrides), whole or not at all.
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


def vocab_dir() -> Path:
    """$KILN_LLAMA_VOCABS, else the cache folder for VERSION."""
    if os.environ.get("KILN_LLAMA_VOCABS"):
        return Path(os.environ["KILN_LLAMA_VOCABS"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kiln" / "llama-vocabs" / VERSION


def files(name: str, folder: Path) -> tuple[Path, Path, Path]:
    """(the vocabulary GGUF, its texts, their ids) for one of NAMES."""
    return tuple(folder / f"ggml-vocab-{name}{suffix}" for suffix in SUFFIXES)


def is_fetched(folder: Path) -> bool:
    return all(path.is_file() for name in NAMES for path in files(name, folder))


def cases(name: str, folder: Path) -> list[tuple[str, list[int]]]:
    """(text, the ids its own tokenizer gives without special tokens) for each of a vocabulary's test texts."""
    _, inp, out = files(name, folder)
    texts = inp.read_text(encoding="utf-8").split(SEPARATOR)
    ids = out.read_text(encoding="utf-8").split("\n")
    if len(ids) < len(texts):
        raise ValueError(f"{out} lists ids for {len(ids)} of {len(texts)} texts; fetch the vectors again")
    return [(text, [int(i) for i in line.split()]) for text, line in zip(texts, ids)]


def fetch(folder: Path) -> Path:
    """Download llama-cpp-python's sdist with pip and unpack the vectors of NAMES into `folder` (a sibling folder
    first, renamed into place once whole). Returns `folder`."""
    if is_fetched(folder):
        return folder
    wanted = {f"ggml-vocab-{name}{suffix}" for name in NAMES for suffix in SUFFIXES}
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
                name = Path(member.name).name
                if member.isfile() and name in wanted and "/vendor/llama.cpp/models/" in member.name:
                    with tar.extractfile(member) as src, open(partial / name, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        if not is_fetched(partial):
            missing = sorted(wanted - {p.name for p in partial.iterdir()})
            shutil.rmtree(partial)
            raise SystemExit(f"llama-cpp-python {VERSION}'s sdist lacks {missing}; update VERSION / NAMES")
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=None, help="folder (default: $KILN_LLAMA_VOCABS or the cache)")
    args = parser.parse_args()
    print(fetch(args.dest or vocab_dir()))


if __name__ == "__main__":
    main()
