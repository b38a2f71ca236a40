"""The commands over this machine's run directories, no farm needed: `rlfarm runs` (rlfarm.runio.runs)
and `rlfarm plot` (rlfarm.commands.plot)."""

from __future__ import annotations

from pathlib import Path

import click

from rlfarm.cli.common import fail


@click.command()
@click.argument("run", metavar="RUN")
@click.option(
    "--logdir", default=None, help="Where RUN's directory is: RUN may be a run id under it, or a run directory [runs]."
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Image to write; the format follows the suffix (.png, .svg, .pdf) [RUN_DIR/curves.png].",
)
def plot(run: str, logdir: str | None, output: Path | None) -> None:
    """Plot a run's learning curves: training and evaluation return against env steps and wall time.

    RUN is a run id (under --logdir) or a run directory, as for `rlfarm eval RUN`."""
    from rlfarm.commands.plot import plot_run
    from rlfarm.errors import NoRun, PlotError
    from rlfarm.runio.runs import resolve

    try:
        run_dir = resolve(run, logdir)
    except NoRun as exc:
        fail(str(exc))
    try:
        out = plot_run(run_dir, output)
    except PlotError as exc:
        fail(str(exc))
    except (OSError, ValueError) as exc:  # unwritable path, unknown image format
        fail(f"cannot write {output or run_dir / 'curves.png'}: {exc}")
    click.echo(f"wrote {out}")


@click.command()
@click.option("--logdir", default=None, help="The log directory whose runs to list [runs].")
def runs(logdir: str | None) -> None:
    """List the runs on this machine's disk, newest first: algorithm, env, state, env steps, best
    greedy evaluation and farm. No farm needed; `rlfarm status` shows what a farm runs now."""
    from rlfarm.runio.runs import local_runs

    rows = local_runs(logdir)
    if not rows:
        from rlfarm.config import RunConfig

        click.echo(f"no runs in {logdir or RunConfig.logdir}/ (start one with rlfarm train)")
        return
    click.echo(f"{'run':<24} {'algo':<5} {'env':<28} {'state':<9} {'env steps':>11} {'best eval':>10} farm")
    for r in rows:
        steps = f"{r.env_steps:,}" if r.env_steps is not None else "-"
        best = f"{r.best_eval:.1f}" if r.best_eval is not None else "-"
        click.echo(f"{r.run_id:<24} {r.algo:<5} {r.env[:28]:<28} {r.state:<9} {steps:>11} {best:>10} {r.farm}")
