"""`kiln chat`: an interactive conversation with line editing, that survives Ctrl-C and long histories.

- Line editing and history come from readline (arrow keys, Ctrl-R), the history kept in
  <cache_dir>/chat_history between sessions.
- Ctrl-C while a reply streams stops that reply only (the partial reply stays in the history);
  at the prompt it clears the line. Ctrl-D or /exit quits, /reset clears the conversation.
- A history that no longer fits the context window loses its oldest turns (the system prompt
  stays), with a notice; a single message too long for the window is refused and dropped.
- While a prompt is read (prefill), a status line says how many tokens are being read.
"""

from __future__ import annotations

import signal
import sys
from typing import Callable

import click

HELP = "kiln chat — /reset clears the conversation, /exit or Ctrl-D quits, Ctrl-C stops a reply"


def fit_history(history: list[dict], count_tokens: Callable[[list[dict]], int], budget: int) -> tuple[list[dict], int]:
    """(history without its oldest turns until it fits `budget` tokens, turns dropped). A leading
    system message is kept; turns go oldest first, a user message with the replies that follow it."""
    system, turns = (history[:1], history[1:]) if history and history[0]["role"] == "system" else ([], history)
    dropped = 0
    while len(turns) > 1 and count_tokens(system + turns) > budget:
        cut = next((i for i in range(1, len(turns)) if turns[i]["role"] == "user"), len(turns) - 1)
        turns, dropped = turns[cut:], dropped + 1
    return system + turns, dropped


def _readline() -> None:
    try:
        import readline
    except ImportError:         # no readline (Windows): plain input() still works
        return
    import atexit

    from kiln import cache_dir
    path = cache_dir() / "chat_history"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        readline.read_history_file(path)
    except OSError:
        pass
    readline.set_history_length(1000)
    atexit.register(lambda: _save_history(readline, path))


def _save_history(readline, path) -> None:
    try:
        readline.write_history_file(path)
    except OSError:
        pass


def run_chat(engine, params, system: str | None) -> None:
    from rich.console import Console

    from kiln.runtime import reasoning
    _readline()
    # Ctrl-C must stop a reply even when kiln was started with SIGINT ignored (a background job of a
    # non-interactive shell, nohup): Python then installs no KeyboardInterrupt handler of its own.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    status_console = Console(stderr=True)
    context = engine.artifact.context_window
    reserve = max(1, min(params.max_tokens or context // 4, context // 2))   # room left for the reply
    history = [{"role": "system", "content": system}] if system else []
    click.echo(HELP, err=True)
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            click.echo()
            return
        except KeyboardInterrupt:
            click.echo("\n(Ctrl-D or /exit quits)", err=True)
            continue
        if line.strip() in ("/exit", "/quit"):
            return
        if line.strip() == "/reset":
            history = history[:1] if system else []
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        history, dropped = fit_history(history, lambda h: len(engine.render_chat(h)), context - reserve)
        ids = engine.render_chat(history)
        if len(ids) > context - reserve:
            click.echo(f"error: this message is {len(ids)} tokens with the template; the context window holds "
                       f"{context} with {reserve} kept for the reply. Send a shorter one", err=True)
            history.pop()
            continue
        if dropped:
            click.echo(f"(dropped the {dropped} oldest turn{'s' if dropped > 1 else ''} to fit the {context}-token "
                       "context window; /reset starts afresh)", err=True)
        reply, parser = [], reasoning.for_prompt(engine.tokenizer, ids)
        stream = engine.generate_stream(ids, params)
        status = status_console.status(f"reading a {len(ids)}-token prompt", spinner="dots")
        status.start()
        try:
            for delta in stream:
                if not reply:
                    status.stop()
                _show(parser, delta.text, False, reply)
        except KeyboardInterrupt:
            stream.close()                      # aborts the request, frees its pages
            click.echo(" [stopped]", err=True)
        finally:
            status.stop()
        _show(parser, "", True, reply)              # what a parser held back
        click.echo()
        history.append({"role": "assistant", "content": "".join(reply)})


def _show(parser, text: str, last: bool, reply: list[str]) -> None:
    """Print a piece of the reply: its reasoning dimmed, its content as is (the content alone is kept
    in the history, as chat templates drop past reasoning)."""
    thought = ""
    if parser is not None:
        thought, text = parser.read(text, last)
    if thought:
        click.echo(click.style(thought, dim=True), nl=False)
    reply.append(text)
    click.echo(text, nl=False)
    sys.stdout.flush()
