"""What a sweep leaves and shows: the trials table (live and final), SWEEP_DIR/trials.csv (every trial
of the study, this machine's and others') and SWEEP_DIR/best.toml (the best trial's config as a
preset: `rlfarm train --preset SWEEP_DIR/best.toml`)."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from rlfarm.config.dump import preset_toml
from rlfarm.tune.sweep import TrialRun


def _value(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.2f}"


def _param(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def trials_table(runs: list[TrialRun], title: str = ""):
    """A row per trial of this command: number, params, value (latest point or objective), state."""
    from rich.table import Table

    keys = list(runs[0].params) if runs else []
    table = Table("trial", *keys, "value", "at step", "state", title=title)
    for run in runs:
        state = run.state + (f": {run.reason[:60]}" if run.reason else "")
        table.add_row(str(run.number), *[_param(run.params.get(k)) for k in keys], _value(run.value),
                      "-" if run.step is None else str(run.step), state)
    return table


def trial_line(run: TrialRun) -> str:
    params = ", ".join(f"{k}={_param(v)}" for k, v in run.params.items())
    at = f" at step {run.step}" if run.state == "PRUNED" else ""
    why = f" ({run.reason})" if run.reason else ""
    return f"trial {run.number} {run.state}{at}: value {_value(run.value)}{why}; {params}; run {run.run_id}"


def write_trials_csv(study: Any, path: Path) -> Path:
    """number, state, value, one column per param, run_id, seconds, fail_reason: every trial."""
    trials = study.get_trials(deepcopy=False)
    keys = list(dict.fromkeys(k for t in trials for k in t.params))
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["number", "state", "value", *keys, "run_id", "seconds", "fail_reason"])
        for t in trials:
            out.writerow([t.number, t.state.name, "" if t.value is None else t.value,
                          *[t.params.get(k, "") for k in keys], t.user_attrs.get("run_id", ""),
                          t.user_attrs.get("seconds", ""), t.user_attrs.get("fail_reason", "")])
    return path


def write_best(study: Any, base: dict[str, Any], metric: str, path: Path) -> Any:
    """best.toml from the study's best COMPLETE trial (None, nothing written, when there is none):
    the flat config the trials started from (`base`), with the trial's params."""
    from optuna.trial import TrialState

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    best = study.best_trial
    flat = {k: v for k, v in base.items() if k not in ("run_id", "logdir")}
    flat.update(best.params)
    flat["description"] = (f"best trial {best.number} of sweep {study.study_name}: {metric} "
                           f"{best.value:.2f}")
    header = (f"rlfarm sweep {study.study_name}: trial {best.number} ({best.user_attrs.get('run_id', '')}), "
              f"{metric} {best.value:.4g}\nrlfarm train --preset {path}")
    path.write_text(preset_toml(flat, header))
    return best
