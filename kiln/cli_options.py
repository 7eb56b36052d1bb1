"""What several `kiln` commands share: compile progress, the sampling, speculation and chat-template
options, and the engine `generate` and `chat` run (kiln/cli.py, kiln/cli_serve.py)."""

from __future__ import annotations

import functools
from pathlib import Path

import click

DEFAULT_MODEL = "smollm2"


class CompileProgress:
    """Renders compile progress events (stage, done, total) on stderr with rich."""

    LABELS = {"load": "reading model", "export": "exporting Relax IR", "weights": "converting weights",
              "golden": "golden logits", "golden-reference": "golden reference build",
              "check": "checking golden prompts", "write": "writing artifact"}

    def __init__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.console import Console
        self.bar = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=Console(stderr=True), transient=False)
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def __call__(self, stage: str, done: int, total: int) -> None:
        key = "compile" if stage.startswith("compile:") else stage
        label = f"compiling ({stage.split(':', 1)[1]})" if key == "compile" else self.LABELS.get(stage, stage)
        if key not in self.tasks:
            self.tasks[key] = self.bar.add_task(label, total=total)
        self.bar.update(self.tasks[key], completed=done, total=total, description=label)


def compiled(model: str) -> Path | str:
    """MODEL itself where it is an artifact; else its artifact from the compile-on-first-use cache
    (compiled now, with progress, if absent)."""
    import kiln
    if kiln.is_artifact(model):
        return model
    with CompileProgress() as progress:
        return kiln.ensure_artifact(model, progress=progress)


def sampling_options(fn):
    """--max-tokens, --temperature, --top-p, --top-k, --seed and --stop (sampling_params' arguments)."""
    for opt in reversed([
        click.option("--max-tokens", default=256, show_default=True, help="tokens to generate at most"),
        click.option("--temperature", default=0.7, show_default=True, help="0 = greedy"),
        click.option("--top-p", default=0.95, show_default=True),
        click.option("--top-k", default=0, show_default=True, help="0 = off"),
        click.option("--seed", type=int, help="same seed, same output"),
        click.option("--stop", multiple=True, help="stop string (repeatable)"),
    ]):
        fn = opt(fn)
    return fn


def sampling_params(max_tokens, temperature, top_p, top_k, seed, stop):
    """SamplingParams from sampling_options' values."""
    from kiln import SamplingParams
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                          seed=seed, stop=tuple(stop))


_SPECULATION = ("speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "draft_model")


def speculation_options(fn):
    """--speculative-tokens, the n-gram sizes of its prompt lookup and --draft-model (EngineConfig's
    fields), handed to the command as one dict, `speculation`."""
    @functools.wraps(fn)
    def command(*args, **kwargs):
        return fn(*args, speculation={k: kwargs.pop(k) for k in _SPECULATION}, **kwargs)
    command = click.option("--draft-model", metavar="MODEL",
                           help="speculative decoding with this smaller model's greedy tokens as the drafts, "
                                "instead of prompt lookup: an artifact for the same device, or a model compiled "
                                "on first use; it must share MODEL's tokenizer (e.g. Llama-3.2-1B for "
                                "Llama-3.1-8B); --speculative-tokens 0 means 4 with it")(command)
    command = click.option("--prompt-lookup-max", default=4, show_default=True, type=click.IntRange(min=1),
                           help="speculative decoding: the longest n-gram looked up")(command)
    command = click.option("--prompt-lookup-min", default=2, show_default=True, type=click.IntRange(min=1),
                           help="speculative decoding: the shortest n-gram looked up")(command)
    return click.option("--speculative-tokens", default=0, show_default=True, type=click.IntRange(min=0),
                        help="speculative decoding by prompt lookup: in a step of decodes, check up to this "
                             "many tokens that followed an earlier occurrence of each request's last tokens in "
                             "the same forward and keep those the model picks itself (greedy: the same text; "
                             "fewer forwards where text repeats: edits, quotes, code); 0 is off")(command)


def speculation_fields(speculation: dict) -> dict:
    """EngineConfig's speculative fields from the options, a --draft-model compiled on first use."""
    draft = speculation["draft_model"]
    return {**speculation, "draft_model": None if draft is None else compiled(draft)}


def step_graphs_option(fn):
    return click.option("--step-graphs", is_flag=True,
                        help="CUDA: capture each decode step whole as a CUDA graph, once per batch and page "
                             "count, and replay it with one launch (runtime/step_graph.py), so the host no "
                             "longer queues the step kernel by kernel; steps with a sequence that shares "
                             "prefix-cache pages, or a sliding window, run as before; off until a GPU run "
                             "adopts it")(fn)


def chat_template_option(fn):
    return click.option("--chat-template", "chat_template", metavar="NAME|FILE",
                        help="use this chat template instead of the model's (a jinja file, or built-in: "
                             "chatml, gemma, llama3); for models that ship none")(fn)


def template_source(value: str | None) -> str | None:
    """The option's template source, checked before any model is read."""
    if value is None:
        return None
    from kiln.runtime.chat_templates import resolve_chat_template
    try:
        return resolve_chat_template(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def one_sequence_engine(model: str, chat_template: str | None = None, speculation: dict | None = None):
    """The engine of `generate` and `chat`: one sequence at a time, so its KV cache holds one full
    context (on a GPU it would otherwise take 90% of the device for the artifact's max batch)."""
    import kiln
    source = template_source(chat_template)
    return kiln.Engine(compiled(model), kiln.EngineConfig(max_num_seqs=1, chat_template=source,
                                               **(speculation_fields(speculation) if speculation else {})))
