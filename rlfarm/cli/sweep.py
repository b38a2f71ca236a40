"""`rlfarm sweep`: hyperparameters tuned with Optuna (rlfarm.tune.sweep_run), every trial a run."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from rlfarm.cli.common import REDIS_HELP, exit_now, fail, find_farm, log, sigterm_to_interrupt
from rlfarm.sections import bounds as B  # pure and light: the upper bounds of the options below


@click.command()
@click.option(
    "--preset",
    default="cartpole-ppo",
    show_default=True,
    help="The config every trial starts from: a preset name or a TOML file.",
)
@click.option(
    "--space",
    "space_file",
    type=click.Path(dir_okay=False),
    help='TOML file with a [space] table: "ppo.learning_rate" = { low = 1e-4, high = 1e-2, '
    'log = true } (ints when low and high are ints; step optional), "ppo.update_epochs" = '
    "{ choices = [4, 10] }.  [required]",
)
@click.option(
    "--trials",
    type=click.IntRange(min=1, max=B.MAX_TRIALS),
    default=16,
    show_default=True,
    help=f"Trials this command runs (each machine sweeping the same study runs its own; at most {B.MAX_TRIALS:,}).",
)
@click.option(
    "--parallel",
    type=click.IntRange(min=1, max=B.MAX_PARALLEL_TRAINERS),
    default=2,
    show_default=True,
    help=f"Trials running at once, each a `rlfarm train` process (at most {B.MAX_PARALLEL_TRAINERS}).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config key of every trial (repeatable), e.g. --set total_steps=50000.",
)
@click.option("--total-steps", type=click.IntRange(min=1), help="Env steps of each trial's run.")
@click.option("--mode", type=click.Choice(["sync", "async"]), help="Mode of each trial's run.")
@click.option(
    "--redis",
    "redis_url",
    help=REDIS_HELP + " The study is kept there too (Optuna's journal storage), so sweeps on "
    "several machines against one Redis share it. None of these: an embedded Redis and "
    "local workers for the whole sweep, the study living in it until the sweep ends.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=B.MAX_WORKERS),
    help=f"Worker processes of the embedded farm (at most {B.MAX_WORKERS}).",
)
@click.option("--study", "study_name", help="Study name (default: generated); trials' run ids are STUDY-t<number>.")
@click.option(
    "--resume",
    "resume",
    metavar="STUDY",
    help="Continue the study STUDY in --redis (new trials after its own; a study without "
    "--redis ended with its sweep).",
)
@click.option(
    "--pruner",
    type=click.Choice(["median", "hyperband", "threshold", "none"]),
    default="median",
    show_default=True,
    help="Stop unpromising trials early: median (below the median of earlier trials at the same "
    "step, after 5 trials), hyperband, threshold (below --prune-below), none.",
)
@click.option("--prune-below", type=float, help="With --pruner threshold: stop a trial whose value falls below this.")
@click.option(
    "--prune-warmup",
    type=click.IntRange(min=0),
    help="Env steps of a run before it may be pruned [a quarter of its total steps].",
)
@click.option(
    "--metric",
    type=click.Choice(["eval", "return"]),
    help="What a trial is scored and pruned by: eval, its greedy evaluations (the best one is "
    "the score); return, the mean of its last 20 training episodes (the best one is the "
    "score) [eval when the config runs evaluations (eval.interval > 0), else return].",
)
@click.option("--seed", type=int, help="Seed of Optuna's sampler (the runs keep the config's seed).")
@click.option(
    "--logdir",
    type=click.Path(file_okay=False),
    help="Parent of the sweep's directory LOGDIR/STUDY, which holds the trials' run "
    "directories, trials.csv and best.toml [runs].",
)
def sweep(
    preset: str,
    space_file: str | None,
    trials: int,
    parallel: int,
    overrides: tuple[str, ...],
    total_steps: int | None,
    mode: str | None,
    redis_url: str | None,
    workers: int | None,
    study_name: str | None,
    resume: str | None,
    pruner: str,
    prune_below: float | None,
    prune_warmup: int | None,
    metric: str | None,
    seed: int | None,
    logdir: str | None,
) -> None:
    """Tune hyperparameters with Optuna: every trial an ordinary run on the farm.

    Trials run --parallel at a time; their evaluations (or returns) are reported while they run and
    the pruner stops the unpromising ones (SIGTERM to their trainer: PRUNED). A trainer that fails or
    is killed makes its trial FAILED (not retried) and the sweep goes on. A trial whose params are not
    in the space (one enqueued by someone else) is REFUSED, never trained. Writes LOGDIR/STUDY/
    trials.csv and best.toml (`rlfarm train --preset LOGDIR/STUDY/best.toml`), the best COMPLETE trial
    whose params are in the space (and, with RLFARM_SECRET, signed by a sweep). Exit status: 0 when
    every trial ended COMPLETE or PRUNED, 1 when one FAILED or was REFUSED (after the others ran),
    130 when stopped.
    """
    from rlfarm import config as C
    from rlfarm.api import check_config, config_values, make_config
    from rlfarm.config.space import load_space
    from rlfarm.errors import EnvError, SweepError
    from rlfarm.tune.report import skipped_line
    from rlfarm.tune.study import make_pruner, optuna
    from rlfarm.tune.sweep_run import run_sweep

    if not space_file:
        fail("--space FILE is required: a TOML file with a [space] table (see rlfarm sweep --help)")
    if resume and study_name and resume != study_name:
        fail(f"--resume {resume} continues that study; --study {study_name} names another")
    farm = find_farm(redis_url, needed=False)
    if resume and not farm.url:
        fail(
            "--resume needs --redis URL (or RLFARM_REDIS_URL, or the `rlfarm up` farm; none found): a study "
            "lives in the farm's Redis, and one without a farm ended with its sweep's embedded Redis"
        )
    if (pruner == "threshold") != (prune_below is not None):
        fail(
            "--pruner threshold needs --prune-below VALUE"
            if pruner == "threshold"
            else "--prune-below goes with --pruner threshold"
        )
    try:
        base = config_values(preset, overrides, total_steps=total_steps, mode=mode, workers=workers)
        cfg = make_config(None, base)
        params = load_space(space_file, base)
        check_config(cfg)
        optuna()
    except (C.ConfigError, EnvError, SweepError) as exc:
        fail(str(exc))
    metric = metric or ("eval" if cfg.eval.interval else "return")
    if metric == "eval" and not cfg.eval.interval:
        fail(
            "--metric eval needs greedy evaluations during the runs: set eval.interval (e.g. --set "
            "eval.interval=10240), or use --metric return"
        )
    name = resume or study_name or f"sweep-{Path(preset).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    sweep_dir = Path(logdir or C.RunConfig.logdir) / name
    warmup = cfg.total_steps // 4 if prune_warmup is None else prune_warmup
    child_args = [
        "--preset",
        str(Path(preset).resolve()) if Path(preset).suffix == ".toml" else preset,
        *(a for o in overrides for a in ("--set", o)),
        *(["--total-steps", str(total_steps)] if total_steps else []),
        *(["--mode", mode] if mode else []),
    ]
    sigterm_to_interrupt()
    try:
        view = _Display(name)
        outcome = run_sweep(
            name,
            sweep_dir,
            farm,
            cfg,
            base,
            params,
            child_args,
            metric,
            trials,
            parallel,
            make_pruner(pruner, warmup, cfg.total_steps, prune_below),
            bool(resume),
            seed,
            log.info,
            view,
        )
    except SweepError as exc:
        fail(str(exc), 1)
    except KeyboardInterrupt:
        click.echo(
            "rlfarm: interrupted; every trial's trainer stopped"
            + ("" if farm.url else ", and the embedded workers and Redis")
            + f" (running trials marked FAIL); trials so far in {sweep_dir / 'trials.csv'}",
            err=True,
        )
        sys.exit(130)
    if view.live is None:
        view.console.print(view.table(outcome.runs))
    click.echo(f"trials: {sweep_dir / 'trials.csv'}")
    for trial, problem in outcome.skipped:  # the study is data: what is not the space's, or not signed, is named
        click.echo(f"rlfarm: warning: {skipped_line(trial, problem)}", err=True)
    best = outcome.best
    if best is not None:
        params_text = ", ".join(f"{k}={v}" for k, v in best.params.items())
        click.echo(
            f"best: trial {best.number}, {metric} {best.value:.2f} ({params_text}); its config: "
            f"{sweep_dir / 'best.toml'} (rlfarm train --preset {sweep_dir / 'best.toml'})"
        )
    else:
        click.echo("no trial completed: no best.toml")
    failed, refused = outcome.failed, outcome.refused
    if failed:
        fail(
            f"trial{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} failed (reasons in "
            f"trials.csv and {sweep_dir}/logs/); the others ran",
            1,
        )
    if refused:
        fail(
            f"trial{'s' if len(refused) > 1 else ''} {', '.join(map(str, refused))} refused: params not in "
            f"the space (reasons in trials.csv); the others ran",
            1,
        )
    exit_now()


class _Display:
    """The sweep on the console, as rlfarm.tune.sweep_run.SweepView's methods (not derived from it:
    importing rlfarm.tune here would slow every command's start): on a terminal, the trials table kept
    up to date in place; piped, a line per trial as it ends and the table once at the end."""

    def __init__(self, name: str):
        from rich.console import Console
        from rich.live import Live

        self.title = f"sweep {name}"
        self.console = Console() if sys.stdout.isatty() else Console(width=160)
        self.live = Live(console=self.console, auto_refresh=False) if self.console.is_terminal else None

    def table(self, runs):
        from rlfarm.tune.report import trials_table

        return trials_table(runs, self.title)

    def start(self) -> None:
        if self.live is not None:
            self.live.start()

    def update(self, runs) -> None:
        if self.live is not None:
            self.live.update(self.table(runs), refresh=True)

    def ended(self, run) -> None:
        if self.live is None:
            from rlfarm.tune.report import trial_line

            click.echo(trial_line(run))
            sys.stdout.flush()

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
