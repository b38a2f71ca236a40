"""`rlfarm sweep` from start to end: its farm (the one found, or one embedded for the whole sweep),
the study in that farm's Redis, the trials (rlfarm.tune.sweep), trials.csv after each one and, once
they are over or the sweep is stopped, trials.csv and best.toml (rlfarm.tune.report). What the sweep
shows while it runs is the caller's (a SweepView)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlfarm.config.space import Param
from rlfarm.tune.sweep import SweepPlan, TrialRun


class SweepView:
    """What a sweep shows while it runs (the CLI's live table, or a line per trial). run_sweep calls
    these; here they show nothing."""

    def start(self) -> None:
        """Before the first trial starts."""

    def update(self, runs: list[TrialRun]) -> None:
        """After each round of watching the running trials."""

    def ended(self, run: TrialRun) -> None:
        """Once per finished or refused trial, trials.csv written with it."""

    def stop(self) -> None:
        """After the last trial, or once the sweep is stopped (before the final files are written)."""


@dataclass
class SweepOutcome:
    runs: list[TrialRun]  # this command's trials, in order
    best: Any  # the best trial (Optuna's FrozenTrial) that best.toml was written from; None: no best.toml
    skipped: list[tuple[Any, str]]  # COMPLETE trials left out of best.toml, and why

    @property
    def failed(self) -> list[int]:
        return [run.number for run in self.runs if run.state == "FAIL"]

    @property
    def refused(self) -> list[int]:
        return [run.number for run in self.runs if run.state == "REFUSED"]


def run_sweep(
    name: str,
    sweep_dir: Path,
    farm: Any,
    cfg: Any,
    base: dict[str, Any],
    params: list[Param],
    child_args: list[str],
    metric: str,
    trials: int,
    parallel: int,
    pruner: Any,
    resume: bool,
    seed: int | None,
    notify: Callable[[str], None],
    view: SweepView | None = None,
) -> SweepOutcome:
    """Sweep `name` on `farm` (rlfarm.farm.find.Farm; url None: an embedded one for the sweep), its
    trials `rlfarm train CHILD_ARGS` runs of `cfg` (made from the flat `base`) in `sweep_dir`,
    `parallel` at once. `resume`: continue the study `name` (SweepError if it is not there; a new one
    with that name is one too). SweepError and KeyboardInterrupt propagate with every trainer and an
    embedded farm stopped, and trials.csv and best.toml written when the study was open."""
    from rlfarm.config import local_workers
    from rlfarm.core.signing import secret_from_env
    from rlfarm.envs import allowed_modules_env
    from rlfarm.local.shared import REDIS_ENV, farm_for_trainers
    from rlfarm.tune.report import write_best, write_trials_csv
    from rlfarm.tune.study import open_study, study_place
    from rlfarm.tune.sweep import Sweep

    view = view or SweepView()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with farm_for_trainers(
        farm, local_workers(cfg), sweep_dir / "farm", f"rlfarm-{name}", allowed_modules_env(cfg.env.id), notify=notify
    ) as env:
        study = open_study(env[REDIS_ENV], name, resume, pruner, seed)
        secret = secret_from_env({**os.environ, **env})  # the trainers' secret, as the sweep signs with it
        notify(
            f"study {name} {'resumed' if resume else 'created'} {study_place(farm, name)}; {trials} trials, "
            f"{parallel} at once, scored by {metric}; runs and logs in {sweep_dir}/"
        )

        def on_end(run: TrialRun) -> None:
            write_trials_csv(study, sweep_dir / "trials.csv", params, secret)
            view.ended(run)

        sweep = Sweep(
            study,
            params,
            child_args,
            SweepPlan(trials, parallel, metric, cfg.total_steps),
            sweep_dir,
            env,
            view.update,
            on_end,
        )
        view.start()
        try:
            sweep.run()
        finally:
            view.stop()
            write_trials_csv(study, sweep_dir / "trials.csv", params, secret)
            best, skipped = write_best(study, base, metric, sweep_dir / "best.toml", params, secret)
    return SweepOutcome(sweep.runs, best, skipped)
