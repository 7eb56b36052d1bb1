"""tests/gguf_writer.py against llama.cpp's own converter (convert_hf_to_gguf.py, tools/llama_cpp_files.py fetches
it): for each case of test_gguf_families.py it takes, the converter's GGUF holds the writer's metadata (but the
tokenizer's and general.*) and the same tensors, so what test_gguf_families checks of kiln's reading (logits equal
transformers') holds for the files llama.cpp writes. Running the converter over the cases found AFMoE's q/k rows kept
as they are, Hy V3's shared MLP without a count, Phi-2's MLP width written as 4 x the width, OLMo 3's sliding base
and GPT-BigCode's kv head count 1 without multi_query, which the writer (and kiln's reader) had otherwise.

A few configs get the keys their released checkpoints have and transformers' saved one lacks (RELEASED); the other
cases' converter classes need more than a transformers-saved tiny checkpoint has (CANNOT), or drop what the test
keeps (gemma3: the embedding rows past the tokenizer's)."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest

from conftest import LLAMA_CPP_FILES
from gguf_writer import write_gguf
from test_gguf_families import CASES, WRITTEN_AS, write_hf

pytestmark = pytest.mark.numerics
CANNOT = {
    **dict.fromkeys(["gemma", "gemma2", "ernie4_5", "ernie4_5-moe", "nemotron", "minicpm3"], "a tokenizer.model"),
    **dict.fromkeys(["phi3", "phi4-partial-rotary"], "tokenizer_config.json's tokenizer_class"),
    "gpt-neox": "rotary_pct",
    **dict.fromkeys(["glm4", "glm4v", "chatglm"], "GLM's chat tokens"),
    **dict.fromkeys(["glm4-moe", "deepseek2-glm4-moe-lite", "glm-dsa"], "GLM's [gMASK]"),
    "falcon-7b": "Falcon-7B's own config keys (n_head_kv)", "hunyuan": "Hunyuan's released RoPE scaling",
    "hunyuan-moe": "per-layer moe_intermediate_size", "deepseek32": "add_bos_token",
    "mistral4": "the Mistral-format checkpoint", "phimoe": "PhiMoEForCausalLM (its remote code's name)",
    "mimo2": "the released config's swa_* keys",
    "exaone": "EXAONE 3's own architecture name (the test saves a Llama)",
    **dict.fromkeys(["granite4", "granite4-moe"], "layers_block_type"),
    "gemma3": "nothing it lacks, but it drops the embedding rows past the tokenizer's (the test's 468 of 512)",
}
TAKEN = [case for case in CASES if case not in CANNOT and case not in WRITTEN_AS]
# Keys the released checkpoints' config.json has and transformers' saved one lacks, which the converter reads
RELEASED = {"gpt2": lambda c: {"n_ctx": c["n_positions"]}, "cohere2": lambda c: {"rotary_pct": 1.0},
            "minimax-m2": lambda c: {"rotary_dim": int(c["head_dim"] * c["rope_parameters"]["partial_rotary_factor"])}}
# Metadata the converter writes otherwise, by key (after the architecture's name), each read alike by kiln: a value
# equal to the default where the other leaves it out, a key kiln does not read, or (mistral) the window an older
# converter wrote, which kiln still reads
KNOWN = {"mistral": {"attention.sliding_window"}, "stablelm": {"rope.freq_base"}, "phi2": {"rope.freq_base"},
         "mixtral": {"attention.key_length", "attention.value_length"}, "cohere": {"rope.scaling.type"},
         "command-r-plus": {"rope.scaling.type"}, "exaone4": {"vocab_size"}, "exaone-moe": {"vocab_size"},
         "olmo": {"rope.dimension_count", "vocab_size"}, "falcon-40b": {"tensor_data_layout"},
         "deepseek2-v3": {"rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow"},
         "gpt-oss": {"rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow"},
         "cohere2": {"rope.dimension_count", "rope.scaling.type", "vocab_size"}}
# Tensors the writer writes that the converter does not: GPT-2's head, a copy of its embedding (older converters
# wrote it; kiln reads the head tied either way)
EXTRA_TENSORS = {"gpt2": {"output.weight"}}


@pytest.fixture(scope="module")
def converted(llama_cpp_files, tmp_path_factory) -> dict:
    """case -> (its Hugging Face folder, llama.cpp's GGUF of it), every case converted by one converter process."""
    root = tmp_path_factory.mktemp("converter")
    pairs = {case: (root / case / "hf", root / case / "llama.gguf") for case in TAKEN}
    for case, (hf, _) in pairs.items():
        write_hf(case, hf)
        if case in RELEASED:
            path = hf / "config.json"
            config = json.loads(path.read_text())
            path.write_text(json.dumps(dict(config, **RELEASED[case](config))))
    args = [str(p) for pair in pairs.values() for p in pair]
    run = subprocess.run([sys.executable, str(LLAMA_CPP_FILES.__file__), "convert", *args], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return pairs


def _fields(reader: gguf.GGUFReader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items()
            if not k.startswith(("tokenizer.", "general.", "GGUF."))}


@pytest.mark.parametrize("case", TAKEN)
def test_the_writer_writes_what_llama_cpps_converter_writes(case, converted, tmp_path):
    hf, path = converted[case]
    theirs = gguf.GGUFReader(path)
    mine = gguf.GGUFReader(write_gguf(hf, tmp_path / "mine.gguf"))
    ta, tb = ({t.name: t for t in r.tensors} for r in (theirs, mine))
    assert sorted(ta) == sorted(set(tb) - EXTRA_TENSORS.get(case, set()))
    for name, t in ta.items():
        x = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        y = np.asarray(gguf.quants.dequantize(tb[name].data, tb[name].tensor_type), np.float32)
        assert x.shape == y.shape and np.array_equal(x, y), name
    a, b = _fields(theirs), _fields(mine)
    known = KNOWN.get(case, set())
    differ = {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys()
              if not _same(a.get(k), b.get(k)) and k.split(".", 1)[-1] not in known}
    assert not differ, f"metadata (llama.cpp's, the writer's): {differ}"


def _same(x, y) -> bool:
    """Equal metadata values, floats as float32 (the file's)."""
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same(p, q) for p, q in zip(x, y))
    if isinstance(x, float) or isinstance(y, float):
        return x is not None and y is not None and np.float32(x) == np.float32(y)
    return x == y
