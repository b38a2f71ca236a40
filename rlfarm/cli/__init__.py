"""`rlfarm`: train on a Celery + Redis rollout farm, run workers, evaluate and inspect policies.

The command line only: each command maps its flags to calls of rlfarm.api, rlfarm.tune and the
back-ends (rlfarm.commands, rlfarm.evaluation, rlfarm.local, rlfarm.farm) and their exceptions to one `rlfarm: error:`
line and an exit status. A module per group of commands: train (train, train --seeds), worker,
farm (up, down, status), evaluate (eval), checkpoints (list, export, delete), sweep, misc (plot,
presets); common holds what they share.
"""

from __future__ import annotations

import click

from rlfarm.cli import common
from rlfarm.cli.checkpoints import checkpoints
from rlfarm.cli.common import OneLineErrors
from rlfarm.cli.evaluate import eval_
from rlfarm.cli.farm import down, status, up
from rlfarm.cli.runs import plot, runs
from rlfarm.cli.sweep import sweep
from rlfarm.cli.train import presets, train
from rlfarm.cli.worker import worker

__all__ = ["entry", "main"]


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="rlfarm")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="More messages: debug lines too (on stderr; a run's are also in RUN_DIR/rlfarm.log).",
)
@click.option(
    "-q", "--quiet", count=True, help="Warnings and errors only (a run's info lines still go to RUN_DIR/rlfarm.log)."
)
def main(verbose: int, quiet: int) -> None:
    """rlfarm: RL rollout episodes as Celery tasks on any number of machines, Redis in the middle.

    Start with `rlfarm train` (no Redis running? it starts an embedded one and local workers), or
    `rlfarm up` for a farm that stays up; add machines with `rlfarm worker --redis URL`. Every command
    finds its farm the same way: --redis, else RLFARM_REDIS_URL, else the `rlfarm up` farm.
    """
    from rlfarm.runio.logs import setup_logging

    setup_logging(verbose - quiet)


for _command in (train, worker, up, down, eval_, checkpoints, status, runs, plot, sweep, presets):
    main.add_command(_command)


def entry() -> None:
    """The `rlfarm` console script: `main` with a fast exit after a finished run."""
    common._FAST_EXIT = True
    main()
