"""The runs on this machine's disk: what RUN names for every command that takes one (a run id under
the log directory, or a run directory), and the list of them with their scores and state (`rlfarm
runs`), read from their files alone: no farm needed."""

from __future__ import annotations

import csv
import fcntl
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlfarm.errors import NoRun


def resolve(run: str | Path, logdir: str | Path | None = None) -> Path:
    """The run directory `run` names: itself if it is one (it has config.json), else LOGDIR/run, else
    `run` itself if it is a directory (the command says what it lacks)."""
    from rlfarm.config import RunConfig

    given, under = Path(run), Path(logdir or RunConfig.logdir) / run
    for candidate in (given, under):
        if (candidate / "config.json").is_file():
            return candidate
    if given.is_dir():  # a directory given by path: what it lacks is for the command to say
        return given
    if under == given or given.is_absolute():
        raise NoRun(f"no run directory at {given}")
    raise NoRun(f"no run {str(run)!r}: neither {given}/ nor {under}/ is a run directory (one with config.json)")


def training(run_dir: Path) -> bool:
    """Whether a trainer writes `run_dir` now: it holds the flock on its trainer.lock (rlfarm.farm.claim)."""
    try:
        fd = os.open(run_dir / "trainer.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


@dataclass(frozen=True)
class RunRow:
    run_id: str
    algo: str
    env: str
    state: str  # training, finished, stopped
    env_steps: int | None
    best_eval: float | None  # the best greedy evaluation's mean return
    farm: str  # "embedded" (its own Redis and workers) or "farm"
    path: Path


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _last_progress_steps(run_dir: Path) -> int | None:
    try:
        with open(run_dir / "progress.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        return int(float(rows[-1]["global_step"])) if rows else None
    except (OSError, KeyError, ValueError, csv.Error):
        return None


def _best_eval(run_dir: Path) -> float | None:
    try:
        with open(run_dir / "evals.csv", newline="") as f:
            means = [float(row["mean_return"]) for row in csv.DictReader(f) if row.get("mean_return")]
    except (OSError, KeyError, ValueError, csv.Error):
        return None
    means = [m for m in means if not math.isnan(m)]
    return max(means) if means else None


def row(run_dir: Path) -> RunRow:
    config, summary = _read_json(run_dir / "config.json"), _read_json(run_dir / "summary.json")
    state = "training" if training(run_dir) else "finished" if summary else "stopped"
    steps = summary.get("env_steps") if summary and state != "training" else _last_progress_steps(run_dir)
    best = summary.get("best_eval_mean_return") if summary and state != "training" else None
    if best is None or (isinstance(best, float) and math.isnan(best)):
        best = _best_eval(run_dir)
    env = config.get("env", {}).get("id", "?") if isinstance(config.get("env"), dict) else "?"
    farm = "embedded" if (run_dir / "cluster.json").is_file() else "farm"
    return RunRow(run_dir.name, str(config.get("algo", "?")), str(env), state, steps, best, farm, run_dir)


def local_runs(logdir: str | Path | None = None) -> list[RunRow]:
    """Every run directory under `logdir` (default: runs), newest first."""
    from rlfarm.config import RunConfig

    root = Path(logdir or RunConfig.logdir)
    try:
        dirs = [d for d in root.iterdir() if (d / "config.json").is_file()]
    except OSError:
        return []
    dirs.sort(key=lambda d: (d / "config.json").stat().st_mtime, reverse=True)
    return [row(d) for d in dirs]
