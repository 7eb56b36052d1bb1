"""Tool calling for /v1/chat/completions: tools into the prompt, the model's calls out as `tool_calls`.

    ToolRequest.parse(body)          validate tools / tool_choice / parallel_tool_calls (400 naming the field)
      .messages(messages, template)  developer -> system; assistant tool_calls and tool results for the template
      .prompt_tools(template)        the jinja `tools` variable, or None when the default system block is used
      .response_format()             required / named choice: a JSON schema over the allowed calls (xgrammar)
    parse_tool_calls(text, forced)   the reply's text -> (content, [OpenAI tool call])

The convention (Hermes / Qwen): a call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
A template that does not use `tools` gets DEFAULT_TOOL_PROMPT as (the start of) its system message.
When the choice is forced, the output is constrained to the call's JSON itself, without the tags.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from .openai_api import APIError, Reply, chat_logprobs
from .protocol import StreamDelta
from .reasoning import held_back

DEFAULT_TOOL_PROMPT = (
    "You may call one or more functions to assist with the user query. The functions are described "
    "as JSON schemas:\n{tools}\nTo call a function, answer with one line per call of the form\n"
    '<tool_call>{{"name": <function-name>, "arguments": <arguments-json-object>}}</tool_call>')
_TAG = "<tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass(frozen=True)
class ToolRequest:
    tools: list[dict]                 # OpenAI's [{"type": "function", "function": {...}}], validated
    choice: str                       # "auto" | "required" | "none" | "named"
    named: str | None = None          # the forced function's name (choice "named")
    parallel: bool = True

    @classmethod
    def parse(cls, tools: list | None, tool_choice: Any, parallel: bool | None) -> ToolRequest | None:
        """None when the request has no tools (and then a tool_choice other than none/auto is refused)."""
        if not tools:
            if tool_choice not in (None, "none", "auto"):
                raise APIError(400, "tool_choice needs tools; pass some tools or leave tool_choice out", "tool_choice")
            return None
        checked = [_check_tool(i, t) for i, t in enumerate(tools)]
        names = [t["function"]["name"] for t in checked]
        if len(set(names)) != len(names):
            raise APIError(400, "tools: function names must be unique", "tools")
        if tool_choice is None or tool_choice in ("auto", "none", "required"):
            return cls(checked, tool_choice or "auto", None, parallel is not False)
        fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or not isinstance(name, str):
            raise APIError(400, 'tool_choice must be "none", "auto", "required" or '
                                '{"type": "function", "function": {"name": ...}}', "tool_choice")
        if name not in names:
            raise APIError(400, f"tool_choice names {name!r}, which is not among tools ({', '.join(names)})",
                           "tool_choice")
        return cls(checked, "named", name, parallel is not False)

    @property
    def active(self) -> bool:
        return self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "named")

    def allowed(self) -> list[dict]:
        return [t for t in self.tools if self.named is None or t["function"]["name"] == self.named]

    def prompt_tools(self, template_uses_tools: bool) -> list[dict] | None:
        return self.allowed() if self.active and template_uses_tools else None

    def messages(self, messages: list[dict], template_uses_tools: bool) -> list[dict]:
        """Messages the template can render; with a template that knows no tools, calls become text."""
        out = []
        for m in messages:
            m = dict(m)
            if not template_uses_tools:
                m = _as_text(m)
            out.append(m)
        if self.active and not template_uses_tools:
            block = DEFAULT_TOOL_PROMPT.format(tools="\n".join(json.dumps(t["function"]) for t in self.allowed()))
            if out and out[0].get("role") == "system":
                out[0] = {**out[0], "content": block + "\n\n" + (out[0].get("content") or "")}
            else:
                out.insert(0, {"role": "system", "content": block})
        return out

    def forced_format(self, response_format: dict | None) -> dict | None:
        """The forced call's response_format; a request's own (other than text) would contradict it."""
        if response_format and response_format.get("type") != "text":
            raise APIError(400, "response_format cannot be combined with a required or named tool_choice: "
                                "the reply is the tool call's JSON", "response_format")
        return self.response_format()

    def response_format(self) -> dict | None:
        """For a forced choice: a JSON schema whose values are exactly the allowed calls."""
        if not self.forced:
            return None
        calls = [{"type": "object", "properties": {
            "name": {"const": t["function"]["name"]},
            "arguments": t["function"].get("parameters") or {"type": "object"}},
            "required": ["name", "arguments"], "additionalProperties": False} for t in self.allowed()]
        schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
        return {"type": "json_schema", "json_schema": {"name": "tool_call", "schema": schema}}


def normalize_messages(messages: list[dict]) -> list[dict]:
    """developer -> system; an assistant's tool_calls arguments (JSON strings) -> objects for templates;
    content None -> ""."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "developer":
            m["role"] = "system"
        if m.get("content") is None and m.get("role") in ("assistant", "tool"):
            m["content"] = ""
        if m.get("tool_calls"):
            m["tool_calls"] = [_call_for_template(c) for c in m["tool_calls"]]
        out.append(m)
    return out


def template_uses_tools(source: str | None) -> bool:
    return bool(source) and "tools" in source


def parse_tool_calls(text: str, forced: bool, parallel: bool = True) -> tuple[str | None, list[dict]]:
    """(content, tool_calls). Forced: the text is one call's JSON. Otherwise the tagged calls are taken
    out of the text; if any is not a valid call, the whole text stays content and no call is made."""
    if forced:
        call = _call(text)
        return (None, [call]) if call else (text, [])
    found = list(_CALL.finditer(text))
    if not found:
        return text, []
    calls = [_call(m.group(1)) for m in found]
    if any(c is None for c in calls):
        return text, []
    content = _CALL.sub("", text).strip()
    return content or None, calls if parallel else calls[:1]


def _call(text: str) -> dict | None:
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, dict):
        return None
    return {"id": "call_" + secrets.token_hex(12), "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def _check_tool(i: int, tool: Any) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise APIError(400, f'{where} must be {{"type": "function", "function": {{...}}}}', "tools")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise APIError(400, f"{where}.function must be an object", "tools")
    name = fn.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        raise APIError(400, f"{where}.function.name must be 1-64 letters, digits, _ . or -, got {name!r}", "tools")
    params = fn.get("parameters")
    if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
        raise APIError(400, f"{where}.function.parameters must be a JSON schema of type object", "tools")
    try:
        json.dumps(params)
    except (TypeError, ValueError):
        raise APIError(400, f"{where}.function.parameters is not JSON", "tools") from None
    return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


def _call_for_template(call: dict) -> dict:
    fn = dict(call.get("function") or {})
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except ValueError:
            raise APIError(400, "an assistant tool_calls[].function.arguments is not JSON", "messages") from None
    return {**call, "function": fn}


def _as_text(m: dict) -> dict:
    """A message for a template that knows no tools: calls as tagged text, a tool result as a user turn."""
    if m.get("tool_calls"):
        calls = "\n".join("<tool_call>" + json.dumps({"name": c["function"].get("name"),
                                                      "arguments": c["function"].get("arguments")})
                          + "</tool_call>" for c in m["tool_calls"])
        return {"role": "assistant", "content": ((m.get("content") or "") + "\n" + calls).strip()}
    if m.get("role") == "tool":
        return {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
    return {k: v for k, v in m.items() if k != "name"}


def reads_variable(template: str | None, name: Any) -> bool:
    """Whether a chat template (its source) names the variable `name` anywhere."""
    return isinstance(name, str) and name.isidentifier() and name in json.dumps(template or "")


def render(engine: Any, messages: list[dict], tools: ToolRequest | None,
           variables: dict[str, Any] | None = None) -> list[int]:
    """Prompt ids of a chat request with its tools (runs in a worker thread, never on the engine's)."""
    return render_text(engine, messages, tools, variables)[1]


def render_text(engine: Any, messages: list[dict], tools: ToolRequest | None,
                variables: dict[str, Any] | None = None, add_generation_prompt: bool = True,
                continue_final: bool = False, template: str | None = None,
                special_tokens: bool = False) -> tuple[str, list[int]]:
    """The prompt of a chat request with its tools, as text and ids; `variables`: more of the chat
    template's variables (reasoning_effort, documents, chat_template_kwargs), each refused (400) where the template
    never names it, rather than ignored. `continue_final`: the last (assistant) message left open, the text cut
    after its content as transformers' continue_final_message cuts it (vLLM's extension), for the reply to go on.
    `template`: a chat template (jinja) in place of the model's (vLLM's per-request chat_template).
    `special_tokens`: the text tokenized with the tokenizer's BOS and the like (vLLM's add_special_tokens)."""
    tok = engine._need_tokenizer()
    messages = normalize_messages(messages)
    extra: dict[str, Any] = {}
    for name, value in (variables or {}).items():
        field = name if name in ("reasoning_effort", "documents") else "chat_template_kwargs"
        if not reads_variable(template or tok.chat_template, name):
            raise APIError(400, f"this model's chat template reads no variable {name!r}, so it would change "
                                "nothing; leave it out", field)
        extra[name] = value
    if tools is not None:
        source = template or tok.chat_template
        if not source:
            raise APIError(400, "this model's tokenizer has no chat template, so tools cannot be put in a "
                                "prompt; send a completions request instead", "tools")
        uses = template_uses_tools(json.dumps(source))
        messages = tools.messages(messages, uses)
        if tools.prompt_tools(uses) is not None:
            extra["tools"] = tools.prompt_tools(uses)
    try:
        text = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, template=template,
                                       **extra)
    except ValueError as e:
        raise APIError(400, str(e), "messages") from None
    if continue_final:
        text = _cut_after(text, messages[-1].get("content") or "")
    return text, tok.encode(text, add_special_tokens=special_tokens)


def _cut_after(text: str, final: str) -> str:
    """`text` up to the end of the last occurrence of `final` (its stripped form where templates trim messages, as
    Llama 3.1's does), as transformers' continue_final_message cuts the rendered chat."""
    for content in (final, final.strip()):
        if content and (at := text.rfind(content)) >= 0:
            return text[:at + len(content)]
    raise APIError(400, "continue_final_message: the chat template did not render the final message's content, so "
                        "there is no place to continue it from", "continue_final_message")


class ToolReply(Reply):
    """A chat Reply whose choices may end in tool calls. Streaming, text is sent as content until it
    could be the start of a `<tool_call>` tag (a forced call holds it all); when the choice finishes,
    its calls are sent as tool_calls deltas (finish_reason "tool_calls"), or the held text as content.
    Every token's logprobs are sent once, in order: a held-back token's with the next chunk sent.
    A chunk looks only at its own text and the few characters held back before it; the whole text is
    read once, when the choice finishes (a chunk that read it all made a long reply quadratic)."""

    def __init__(self, *args: Any, tools: ToolRequest, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.tools = tools
        self._sent: dict[int, int] = {}       # choice -> characters already sent as content
        self._hold: dict[int, CallHold] = {}  # choice -> its text held back from where a call may start
        self._sent_logprobs: dict[int, int] = {}   # choice -> tokens whose logprobs were sent

    def _split(self, text: str) -> tuple[str | None, list[dict]]:
        return parse_tool_calls(text, self.tools.forced, self.tools.parallel)

    def add(self, delta: StreamDelta) -> dict | None:
        i = delta.index
        chunk = super().add(delta)
        if chunk is None:
            return None
        body = chunk["choices"][0]
        new = body["delta"].get("content") or ""
        body["delta"] = {k: v for k, v in body["delta"].items() if k != "content"}   # role, reasoning
        sent = self._sent.get(i, 0)
        if delta.finish_reason is None:
            out = self._sendable(i, new)
            self._sent[i] = sent + len(out)
            if not out and not body["delta"]:
                return None
            if out or "role" in body["delta"]:
                body["delta"]["content"] = out
        else:
            text = self.choices[i].text
            content, calls = self._split(text)
            if calls:
                body["delta"]["tool_calls"] = [{"index": n, **c} for n, c in enumerate(calls)]
                body["finish_reason"] = "tool_calls"
            elif len(text) > sent:
                body["delta"]["content"] = text[sent:]
        body["logprobs"] = self._unsent_logprobs(i)
        return chunk

    def _sendable(self, i: int, new: str) -> str:
        """What of choice i's held tail plus its new text can go out as content now."""
        return self._hold.setdefault(i, CallHold(self.tools.forced)).sendable(new)

    def _unsent_logprobs(self, index: int) -> dict | None:
        lps = self.choices[index].logprobs
        done, self._sent_logprobs[index] = self._sent_logprobs.get(index, 0), len(lps)
        return chat_logprobs(lps[done:], self.token_text) if len(lps) > done else None

    def final(self) -> dict:
        out = super().final()
        for choice in out["choices"]:
            content, calls = self._split(choice["message"]["content"] or "")
            if calls:
                choice["message"] = {**choice["message"], "content": content, "tool_calls": calls}
                choice["finish_reason"] = "tool_calls"
        return out


class CallHold:
    """A reply's text as it streams while tools may be called: what can go out as content now. All but a
    tail that could still start a `<tool_call>` tag; nothing once a tag has begun, or when a call is forced."""

    def __init__(self, forced: bool):
        self.forced, self.tail, self.holding = forced, "", False

    def sendable(self, new: str) -> str:
        if self.forced or self.holding:
            return ""
        tail = self.tail + new
        at = tail.find(_TAG)
        self.holding = at >= 0
        safe = at if at >= 0 else _safe_prefix(tail)
        self.tail = "" if at >= 0 else tail[safe:]
        return tail[:safe]


def without_calls(text: str) -> str:
    """The text with its `<tool_call>` blocks taken out (what is left of the reply's content, unstripped)."""
    return _CALL.sub("", text)


def _safe_prefix(text: str) -> int:
    """How much of text (no `<tool_call>` tag in it) can be sent as content: all but a tail that could
    still become one."""
    return len(text) - held_back(text, (_TAG,))
