"""`kiln tune`: the schedule-knob search's command (compiler/tune.py searches)."""

from __future__ import annotations

import click

from kiln.cli_info import friendly_errors as _friendly_errors


class _TuneProgress:
    """Renders TuneStatus events: kernel i/n, candidate j/m and the best gain so far."""

    def __init__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        self.bar = Progress(TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=Console(stderr=True))
        self.kernels = self.bar.add_task("exporting and collecting kernels", total=None)
        self.candidates = self.bar.add_task("candidates", total=None, visible=False)

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def __call__(self, s) -> None:
        self.bar.update(self.kernels, completed=max(s.kernel - 1, 0), total=s.kernels,
                        description=f"kernel {s.name or '-'}"[:44])
        self.bar.update(self.candidates, completed=s.candidate, total=s.candidates or None, visible=s.kernel > 0,
                        description=f"candidates (best so far x{s.best_gain:.2f})")


@click.command()
@click.argument("model")
@click.option("--target", default="cpu", show_default=True, help="only this machine's CPU can be timed here")
@click.option("--budget", default=10.0, show_default=True, help="minutes for the whole run, export included")
@click.option("--quant", default="auto", show_default=True, help="the quantization you compile with")
@click.option("--retune", is_flag=True, help="search kernels the database already has again")
@_friendly_errors
def tune(model, target, budget, quant, retune) -> None:
    """Search schedule knobs (tile_m, tile_n, unroll_k) for MODEL's hot kernels on this machine.

    \b
    The best knobs go to a per-target database that `kiln compile` then uses by itself:
      $KILN_CACHE_DIR/tuning/<target>-<hash>.json   (default ~/.cache/kiln/tuning/)
    <hash> identifies the TVM target (kind, mcpu, mattr, num-cores). Run again to tune the
    kernels a budget did not reach; delete the file to go back to the default knobs.
    """
    from kiln.compiler.tune import TuneOptions, tune_model
    opts = TuneOptions(model=model, target=target, quant=quant, budget_minutes=budget, retune=retune)
    with _TuneProgress() as progress:
        r = tune_model(opts, progress)
    click.echo(f"{'kernel':44s} {'m=1 us':>9s} {'(default)':>9s} {'m=128 us':>9s} {'(default)':>9s} tried  knobs")
    for k in r.results:
        knobs = f"tile_m={k.knobs.tile_m} tile_n={k.knobs.tile_n} unroll_k={k.knobs.unroll_k}" if k.improved \
            else "default"
        click.echo(f"{k.name[:44]:44s} {_us(k.us, 1)} {_us(k.default_us, 1)} {_us(k.us, 128)} "
                   f"{_us(k.default_us, 128)} {k.timed:5d}  {knobs}")
    click.echo(f"{len(r.results)} kernels tuned ({sum(k.improved for k in r.results)} beat the defaults), "
               f"{r.already_tuned} already in the database, {r.left} left for a later run; "
               f"{r.seconds:.0f} s\nwrote {r.db_path}; `kiln compile` uses it (recompile to apply)")


def _us(times: dict[int, float], rows: int) -> str:
    return f"{times[rows]:9.1f}" if rows in times else f"{'-':>9s}"
