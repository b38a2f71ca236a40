"""The small commands: `rlfarm plot` (rlfarm.commands.plot) and `rlfarm presets` (rlfarm.config)."""

from __future__ import annotations

from pathlib import Path

import click

from rlfarm.cli.common import fail


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Image to write; the format follows the suffix (.png, .svg, .pdf) [RUN_DIR/curves.png].",
)
def plot(run_dir: Path, output: Path | None) -> None:
    """Plot a run's learning curves: training and evaluation return against env steps and wall time."""
    from rlfarm.commands.plot import PlotError, plot_run

    try:
        out = plot_run(run_dir, output)
    except PlotError as exc:
        fail(str(exc))
    except (OSError, ValueError) as exc:  # unwritable path, unknown image format
        fail(f"cannot write {output or run_dir / 'curves.png'}: {exc}")
    click.echo(f"wrote {out}")


@click.command()
def presets() -> None:
    """List the shipped presets, one line each."""
    from rlfarm.config import preset_description, preset_names

    for name in preset_names():
        click.echo(f"{name:<16} {preset_description(name)}")
