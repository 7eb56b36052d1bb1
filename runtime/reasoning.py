"""A chat reply's reasoning apart from its answer: `reasoning` (and `reasoning_content`) beside `content`.

Reasoning models write their thinking before the answer, in one of two conventions:

    think     <think> ... </think> answer         DeepSeek-R1, Qwen3, QwQ, GLM, Granite-style templates
                                                  (R1's template opens <think> in the prompt itself)
    harmony   <|channel|>analysis<|message|> ... <|end|><|start|>assistant<|channel|>final<|message|> answer
              OpenAI's gpt-oss: `analysis` is reasoning, `final` the answer, `commentary` to=functions.NAME
              a tool call (given to tools.ToolReply as a `<tool_call>` block), commentary without one content
    gemma4    <|channel>thought\n ... <channel|> answer, and tool calls as <|tool_call>call:NAME{ARGS}<tool_call|>
              (ARGS JSON with bare keys and strings between <|"|>; given to tools.ToolReply as `<tool_call>`
              blocks): Gemma 4, as transformers' serving reads its replies

`kiln serve --reasoning-parser auto` (the default) picks the convention the chat template writes
(`detect`), as vLLM's --reasoning-parser names it by hand. A parser reads a choice's text piece by
piece as it streams (`feed`, then `finish`), holding back only a tail that could still become a tag,
and starts where the rendered prompt left off (`start(prompt)`): inside <think> when the template
opened it, after it when the template closed it (Qwen3's enable_thinking false), at a new message's
header after Harmony's `<|start|>assistant`.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Callable

THINK, HARMONY, GEMMA4 = "think", "harmony", "gemma4"
PARSERS = ("auto", "none", THINK, HARMONY, GEMMA4)
FIELDS = ("reasoning", "reasoning_content")      # vLLM's name now, and the one DeepSeek's API and vLLM used first

_OPEN, _CLOSE = "<think>", "</think>"
_START, _CHANNEL, _MESSAGE, _CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
_ENDS = ("<|end|>", "<|return|>", "<|call|>")
_MAX_HEADER = 256          # characters of a Harmony header before the text is taken as plain content
_G4_CHANNEL, _G4_CLOSE, _G4_THOUGHT, _G4_TURN = "<|channel>", "<channel|>", "thought\n", "<|turn>"
_G4_CALL, _G4_CALL_END, _G4_QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'


def detect(chat_template: Any) -> str | None:
    """The convention a chat template writes, None for neither."""
    source = json.dumps(chat_template or "")
    if _CHANNEL in source and _MESSAGE in source:
        return HARMONY
    if any(tag in source for tag in (_G4_TURN, _G4_CHANNEL, _G4_CLOSE, _G4_CALL)):
        return GEMMA4
    if _CLOSE in source:
        return THINK
    return None


def resolve(choice: str, chat_template: Any) -> str | None:
    """`--reasoning-parser`'s choice for a model: auto detects, none turns it off."""
    if choice not in PARSERS:
        raise ValueError(f"reasoning parser must be one of {', '.join(PARSERS)}, got {choice!r}")
    if choice == "auto":
        return detect(chat_template)
    return None if choice == "none" else choice


def start(kind: str, prompt: str) -> ReasoningParser:
    """A parser for one choice of a reply to `prompt` (the rendered chat prompt's text)."""
    return {THINK: ThinkParser, HARMONY: HarmonyParser, GEMMA4: Gemma4Parser}[kind](prompt)


def for_prompt(tokenizer: Any, prompt_ids: list[int]) -> ReasoningParser | None:
    """A parser for a reply to a rendered chat prompt (its ids), where the tokenizer's chat template writes
    one of the conventions; None where it writes neither."""
    make = parsers_for(tokenizer, prompt_ids)
    return make() if make else None


def parsers_for(tokenizer: Any, prompt_ids: list[int]) -> Callable[[], ReasoningParser] | None:
    """for_prompt's parser as a maker (a new one for each choice of the reply); the prompt's last 64 tokens,
    decoded once, say where a reply starts."""
    kind = detect(tokenizer.chat_template) if tokenizer is not None else None
    return functools.partial(start, kind, tokenizer.decode(prompt_ids[-64:])) if kind else None


def split(parser: ReasoningParser, text: str) -> tuple[str, str]:
    """(reasoning, content) of a whole reply's text."""
    return parser.read(text, last=True)


class ReasoningParser:
    """Splits text fed piece by piece into (reasoning, content) pieces."""

    @property
    def answering(self) -> bool:
        """Whether the text from here on is the answer (a grammar may constrain it; runtime/request.py)."""
        return self.state == "content"

    def feed(self, text: str) -> tuple[str, str]:
        raise NotImplementedError

    def finish(self) -> tuple[str, str]:
        """What was held back, at the end of the choice."""
        raise NotImplementedError

    def _until(self, buf: str, tags: tuple[str, ...], out: list[str]) -> tuple[str | None, str | None]:
        """buf's text before the first of `tags` into `out`: (the text after that tag, the tag); (None, None) where
        none is whole yet, a tail that could begin one held back in self.tail."""
        found = [(at, tag) for tag in tags if (at := buf.find(tag)) >= 0]
        if not found:
            keep = held_back(buf, tags)
            out.append(buf[:len(buf) - keep])
            self.tail = buf[len(buf) - keep:]
            return None, None
        at, tag = min(found)
        out.append(buf[:at])
        return buf[at + len(tag):], tag

    def read(self, text: str, last: bool = False) -> tuple[str, str]:
        """feed(text), and at the choice's `last` piece what finish() gives back too."""
        thought, content = self.feed(text)
        if last:
            more, rest = self.finish()
            thought, content = thought + more, content + rest
        return thought, content


def held_back(text: str, tags: tuple[str, ...]) -> int:
    """How many characters at the end of text could be the start of one of tags."""
    for k in range(min(max(map(len, tags)) - 1, len(text)), 0, -1):
        if any(t.startswith(text[-k:]) for t in tags):
            return k
    return 0


class ThinkParser(ReasoningParser):
    """<think> reasoning </think> content. A reply that does not open with <think> (after whitespace),
    and whose prompt did not open it, is all content; one cut off inside it, all reasoning."""

    def __init__(self, prompt: str):
        end = prompt.rstrip()               # a tag the generation prompt itself ends with; earlier turns' don't count
        self.state = "reasoning" if end.endswith(_OPEN) else "content" if end.endswith(_CLOSE) else "start"
        self.tail = ""
        self.strip = False                         # after the reply's own </think>: its whitespace is not the answer's

    def feed(self, text: str) -> tuple[str, str]:
        reasoning, content = [], []
        buf, self.tail = self.tail + text, ""
        while buf:
            if self.state == "start":
                stripped = buf.lstrip()
                if not stripped or _OPEN.startswith(stripped[:len(_OPEN)]) and len(stripped) < len(_OPEN):
                    self.tail = buf                # whitespace, or the beginning of <think>: wait
                    break
                if stripped.startswith(_OPEN):
                    self.state, buf = "reasoning", stripped[len(_OPEN):]
                else:
                    self.state = "content"
                continue
            if self.state == "reasoning":
                buf, _ = self._until(buf, (_CLOSE,), reasoning)
                if buf is None:
                    break
                self.state, self.strip = "content", True
                continue
            if self.strip:
                buf = buf.lstrip()
                if not buf:
                    break
                self.strip = False
            content.append(buf)
            break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        tail, self.tail = self.tail, ""
        if self.state == "reasoning":
            return tail, ""
        return "", "" if self.strip else tail


class HarmonyParser(ReasoningParser):
    """OpenAI's Harmony messages: `[<|start|>role]<|channel|>NAME[ to=RECIPIENT][<|constrain|>TYPE]
    <|message|>BODY` ended by <|end|> (or the stop tokens <|return|> / <|call|>, never shown). A reply
    that is not Harmony (a JSON-constrained one, a prompt without `<|start|>`) is content as it comes."""

    def __init__(self, prompt: str):
        self.state, self.header, self.channel, self.call = "header", "", "", None
        self.tail, self.plain, self.primed = "", False, 0
        at = prompt.rfind(_START)
        if at < 0:
            self.plain = True
        else:                                      # the generation prompt's `<|start|>assistant`
            self.feed(prompt[at:])
            self.primed = len(self.header)         # header text that came from the prompt, not the reply

    @property
    def answering(self) -> bool:
        return self.plain or (self.state == "body" and self.channel == "final" and self.call is None)

    def feed(self, text: str) -> tuple[str, str]:
        out: dict[str, list[str]] = {"reasoning": [], "content": []}
        buf, self.tail = self.tail + text, ""
        while buf and not self.plain:
            if self.state == "header":
                self.header += buf
                at = self.header.find(_MESSAGE)
                if at < 0:
                    buf = ""
                    if not _harmony_header(self.header):
                        self.plain, buf = True, self.header[self.primed:]
                    break
                buf = self.header[at + len(_MESSAGE):]
                self._open(self.header[:at])
                continue
            ends = [(at, tag) for tag in (*_ENDS, _START) if (at := buf.find(tag)) >= 0]
            if not ends:
                keep = held_back(buf, (*_ENDS, _START))
                self._body(buf[:len(buf) - keep], out)
                self.tail = buf[len(buf) - keep:]
                break
            at, tag = min(ends)
            self._body(buf[:at], out)
            self._close(out)
            buf = buf[at:] if tag == _START else buf[at + len(tag):]
        if self.plain:
            out["content"].append(buf)
        return "".join(out["reasoning"]), "".join(out["content"])

    def finish(self) -> tuple[str, str]:
        """A body cut off is kept; a header cut off is structure, not text of the reply."""
        out: dict[str, list[str]] = {"reasoning": [], "content": []}
        tail, self.tail = self.tail, ""
        if self.plain:
            return "", tail
        if self.state == "body":
            self._body(tail, out)
            self._close(out)
        return "".join(out["reasoning"]), "".join(out["content"])

    def _open(self, header: str) -> None:
        """A message's header is read: route its body by channel and recipient."""
        channel = re.search(re.escape(_CHANNEL) + r"\s*([^\s<]+)", header)
        recipient = re.search(r"to=([^\s<]+)", header)
        self.channel = channel.group(1) if channel else "final"
        name = recipient.group(1) if recipient else None
        self.call = [name.removeprefix("functions."), ""] if name else None
        self.state, self.header, self.primed = "body", "", 0

    def _body(self, text: str, out: dict) -> None:
        if not text:
            return
        if self.call is not None:
            self.call[1] += text
        else:
            out["reasoning" if self.channel == "analysis" else "content"].append(text)

    def _close(self, out: dict) -> None:
        """A message ends: a tool call's body goes out whole, in the form tools.ToolReply reads."""
        if self.state == "body" and self.call is not None:
            name, arguments = self.call
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError:
                pass                               # ToolReply then reads no call in it: left as text
            out["content"].append("<tool_call>" + json.dumps({"name": name, "arguments": arguments})
                                  + "</tool_call>")
        self.state, self.header, self.call = "header", "", None


class Gemma4Parser(ReasoningParser):
    """Gemma 4's reply: a thought channel (`<|channel>thought\n ... <channel|>`, reasoning) and tool calls
    (`<|tool_call>call:NAME{ARGS}<tool_call|>`, handed on whole as `<tool_call>` JSON) among its content.
    A generation prompt that ends inside the thought channel starts the reply in it."""

    def __init__(self, prompt: str):
        end = prompt.rstrip()
        opened = end.rfind(_G4_CHANNEL)
        self.state = "reasoning" if opened >= 0 and _G4_CLOSE not in end[opened:] else "content"
        self.tail, self.call = "", ""

    def feed(self, text: str) -> tuple[str, str]:
        reasoning, content = [], []
        buf, self.tail = self.tail + text, ""
        while buf:
            if self.state == "content":
                buf, tag = self._until(buf, (_G4_CHANNEL, _G4_CALL), content)
                if buf is None:
                    break
                self.state = "channel" if tag == _G4_CHANNEL else "call"
            elif self.state == "channel":          # the channel's name line: `thought\n`
                if _G4_THOUGHT.startswith(buf):
                    self.tail = buf
                    break
                self.state, buf = "reasoning", buf[len(_G4_THOUGHT):] if buf.startswith(_G4_THOUGHT) else buf
            elif self.state == "reasoning":
                buf, _ = self._until(buf, (_G4_CLOSE,), reasoning)
                if buf is None:
                    break
                self.state = "content"
            else:                                  # inside a call: held until it closes
                self.call += buf
                at = self.call.find(_G4_CALL_END)
                if at < 0:
                    break
                content.append(gemma4_call(self.call[:at]))
                self.state, self.call, buf = "content", "", self.call[at + len(_G4_CALL_END):]
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        tail, self.tail = self.tail, ""
        if self.state == "reasoning":
            return tail, ""
        if self.state == "call":                   # cut off inside a call: its text as it came
            call, self.call = self.call, ""
            return "", _G4_CALL + call
        return "", "" if self.state == "channel" else tail


def gemma4_call(text: str) -> str:
    """`call:NAME{ARGS}` (the inside of a Gemma 4 tool call) as a `<tool_call>` JSON block (tools.ToolReply's
    form); as it came (tags included) where it is not one."""
    found = re.fullmatch(r"\s*call:([\w.\-]+)\s*(\{.*\})?\s*", text, re.S)
    try:
        if found is None:
            raise ValueError(text)
        arguments = json.loads(_gemma4_json(found.group(2) or "{}"))
    except ValueError:
        return _G4_CALL + text + _G4_CALL_END
    return "<tool_call>" + json.dumps({"name": found.group(1), "arguments": arguments}) + "</tool_call>"


def _gemma4_json(text: str) -> str:
    """Gemma 4's argument syntax as JSON: strings between <|"|> quoted, bare object keys quoted; JSON's own
    strings, numbers, true / false / null and punctuation kept."""
    out, i = [], 0
    while i < len(text):
        if text.startswith(_G4_QUOTE, i):
            end = text.find(_G4_QUOTE, i + len(_G4_QUOTE))
            if end < 0:
                raise ValueError("an unclosed <|\"|> string")
            out.append(json.dumps(text[i + len(_G4_QUOTE):end]))
            i = end + len(_G4_QUOTE)
        elif text[i] == '"':                       # a JSON string: copied through its escapes
            string = re.match(r'"(?:[^"\\]|\\.)*"', text[i:], re.S)
            if string is None:
                raise ValueError("an unclosed string")
            out.append(string.group(0))
            i += string.end()
        elif (key := re.match(r"[A-Za-z_][\w.\-]*(?=\s*:)", text[i:])) and not re.search(r"[\w.\-]$", "".join(out)):
            out.append(json.dumps(key.group(0)))
            i += key.end()
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _harmony_header(text: str) -> bool:
    """Whether text (since a message boundary) can still be, or is, a Harmony message header."""
    if len(text) > _MAX_HEADER:
        return False
    role = re.match(re.escape(_START) + r"\w+(?: to=[^\s<]*)?", text)
    rest = text[role.end():] if role else text
    heads = (_CHANNEL, _CONSTRAIN, _MESSAGE, " to=") if role else (_START, _CHANNEL, _CONSTRAIN, _MESSAGE)
    return not rest or any(rest.startswith(h) or h.startswith(rest) for h in heads)
