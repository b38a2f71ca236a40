"""What a run has reached so far, read from its run directory while its trainer writes it: the
intermediate values a sweep reports for pruning, and a finished run's score.

`eval`: the greedy evaluations (evals.csv, confirmation rows left out), mean_return at global_step.
`return`: the mean of the last 20 training episodes at each log step (progress.csv, charts/rolling_return).
Rows are appended whole (rlfarm.runio.rundir), so a row read is final; a line without its newline
yet is left for the next read.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

METRICS = ("eval", "return")
_FILES = {"eval": ("evals.csv", "mean_return"), "return": ("progress.csv", "charts/rolling_return")}


class Curve:
    """New (step, value) points of one run's metric, each point once, in the order written."""

    def __init__(self, run_dir: Path, metric: str):
        name, self.column = _FILES[metric]
        self.path = Path(run_dir) / name
        self.metric = metric
        self._offset = 0
        self._header: list[str] | None = None
        self.points: list[tuple[int, float]] = []

    def read(self) -> list[tuple[int, float]]:
        """The points written since the last read."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        whole = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(whole)
        lines = whole.decode().splitlines()
        if self._header is None and lines:
            self._header, lines = next(csv.reader([lines[0]])), lines[1:]
        new = []
        for row in csv.DictReader(io.StringIO("\n".join(lines)), fieldnames=self._header):
            if row.get("confirmation") == "1":
                continue
            try:
                step, value = int(row["global_step"]), float(row[self.column])
            except (KeyError, TypeError, ValueError):
                continue
            if math.isfinite(value):
                new.append((step, value))
        self.points += new
        return new


def final_score(run_dir: Path, metric: str, points: list[tuple[int, float]]) -> float | None:
    """A finished run's objective: `eval`, the best greedy evaluation (summary.json's
    best_eval_mean_return, of the best version over all its episodes); `return`, the best mean of 20
    training episodes (best_rolling_return). Without them, the best point seen; None if nothing."""
    key = {"eval": "best_eval_mean_return", "return": "best_rolling_return"}[metric]
    try:
        value = json.loads((Path(run_dir) / "summary.json").read_text()).get(key)
    except (OSError, ValueError):
        value = None
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return max((v for _, v in points), default=None)
