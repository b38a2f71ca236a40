"""`rlfarm sweep`: Optuna trials as ordinary runs on the farm, `parallel` trainer subprocesses at once.

A trial is `rlfarm train ... --set key=value ... --run-id <study>-t<number>`. While it runs its run
directory is read every half second (rlfarm.tune.curves) and each new point is reported to Optuna at
its env step; when the pruner says so the trainer gets SIGTERM (it stops cleanly, SIGKILL after a
grace), the trial is PRUNED and its slot is given to the next trial at once. Points are checked in
the order written, whether the trainer is still running or has just exited, so what is pruned does not
depend on when the files were read.

A point at the run's end (its env step reaches the trial's total steps, or the last point of a trainer
that exited 0) is reported but never prunes: the run has already cost all it will, so it COMPLETES.

A trial whose params are not a point of the space (a trial enqueued by someone who can write to the
farm's Redis: Optuna gives its values as they are, out of range or not) is REFUSED: told FAILED with
the reason, never trained (docs/architecture.md, decision 23). With RLFARM_SECRET set, each trial the
sweep trains gets the user attr "signature" over (study, number, params), which best.toml requires.

A trainer that exits non-zero, or is killed by anyone, makes its trial FAILED with the reason (its
`rlfarm: error:` line, or the signal); the trial is not resumed or retried (a fault that repeats would
only repeat), and the sweep goes on with the others. A trial still running when the sweep is stopped
is FAILED too ("interrupted"), so the study holds no trial that looks alive.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlfarm.config.space import Param, check_params, to_overrides
from rlfarm.core.signing import secret_from_env, trial_signature
from rlfarm.tune.curves import Curve, final_score
from rlfarm.tune.processes import TrainerProcess, stop_all

POLL_SECONDS = 0.5


@dataclass
class TrialRun:
    number: int
    params: dict[str, Any]
    run_id: str
    trial: Any = field(repr=False)
    trainer: TrainerProcess | None = field(repr=False)  # None: REFUSED, never started
    curve: Curve | None = field(repr=False)
    state: str = "RUNNING"  # then COMPLETE, PRUNED, FAIL, or REFUSED (not in the space: never trained)
    value: float | None = None  # the latest point while it runs, the objective once COMPLETE
    step: int | None = None
    reason: str = ""
    final_step: int | None = None  # the run's total steps: a point there never prunes


@dataclass(frozen=True)
class SweepPlan:
    """How a sweep runs: `trials` in all, `parallel` at once, each scored by `metric`; `total_steps`:
    the runs' total steps unless the space sets them (a point there is the run's end)."""

    trials: int
    parallel: int
    metric: str
    total_steps: int | None = None


class Sweep:
    """`run()` asks the study for `trials` trials and runs them `parallel` at a time.

    `args`: what every trial's `rlfarm train` gets (preset, overrides, options); `env`: the trainers'
    environment (the farm's URL and secret); `on_change(runs)`: called after each round of polling and
    `on_end(run)` once per finished or refused trial (for the live table and its lines); `plan`: how
    many trials, how many at once, what scores them and how long they run."""

    def __init__(
        self,
        study: Any,
        params: list[Param],
        args: list[str],
        plan: SweepPlan,
        sweep_dir: Path,
        env: dict[str, str],
        on_change: Callable[[list[TrialRun]], None] = lambda runs: None,
        on_end: Callable[[TrialRun], None] = lambda run: None,
    ):
        self.study, self.params, self.args, self.plan = study, params, args, plan
        self.sweep_dir, self.env = Path(sweep_dir), env
        self.on_change, self.on_end = on_change, on_end
        self.secret = secret_from_env({**os.environ, **env})  # the trainers' own: they sign with it too
        self.runs: list[TrialRun] = []
        self._stopping: list[TrainerProcess] = []  # pruned trainers still cleaning up; their slots are free

    def run(self) -> list[TrialRun]:
        try:
            while len(self.runs) < self.plan.trials or self._running():
                while len(self._running()) < self.plan.parallel and len(self.runs) < self.plan.trials:
                    self._launch()
                for run in self._running():
                    self._watch(run)
                self._stopping = [t for t in self._stopping if not t.reap()]
                self.on_change(self.runs)
                if self._running():
                    time.sleep(POLL_SECONDS)
        finally:
            self._interrupt()
        return self.runs

    def _running(self) -> list[TrialRun]:
        return [run for run in self.runs if run.state == "RUNNING"]

    def _sample(self, trial: Any) -> tuple[dict[str, Any], str | None]:
        """The trial's values and, if they are not a point of the space, why (check_params)."""
        values: dict[str, Any] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna's warning of an enqueued value out of range: refused below
            for param in self.params:
                try:
                    values[param.key] = param.suggest(trial)
                except (ValueError, TypeError) as exc:  # an enqueued value Optuna cannot even take
                    why = " ".join(str(exc).split())[:200]  # one line, whatever the value was
                    return values, f"{param.key}: {why} (not in the space: {param.describe()})"
        return values, check_params(values, self.params)

    def _launch(self) -> None:
        trial = self.study.ask()
        values, problem = self._sample(trial)
        run_id = f"{self.study.study_name}-t{trial.number}"
        trial.set_user_attr("run_id", run_id)
        if problem is not None:
            self._refuse(TrialRun(trial.number, values, run_id, trial, None, None), problem)
            return
        if self.secret is not None:
            trial.set_user_attr("signature", trial_signature(self.study.study_name, trial.number, values, self.secret))
        args = [
            *self.args,
            *(a for o in to_overrides(values) for a in ("--set", o)),
            "--run-id",
            run_id,
            "--logdir",
            str(self.sweep_dir),
        ]
        trainer = TrainerProcess(args, self.sweep_dir / "logs" / f"{run_id}.log", self.env)
        final = values.get("total_steps", self.plan.total_steps)
        self.runs.append(
            TrialRun(
                trial.number,
                values,
                run_id,
                trial,
                trainer,
                Curve(self.sweep_dir / run_id, self.plan.metric),
                final_step=final,
            )
        )

    def _refuse(self, run: TrialRun, problem: str) -> None:
        from optuna.trial import TrialState

        run.state, run.reason = "REFUSED", problem
        run.trial.set_user_attr("fail_reason", f"refused, not trained: {problem}")
        self.study.tell(run.trial, state=TrialState.FAIL)
        self.runs.append(run)
        self.on_end(run)

    def _watch(self, run: TrialRun) -> None:
        code = run.trainer.poll()  # before reading: once it has exited, every point is on disk
        points = run.curve.read()
        for i, (step, value) in enumerate(points):
            if step == run.step or (run.step is not None and step < run.step):
                continue  # one report per step (a final evaluation may repeat the last step)
            run.step, run.value = step, value
            run.trial.report(value, step)
            at_end = (run.final_step is not None and step >= run.final_step) or (
                code == 0 and all(later <= step for later, _ in points[i + 1 :])
            )  # an exited run's last
            if not at_end and run.trial.should_prune():
                run.trainer.stop()
                self._stopping.append(run.trainer)
                self._end(run, "PRUNED")
                return
        if code is None:
            return
        if code != 0:
            self._end(run, "FAIL", reason=run.trainer.failure())
            return
        value = final_score(self.sweep_dir / run.run_id, self.plan.metric, run.curve.points)
        if value is None:
            self._end(run, "FAIL", reason=f"the run finished without a {self.plan.metric} value to score it by")
        else:
            run.value = value
            self._end(run, "COMPLETE")

    def _end(self, run: TrialRun, state: str, reason: str = "") -> None:
        from optuna.trial import TrialState

        run.state, run.reason = state, reason
        run.trial.set_user_attr("seconds", round(run.trainer.seconds, 1))
        if reason:
            run.trial.set_user_attr("fail_reason", reason)
        if state == "COMPLETE":
            self.study.tell(run.trial, run.value)
        else:
            self.study.tell(run.trial, state=TrialState[state])
        self.on_end(run)

    def _interrupt(self) -> None:
        """Whatever ended the loop: no trainer is left running, and no trial RUNNING in the study."""
        running = self._running()
        stop_all([run.trainer for run in running] + self._stopping)
        for run in running:
            try:
                self._end(run, "FAIL", reason="interrupted: the sweep was stopped")
            except Exception:  # noqa: BLE001 - Redis may be what stopped the sweep; the trainers are stopped
                pass
