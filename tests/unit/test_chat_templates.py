"""--chat-template: kiln's built-in templates render each family's turn format, a file works, bad
values are one-line errors before any model is read, and an Engine uses the given template."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kiln.runtime.chat_templates import BUILTIN, resolve_chat_template
from kiln.runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.unit
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Sea?"}]
EXPECTED = {
    "gemma": "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
             "<start_of_turn>user\nSea?<end_of_turn>\n<start_of_turn>model\n",
    "chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
              "Hello.<|im_end|>\n<|im_start|>user\nSea?<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<bos><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
              "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nSea?<|eot_id|><|start_header_id|>assistant"
              "<|end_header_id|>\n\n",
}


def _render(source: str) -> str:
    import jinja2
    return jinja2.Environment().from_string(source).render(messages=CONVERSATION, add_generation_prompt=True,
                                                           bos_token="<bos>")


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_builtin_templates_render_the_family_turn_format(name):
    assert _render(resolve_chat_template(name)) == EXPECTED[name]


def test_a_file_is_read_and_bad_values_are_one_line(tmp_path):
    good = tmp_path / "t.jinja"
    good.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    assert _render(resolve_chat_template(str(good))) == "[Be brief.][Hi][Hello.][Sea?]"
    with pytest.raises(ValueError, match="neither a file nor a built-in template \\(chatml, gemma, llama3\\)"):
        resolve_chat_template("nosuch")
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match="is not a valid jinja template: .*line 1"):
        resolve_chat_template(str(bad))


def test_cli_refuses_a_bad_template_before_reading_the_model():
    from kiln.cli import main
    result = CliRunner().invoke(main, ["generate", "/no/such/model", "hi", "--chat", "--chat-template", "nosuch"])
    assert result.exit_code != 0 and "--chat-template 'nosuch'" in result.output and "Traceback" not in result.output


def test_the_engine_renders_with_the_given_template(tiny_artifacts):
    import kiln
    engine = kiln.Engine(tiny_artifacts["tied"], kiln.EngineConfig(chat_template=resolve_chat_template("gemma")))
    ids = engine.render_chat([{"role": "user", "content": "hello there"}])
    tok = Tokenizer.from_dir(tiny_artifacts["tied"])
    assert ids == tok.encode("<start_of_turn>user\nhello there<end_of_turn>\n<start_of_turn>model\n",
                             add_special_tokens=False)


def test_a_checkpoints_template_files_reach_the_artifact(tmp_path):
    """transformers (4.5x on) saves a tokenizer's chat template as chat_template.jinja and named ones under
    additional_chat_templates/, not in tokenizer_config.json; kiln's artifact tokenizer renders them as transformers
    does (the .jinja ahead of a config's own, tool_use chosen with tools); a processor's chat_template.json serves
    where nothing else gives one; a malformed one is refused by name."""
    import json

    import transformers

    from kiln.models.hf import tokenizer_files
    from kiln.models.source import ModelLoadError
    from tiny_models import write_tokenizer
    write_tokenizer(tmp_path, 300)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    tok.chat_template = {"default": "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}",
                         "tool_use": "[{{ tools | length }} tools]"
                                     "{% for m in messages %}{{ m['content'] }}{% endfor %}"}
    saved = tmp_path / "saved"
    tok.save_pretrained(saved)
    assert (saved / "chat_template.jinja").is_file() and (saved / "additional_chat_templates").is_dir()
    assert "chat_template" not in json.loads((saved / "tokenizer_config.json").read_text())
    out = tmp_path / "art"
    out.mkdir()
    write, _ = tokenizer_files(saved)
    assert "tokenizer_config.json" in write(out)
    ours, theirs = Tokenizer.from_dir(out), transformers.AutoTokenizer.from_pretrained(saved)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    for extra in ({}, {"tools": tools}):
        assert ours.apply_chat_template(CONVERSATION, **extra) == theirs.apply_chat_template(
            CONVERSATION, tokenize=False, add_generation_prompt=True, **extra)
    processor = tmp_path / "processor"
    processor.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (processor / name).write_text((saved / name).read_text())
    (processor / "chat_template.json").write_text(json.dumps({"chat_template": "{{ messages[0]['content'] }}!"}))
    write, _ = tokenizer_files(processor)
    write(out)
    assert Tokenizer.from_dir(out).apply_chat_template(CONVERSATION) == "Be brief.!"
    (processor / "chat_template.json").write_text("[]")
    with pytest.raises(ModelLoadError, match=r"chat_template\.json is not a JSON object with a chat_template"):
        tokenizer_files(processor)
