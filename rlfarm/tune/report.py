"""What a sweep leaves and shows: the trials table (live and final), SWEEP_DIR/trials.csv (every trial
of the study, this machine's and others') and SWEEP_DIR/best.toml (the best trial's config as a
preset: `rlfarm train --preset SWEEP_DIR/best.toml`).

The study is data, not authority (docs/architecture.md, decision 23): anyone who can write to the
farm's Redis can append trials to it. So a trial becomes best.toml only if its params are a point of
the sweep's own space and, with RLFARM_SECRET set, it carries this sweep's signature; trials.csv says
why any other is left out."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from rlfarm.config.dump import preset_toml
from rlfarm.config.space import Param, check_params
from rlfarm.core.signing import verify_trial
from rlfarm.errors import SignatureError
from rlfarm.tune.sweep import TrialRun


def _value(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.2f}"


def _param(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def trials_table(runs: list[TrialRun], title: str = ""):
    """A row per trial of this command: number, params, value (latest point or objective), state."""
    from rich.table import Table

    keys = list(dict.fromkeys(k for run in runs if run.state != "REFUSED" for k in run.params))
    table = Table("trial", *keys, "value", "at step", "state", title=title)
    for run in runs:
        state = run.state + (f": {run.reason[:60]}" if run.reason else "")
        table.add_row(
            str(run.number),
            *[_param(run.params.get(k)) for k in keys],
            _value(run.value),
            "-" if run.step is None else str(run.step),
            state,
        )
    return table


def trial_line(run: TrialRun) -> str:
    if run.state == "REFUSED":  # its params are not the space's: the reason names them, nothing else is shown
        return f"trial {run.number} REFUSED, not trained: {run.reason}"
    params = ", ".join(f"{k}={_param(v)}" for k, v in run.params.items())
    at = f" at step {run.step}" if run.state == "PRUNED" else ""
    why = f" ({run.reason})" if run.reason else ""
    return f"trial {run.number} {run.state}{at}: value {_value(run.value)}{why}; {params}; run {run.run_id}"


def trial_problem(trial: Any, space: list[Param], study_name: str, secret: bytes | None) -> str | None:
    """Why a finished trial read back from the study is not this sweep's to trust, in one line; None
    when its params are a point of `space` and, with a secret, its signature verifies."""
    problem = check_params(trial.params, space)
    if problem is None and secret is not None:
        try:
            verify_trial(study_name, trial.number, trial.params, trial.user_attrs.get("signature"), secret)
        except SignatureError as exc:
            problem = str(exc)
    return problem


def write_trials_csv(study: Any, path: Path, space: list[Param], secret: bytes | None = None) -> Path:
    """number, state, value, one column per param, run_id, seconds, fail_reason, refused (why a
    finished trial cannot be best: trial_problem): every trial."""
    trials = study.get_trials(deepcopy=False)
    keys = list(dict.fromkeys(k for t in trials for k in t.params))
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["number", "state", "value", *keys, "run_id", "seconds", "fail_reason", "refused"])
        for t in trials:
            refused = trial_problem(t, space, study.study_name, secret) if t.state.is_finished() else None
            out.writerow(
                [
                    t.number,
                    t.state.name,
                    "" if t.value is None else t.value,
                    *[t.params.get(k, "") for k in keys],
                    t.user_attrs.get("run_id", ""),
                    t.user_attrs.get("seconds", ""),
                    t.user_attrs.get("fail_reason", ""),
                    refused or "",
                ]
            )
    return path


def best_trial(study: Any, space: list[Param], secret: bytes | None = None) -> tuple[Any, list[tuple[Any, str]]]:
    """The best COMPLETE trial that passes trial_problem (None if none does), and the COMPLETE trials
    left out with why, in trial order."""
    from optuna.trial import TrialState

    best, skipped = None, []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        problem = trial_problem(trial, space, study.study_name, secret)
        if problem is None and not (isinstance(trial.value, float) and math.isfinite(trial.value)):
            problem = f"its value {trial.value!r} is not a finite number"
        if problem is not None:
            skipped.append((trial, problem))
        elif best is None or trial.value > best.value:  # the sweep maximizes; the first of equals
            best = trial
    return best, skipped


def skipped_line(trial: Any, problem: str) -> str:
    return f"trial {trial.number} left out of best.toml: {problem}"


def write_best(
    study: Any, base: dict[str, Any], metric: str, path: Path, space: list[Param], secret: bytes | None = None
) -> tuple[Any, list[tuple[Any, str]]]:
    """best.toml from best_trial (nothing written when there is none): the flat config the trials
    started from (`base`), with the trial's params. Returns (that trial or None, the trials left out)."""
    best, skipped = best_trial(study, space, secret)
    if best is None:
        return None, skipped
    flat = {k: v for k, v in base.items() if k not in ("run_id", "logdir")}
    flat.update(best.params)
    flat["description"] = f"best trial {best.number} of sweep {study.study_name}: {metric} {best.value:.2f}"
    # the run id as the sweep names it, not the trial's user attr: anything read back is data
    header = (
        f"rlfarm sweep {study.study_name}: trial {best.number} ({study.study_name}-t{best.number}), "
        f"{metric} {best.value:.4g}\nrlfarm train --preset {path}"
    )
    path.write_text(preset_toml(flat, header))
    return best, skipped
