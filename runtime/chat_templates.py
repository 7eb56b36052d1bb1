"""Chat templates kiln ships, for models whose files carry none (`--chat-template NAME`).

A base model's GGUF (gemma3-270m) or a bare HF folder often has no `chat_template`, so chat
requests are refused; llama.cpp's server and vLLM take a template on the command line for that.
`resolve_chat_template` turns the option's value (a name below, or a path to a jinja file) into
template source, checked to parse. Written from each family's published turn format.
"""

from __future__ import annotations

from pathlib import Path

import jinja2

# System (and developer) text has no turn of its own in Gemma: it opens the next user turn.
_GEMMA = (
    "{{- bos_token -}}"
    "{%- set pending = namespace(text='') -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] in ('system', 'developer') -%}{%- set pending.text = pending.text + m['content'] + '\\n\\n' -%}"
    "{%- else -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else 'user' -%}"
    "{{- '<start_of_turn>' + role + '\\n' + (pending.text if role == 'user' else '') + m['content'] | trim"
    " + '<end_of_turn>\\n' -}}"
    "{%- if role == 'user' -%}{%- set pending.text = '' -%}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)
_CHATML = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + ('system' if m['role'] == 'developer' else m['role']) + '\\n' + m['content']"
    " + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
_LLAMA3 = (
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{{- '<|start_header_id|>' + ('system' if m['role'] == 'developer' else m['role']) + '<|end_header_id|>\\n\\n'"
    " + m['content'] | trim + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)
BUILTIN = {"chatml": _CHATML, "gemma": _GEMMA, "llama3": _LLAMA3}


def resolve_chat_template(value: str) -> str:
    """Template source for `--chat-template VALUE`: a built-in name or a jinja file; one-line errors."""
    if value in BUILTIN:
        source = BUILTIN[value]
    else:
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(f"--chat-template {value!r} is neither a file nor a built-in template "
                             f"({', '.join(BUILTIN)})")
        source = path.read_text()
    try:
        jinja2.Environment().parse(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"--chat-template {value!r} is not a valid jinja template: {e.message} "
                         f"(line {e.lineno})") from None
    return source
