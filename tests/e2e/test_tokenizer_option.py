"""`kiln compile --tokenizer PATH` (models/tokenizer_from.py): a checkpoint that ships no tokenizer (OpenELM's, weights
alone) compiled with another folder's or a GGUF's tokenizer runs on text, its chat template included; a folder with
none, or a tokenizer whose ids reach past the model's vocabulary, is refused by name before anything is built."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

import kiln
from kiln.cli import main
from kiln.models import ModelLoadError, load
from kiln.models.tokenizer_from import with_tokenizer

from gguf_writer import write_gguf
from tiny_models import write_gemma_tokenizer

pytestmark = pytest.mark.e2e


@pytest.fixture
def bare(tiny_dirs, tmp_path):
    """The tied tiny Llama's weights and config alone, no tokenizer."""
    dest = tmp_path / "bare"
    dest.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_dirs["tied"] / name, dest / name)
    return dest


def test_a_model_without_a_tokenizer_runs_on_text_with_another_folders(bare, tiny_dirs, tmp_path):
    from tokenizers import Tokenizer

    from kiln import Engine, SamplingParams
    assert any(n.startswith("no tokenizer.json") for n in load(bare).notes)
    art = kiln.compile(str(bare), quant="q0f32", output=tmp_path / "art", golden=False, tokenizer=tiny_dirs["tied"])
    written = json.loads((art / "kiln-config.json").read_text())
    assert not any(n.startswith("no tokenizer.json") for n in written["notes"])
    assert any(n.startswith(f"tokenizer from {tiny_dirs['tied']} (--tokenizer") for n in written["notes"])
    ours, theirs = (Tokenizer.from_file(str(d / "tokenizer.json")) for d in (art, tiny_dirs["tied"]))
    text = "The quick brown fox jumps over the lazy dog."
    assert ours.encode(text).ids == theirs.encode(text).ids
    engine = Engine(art)
    reply = engine.chat([{"role": "user", "content": "hello"}], SamplingParams(max_tokens=4, temperature=0.0))
    assert len(reply.token_ids) == 4 and isinstance(reply.text, str)
    assert engine.render_chat([{"role": "user", "content": "hi"}])     # the other folder's chat template


def test_a_gguf_files_tokenizer(bare, tiny_dirs, tmp_path):
    """The tokenizer a GGUF's metadata holds (as llama.cpp writes it), rebuilt: the same ids as the folder's."""
    from tokenizers import Tokenizer
    gguf = write_gguf(tiny_dirs["tied"], tmp_path / "tiny.gguf")
    source = with_tokenizer(load(bare), gguf)
    source.write_tokenizer(tmp_path)
    ours, theirs = (Tokenizer.from_file(str(d / "tokenizer.json")) for d in (tmp_path, tiny_dirs["tied"]))
    for text in ("The quick brown fox", "  spaces and\ttabs\n", "ünïcödé 漢字"):
        assert ours.encode(text).ids == theirs.encode(text).ids, text
    assert source.content_hash != load(bare).content_hash


def test_what_is_not_a_tokenizer_the_model_can_use_is_refused(bare, tmp_path):
    big = tmp_path / "big"
    big.mkdir()
    write_gemma_tokenizer(big, 1024)                            # the model's vocabulary is 512
    with pytest.raises(ModelLoadError, match=r"has 1024 tokens, more than the model's vocabulary of 512"):
        with_tokenizer(load(bare), big)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"--tokenizer .*empty: no tokenizer.json; pass a folder"):
        with_tokenizer(load(bare), tmp_path / "empty")
    result = CliRunner().invoke(main, ["compile", str(bare), "--tokenizer", str(tmp_path / "missing"),
                                       "-o", str(tmp_path / "art")])
    assert result.exit_code != 0 and "--tokenizer" in result.output and "does not exist" in result.output
    assert not (tmp_path / "art").exists()
