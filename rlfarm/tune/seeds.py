"""`rlfarm train --seeds 1-5`: one ordinary run per seed, all at once on one farm, each trainer a
subprocess; then each seed's scores and their mean ± std over the seeds that finished (as
rl-baselines3-zoo's benchmark reports them), as a table and as SEEDS_DIR/summary.json.

Std is numpy's (population, ddof=0), the ± `rlfarm eval` prints too.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlfarm.tune.trainers import Trainer, stop_all

# summary.json key of a run -> column of the table
SCORES = {"best_eval_mean_return": "best eval", "eval_mean_return": "final eval",
          "best_rolling_return": "best return", "rolling_return": "final return"}


@dataclass
class SeedRun:
    seed: int
    run_id: str
    run_dir: str
    state: str = "running"  # finished | failed
    reason: str = ""
    seconds: float = 0.0
    scores: dict[str, float | None] = field(default_factory=dict)


def seed_run_id(base: str, seed: int) -> str:
    return f"{base}-s{seed}"


def run_seeds(args: list[str], seeds: list[int], base: str, logdir: Path, env: dict[str, str],
              seeds_dir: Path) -> list[SeedRun]:
    """Start `rlfarm train ARGS --seed S --run-id BASE-sS --logdir LOGDIR` for every seed, wait for all.
    Ctrl-C / SIGTERM (KeyboardInterrupt) stops every child before it propagates."""
    runs, trainers = [], []
    try:
        for seed in seeds:
            run_id = seed_run_id(base, seed)
            runs.append(SeedRun(seed, run_id, str(logdir / run_id)))
            trainers.append(Trainer([*args, "--seed", str(seed), "--run-id", run_id, "--logdir", str(logdir)],
                                    seeds_dir / f"s{seed}.log", env))
        while any(t.poll() is None for t in trainers):
            time.sleep(0.5)  # polling interval: the children run for minutes
    finally:
        stop_all(trainers)  # nothing left running, whatever happened
    for run, trainer in zip(runs, trainers):
        run.seconds = round(trainer.seconds, 1)
        if trainer.poll() == 0:
            run.state, run.scores = "finished", _scores(Path(run.run_dir))
        else:
            run.state, run.reason = "failed", trainer.failure()
    return runs


def _scores(run_dir: Path) -> dict[str, float | None]:
    summary = json.loads((run_dir / "summary.json").read_text())
    return {key: _finite(summary.get(key)) for key in SCORES}


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def aggregate(runs: list[SeedRun]) -> dict[str, Any]:
    """summary.json: the seeds, each run, and mean and std over the finished ones (null without any)."""
    done = [r for r in runs if r.state == "finished"]
    mean, std = {}, {}
    for key in SCORES:
        values = [r.scores[key] for r in done if r.scores.get(key) is not None]
        mean[key] = float(np.mean(values)) if values else None
        std[key] = float(np.std(values)) if values else None
    return {"seeds": [r.seed for r in runs], "runs": [asdict(r) for r in runs],
            "finished": len(done), "failed": [r.seed for r in runs if r.state == "failed"],
            "mean": mean, "std": std}


def table(summary: dict[str, Any]):
    """The rich table: a row per seed, then mean ± std."""
    from rich.table import Table

    def show(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    out = Table("seed", "run", "state", *SCORES.values(), title="seeds")
    for run in summary["runs"]:
        cells = [show(run["scores"].get(k)) for k in SCORES] if run["state"] == "finished" else \
            [run["reason"][:60], *[""] * (len(SCORES) - 1)]
        out.add_row(str(run["seed"]), run["run_id"], run["state"], *cells)
    out.add_section()
    out.add_row("mean ± std", f"{summary['finished']} of {len(summary['runs'])}", "",
                *[("-" if summary["mean"][k] is None else f"{summary['mean'][k]:.1f} ± {summary['std'][k]:.1f}")
                  for k in SCORES])
    return out


def write_summary(seeds_dir: Path, summary: dict[str, Any]) -> Path:
    path = Path(seeds_dir) / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path
