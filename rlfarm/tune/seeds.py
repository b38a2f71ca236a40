"""`rlfarm train --seeds 1-5`: one ordinary run per seed on one farm, each trainer a subprocess, at
most `--parallel` at once (a seed starts when another's trainer ends); then each seed's scores and
their mean ± std over the seeds that finished (as rl-baselines3-zoo's benchmark reports them), as a
table and as SEEDS_DIR/summary.json.

Std is numpy's (population, ddof=0), the ± `rlfarm eval` prints too.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlfarm.local import shared
from rlfarm.tune.processes import TrainerProcess, stop_all

# summary.json key of a run -> column of the table
SCORES = {
    "best_eval_mean_return": "best eval",
    "eval_mean_return": "final eval",
    "best_rolling_return": "best return",
    "rolling_return": "final return",
}


@dataclass
class SeedRun:
    seed: int
    run_id: str
    run_dir: str
    state: str = "waiting"  # running | finished | failed
    reason: str = ""
    seconds: float = 0.0
    scores: dict[str, float | None] = field(default_factory=dict)
    # Wall-clock times (Unix seconds) its trainer was started and seen to have exited: with --parallel
    # they show which seeds ran at once.
    started_at: float | None = None
    ended_at: float | None = None


class StartFailed(Exception):
    """A trainer could not be started (fork or exec refused: a process limit, memory); the others were
    stopped. `seed`: the one that failed, `stopped`: how many were running."""

    def __init__(self, seed: int, error: OSError, stopped: int):
        super().__init__(
            f"could not start the trainer of seed {seed} ({error.strerror or error}); "
            f"the {stopped} running were stopped"
        )
        self.seed, self.error, self.stopped = seed, error, stopped


def seed_run_id(base: str, seed: int) -> str:
    return f"{base}-s{seed}"


def make_seeds_dir(cfg: Any, base: str) -> Path:
    """LOGDIR/BASE-seeds, made: the seeds' summary.json, their trainers' output (s<seed>.log) and an
    embedded farm's logs."""
    seeds_dir = Path(cfg.logdir) / f"{base}-seeds"
    seeds_dir.mkdir(parents=True, exist_ok=True)
    return seeds_dir


def trainers_at_once(seeds: int, parallel: int | None) -> int:
    """--parallel, or by default: trainers run on this machine whatever the farm, one per core (each
    learner needs one while it learns), at least 2 so seeds share the farm as they always did on small
    machines."""
    from rlfarm.config import machine_cores
    from rlfarm.sections import bounds as B

    return min(seeds, parallel or min(max(2, machine_cores()), B.MAX_PARALLEL_TRAINERS))


def train_seeds(
    args: list[str],
    seeds: list[int],
    cfg: Any,
    base: str,
    seeds_dir: Path,
    farm: Any,
    parallel: int,
    notify: Callable[[str], None],
) -> tuple[dict[str, Any], Path]:
    """`rlfarm train --seeds`, its config `cfg` checked: the farm found (rlfarm.farm.find.Farm), or
    one embedded for all the seeds (rlfarm.local.shared), a trainer per seed on it (run_seeds with
    `args`), then summary.json in `seeds_dir`. Returns the summary and its path. StartFailed and
    KeyboardInterrupt propagate once every trainer and an embedded farm are stopped."""
    from rlfarm.config import local_workers
    from rlfarm.config.seeds import compact_seeds
    from rlfarm.envs import allowed_modules_env

    logdir = Path(cfg.logdir)
    with shared.farm_for_trainers(
        farm, local_workers(cfg), seeds_dir / "farm", f"rlfarm-{base}", allowed_modules_env(cfg.env.id), notify=notify
    ) as env:
        at_once = "all at once" if parallel == len(seeds) else f"{parallel} at a time"
        notify(
            f"training {len(seeds)} seeds ({compact_seeds(seeds)}) {at_once}: runs {base}-s<seed> in "
            f"{logdir}/, trainer output in {seeds_dir}/s<seed>.log"
        )
        runs = run_seeds(args, seeds, base, logdir, env, seeds_dir, parallel)
    summary = aggregate(runs)
    return summary, write_summary(seeds_dir, summary)


def run_seeds(
    args: list[str], seeds: list[int], base: str, logdir: Path, env: dict[str, str], seeds_dir: Path, parallel: int
) -> list[SeedRun]:
    """`rlfarm train ARGS --seed S --run-id BASE-sS --logdir LOGDIR` for every seed, at most `parallel` at
    once: the next seed starts when a trainer exits (a farm-sized number of processes, however many
    seeds). Ctrl-C / SIGTERM (KeyboardInterrupt) stops every child before it propagates; so does a
    trainer that cannot be started (StartFailed)."""
    runs = [SeedRun(seed, seed_run_id(base, seed), str(logdir / seed_run_id(base, seed))) for seed in seeds]
    waiting, running = list(runs), []  # running: (SeedRun, TrainerProcess) pairs
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                run = waiting.pop(0)
                try:
                    trainer = TrainerProcess(
                        [*args, "--seed", str(run.seed), "--run-id", run.run_id, "--logdir", str(logdir)],
                        seeds_dir / f"s{run.seed}.log",
                        env,
                    )
                except OSError as exc:  # EAGAIN from fork under a pids limit, ENOMEM, ...
                    run.state, run.reason = "failed", f"not started: {exc.strerror or exc}"
                    raise StartFailed(run.seed, exc, len(running)) from None
                run.state, run.started_at = "running", time.time()
                running.append((run, trainer))
            for run, trainer in [pair for pair in running if pair[1].poll() is not None]:
                _finish(run, trainer)
                running.remove((run, trainer))
            if running and (not waiting or len(running) >= parallel):
                time.sleep(0.5)  # polling interval: the children run for minutes
    finally:
        stop_all([trainer for _, trainer in running])  # nothing left running, whatever happened
        for run, trainer in running:
            _finish(run, trainer)
    return runs


def _finish(run: SeedRun, trainer: TrainerProcess) -> None:
    run.ended_at, run.seconds = time.time(), round(trainer.seconds, 1)
    if trainer.poll() == 0:
        run.state, run.scores = "finished", _scores(Path(run.run_dir))
    else:
        run.state, run.reason = "failed", trainer.failure()


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
    return {
        "seeds": [r.seed for r in runs],
        "runs": [asdict(r) for r in runs],
        "finished": len(done),
        "failed": [r.seed for r in runs if r.state != "finished"],
        "mean": mean,
        "std": std,
    }


def table(summary: dict[str, Any]):
    """The rich table: a row per seed, then mean ± std."""
    from rich.table import Table

    def show(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    out = Table("seed", "run", "state", *SCORES.values(), title="seeds")
    for run in summary["runs"]:
        cells = (
            [show(run["scores"].get(k)) for k in SCORES]
            if run["state"] == "finished"
            else [run["reason"][:60], *[""] * (len(SCORES) - 1)]
        )
        out.add_row(str(run["seed"]), run["run_id"], run["state"], *cells)
    out.add_section()
    out.add_row(
        "mean ± std",
        f"{summary['finished']} of {len(summary['runs'])}",
        "",
        *[
            ("-" if summary["mean"][k] is None else f"{summary['mean'][k]:.1f} ± {summary['std'][k]:.1f}")
            for k in SCORES
        ],
    )
    return out


def write_summary(seeds_dir: Path, summary: dict[str, Any]) -> Path:
    path = Path(seeds_dir) / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path
