"""The learning-proof tables from the curves committed under benchmarks/results/, so a reader can check
docs/pong.md's figures against the numbers.

    python benchmarks/curves.py                          # every run under benchmarks/results/
    python benchmarks/curves.py benchmarks/results/pong-seed1 --target 18
    python benchmarks/curves.py --save runs/pong-seed1 benchmarks/results/pong-seed1

Each run directory holds what `rlfarm train` wrote there that a curve needs: episodes.csv (one row per
finished episode: env step, wall time since the trainer started, the episode's game score), and
summary.json; `--save RUN_DIR DEST` copies those (and evals.csv, config.json where present) from a
run directory. Printed per run: where the mean of the last 20 episodes first reached the target (env
steps, wall minutes), the mean at a wall-clock mark (`--minutes`, default 60: the issue's goal), the
best such mean and when, and where the run stopped (summary.json, or the last episode of a run that was
interrupted before it wrote one).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
KEPT = ("episodes.csv", "evals.csv", "summary.json", "config.json")
WINDOW = 20


def rolling(run_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(env steps, wall seconds, mean of the last 20 episodes) at each episode from the 20th on."""
    with open(run_dir / "episodes.csv") as f:
        rows = list(csv.DictReader(f))
    steps = np.array([int(r["global_step"]) for r in rows])
    wall = np.array([float(r["wall_time"]) for r in rows])
    returns = np.array([float(r["episodic_return"]) for r in rows])
    if len(returns) < WINDOW:
        return steps[:0], wall[:0], returns[:0]
    # Rounded so equal means compare equal (the best is the first time it was reached, not a rounding's).
    means = np.round(np.convolve(returns, np.ones(WINDOW) / WINDOW, mode="valid"), 9)
    return steps[WINDOW - 1 :], wall[WINDOW - 1 :], means


def describe(run_dir: Path, target: float | None, minutes: float = 60.0) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    config = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else {}
    target = target if target is not None else config.get("target_return")
    steps, wall, means = rolling(run_dir)
    row = {
        "run": run_dir.name,
        "seed": config.get("seed"),
        "target": target,
        "episodes": len(means) + WINDOW - 1,
        "stopped_steps": summary.get("env_steps"),
        "stopped_min": (summary.get("wall_seconds") or 0) / 60,
    }
    if not summary and len(steps):  # interrupted: it stopped at its last episode, as far as a curve can tell
        row.update(stopped_steps=int(steps[-1]), stopped_min=wall[-1] / 60)
    before = np.flatnonzero(wall <= minutes * 60)
    if len(before):
        row.update(at_mark=float(means[before[-1]]), at_mark_steps=int(steps[before[-1]]))
    if len(means):
        best = int(np.argmax(means))
        row.update(best=float(means[best]), best_steps=int(steps[best]), best_min=wall[best] / 60)
    hit = np.flatnonzero(means >= target) if target is not None and len(means) else []
    if len(hit):
        row.update(reached_steps=int(steps[hit[0]]), reached_min=wall[hit[0]] / 60)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run directories (default: all under benchmarks/results)")
    parser.add_argument("--target", type=float, help="the return to reach (default: the run's target_return)")
    parser.add_argument(
        "--minutes",
        type=float,
        default=60.0,
        help="the wall-clock mark at which to read the mean of the last 20 (default: 60)",
    )
    parser.add_argument(
        "--save",
        nargs=2,
        type=Path,
        metavar=("RUN_DIR", "DEST"),
        help="copy a run directory's curve files into DEST (e.g. benchmarks/results/NAME)",
    )
    args = parser.parse_args()
    if args.save:
        source, dest = args.save
        dest.mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            if (source / name).exists():
                shutil.copy2(source / name, dest / name)
        print(f"saved {', '.join(n for n in KEPT if (dest / n).exists())} to {dest}")
        return
    runs = args.runs or sorted(p for p in RESULTS.iterdir() if (p / "episodes.csv").exists())
    mark = f"at {args.minutes:g} min"
    print(
        f"{'run':<24} {'seed':>4} {'target':>6} {'reached at':>13} {'wall min':>9} {mark:>10} {'at steps':>10} "
        f"{'best of 20':>10} {'at steps':>10} {'stopped at':>11} {'wall min':>9}"
    )
    for run_dir in runs:
        r = describe(run_dir, args.target, args.minutes)
        reached = (
            f"{r['reached_steps']:>13,} {r['reached_min']:>9.1f}"
            if "reached_steps" in r
            else f"{'not reached':>13} {'-':>9}"
        )
        best = f"{r['best']:>10.1f} {r['best_steps']:>10,}" if "best" in r else f"{'-':>10} {'-':>10}"
        at_mark = f"{r['at_mark']:>10.1f} {r['at_mark_steps']:>10,}" if "at_mark" in r else f"{'-':>10} {'-':>10}"
        print(
            f"{r['run']:<24} {r['seed'] or '-':>4} {r['target'] if r['target'] is not None else '-':>6} "
            f"{reached} {at_mark} {best} {r['stopped_steps'] or 0:>11,} {r['stopped_min']:>9.1f}"
        )


if __name__ == "__main__":
    main()
