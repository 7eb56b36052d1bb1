"""The family registry: lookups by config.json fields, the unknown-architecture error, `kiln models`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kiln.cli import main
from kiln.models import ModelLoadError, find_architecture
from kiln.models.registry import ARCHITECTURES

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("hf, family", [
    ({"architectures": ["MistralForCausalLM"]}, "llama"),
    ({"model_type": "qwen3"}, "qwen3"),
    ({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3"}, "gemma3"),
    ({"model_type": "gemma3_text"}, "gemma3"),
    ({"architectures": ["GPT2LMHeadModel"]}, "gpt2"),
    ({"architectures": ["Phi3ForCausalLM"]}, "phi3"),
])
def test_find_architecture(hf, family):
    assert find_architecture(hf).name == family


def test_unknown_architecture_lists_every_family_and_its_names():
    with pytest.raises(ModelLoadError) as e:
        find_architecture({"architectures": ["FalconForCausalLM"]})
    msg = str(e.value)
    assert msg.startswith("unknown architecture: FalconForCausalLM. Supported: ")
    for a in ARCHITECTURES.values():
        assert a.name in msg and a.hf_architectures[0] in msg
    assert "GGUF llama" in msg


def test_kiln_models_lists_families():
    out = CliRunner().invoke(main, ["models", "--json"])
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines()]
    assert [r["family"] for r in rows] == list(ARCHITECTURES)
    assert next(r for r in rows if r["family"] == "qwen2")["gguf_architectures"] == ["qwen2"]
