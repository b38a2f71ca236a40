"""Learning curves of a finished (or running) run directory, as a PNG.

Three layers: `read_run` loads config.json, episodes.csv and evals.csv (I/O); `curves` turns those
rows into the exact series that are drawn (pure, tested against the CSVs); `render` draws them with
matplotlib. matplotlib is imported inside `render` only, so `rlfarm` starts fast for other commands.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlfarm.errors import PlotError
from rlfarm.observe.metrics import ROLLING_EPISODES


@dataclass(frozen=True)
class RunData:
    """What a run directory holds, as read from disk (CSV rows keep their string values)."""

    path: Path
    config: dict[str, Any]
    episodes: list[dict[str, str]]
    evals: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Curves:
    """The series `render` draws. Arrays are float64; episodes are in logged order."""

    title: str
    episode_step: np.ndarray
    episode_wall: np.ndarray
    episode_return: np.ndarray
    # The trailing mean over up to `window` episodes, taken once per log (after the last episode of
    # each group sharing a global_step): one value per episode would draw vertical spikes, since
    # a whole iteration's episodes are logged at one step.
    rolling_step: np.ndarray
    rolling_wall: np.ndarray
    rolling_return: np.ndarray
    window: int
    eval_step: np.ndarray
    eval_wall: np.ndarray
    eval_mean: np.ndarray
    eval_std: np.ndarray


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_run(run_dir: Path) -> RunData:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise PlotError(f"no run directory at {run_dir}")
    episodes = run_dir / "episodes.csv"
    if not episodes.is_file():
        raise PlotError(f"{run_dir} has no episodes.csv (not an rlfarm run directory?)")
    config: dict[str, Any] = {}
    if (run_dir / "config.json").is_file():
        try:
            config = json.loads((run_dir / "config.json").read_text())
        except ValueError as exc:
            raise PlotError(f"{run_dir / 'config.json'} is not valid JSON: {exc}") from None
    evals = run_dir / "evals.csv"
    # Confirmations re-play an evaluated version with other seeds: the curve shows the evaluations.
    rows = [r for r in (_read_csv(evals) if evals.is_file() else []) if r.get("confirmation", "0") != "1"]
    return RunData(run_dir, config, _read_csv(episodes), rows)


def rolling_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean of the last `window` values at each index (fewer at the start), as the console's
    "return(last 20)" reads it."""
    if window < 1:
        raise ValueError("window must be at least 1")
    sums = np.cumsum(np.concatenate([[0.0], values]))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (sums[idx] - sums[lo]) / (idx - lo)


def last_of_each_log(steps: np.ndarray) -> np.ndarray:
    """Indices of the last row of each run of equal consecutive steps."""
    if len(steps) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.append(steps[1:] != steps[:-1], True))


def _column(rows: list[dict[str, str]], name: str, source: str) -> np.ndarray:
    try:
        return np.array([float(row[name]) for row in rows], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as exc:
        raise PlotError(f"{source}: bad or missing column {name!r} ({exc})") from None


def run_title(config: dict[str, Any], fallback: str) -> str:
    run_id = config.get("run_id") or fallback
    env = (config.get("env") or {}).get("id", "?")
    algo = str(config.get("algo", "?")).upper()
    mode = config.get("mode")
    return f"{run_id}  ·  {env}  ·  {algo}" + (f" ({mode.upper()})" if mode else "")


def curves(run: RunData, window: int = ROLLING_EPISODES) -> Curves:
    if not run.episodes and not run.evals:
        raise PlotError(f"{run.path}: no episodes or evaluations logged yet")
    ret = _column(run.episodes, "episodic_return", "episodes.csv")
    step = _column(run.episodes, "global_step", "episodes.csv")
    wall = _column(run.episodes, "wall_time", "episodes.csv")
    last = last_of_each_log(step)
    return Curves(
        title=run_title(run.config, run.path.name),
        episode_step=step,
        episode_wall=wall,
        episode_return=ret,
        rolling_step=step[last],
        rolling_wall=wall[last],
        rolling_return=rolling_mean(ret, window)[last],
        window=window,
        eval_step=_column(run.evals, "global_step", "evals.csv"),
        eval_wall=_column(run.evals, "wall_time", "evals.csv"),
        eval_mean=_column(run.evals, "mean_return", "evals.csv"),
        eval_std=_column(run.evals, "std_return", "evals.csv"),
    )


def wall_unit(max_seconds: float) -> tuple[float, str]:
    """Divisor and label for the wall-time axis: seconds for short runs, minutes or hours after."""
    if max_seconds >= 3 * 3600:
        return 3600.0, "wall time (h)"
    if max_seconds >= 600:
        return 60.0, "wall time (min)"
    return 1.0, "wall time (s)"


def render(c: Curves, out: Path, dpi: int = 120) -> Path:
    """Draw `c` into `out` (format from its suffix, PNG for .png)."""
    # Figure + Agg canvas directly: no pyplot global state, no backend selection to leak.
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import EngFormatter
    except ImportError as exc:  # a worker-only install: `pip install rlfarm` without extras
        raise PlotError(
            f"rlfarm plot needs matplotlib, which is not installed here ({exc}); install the "
            f'trainer\'s extras: pip install -e ".[train]" in the rlfarm checkout (or pip '
            f"install 'rlfarm[train]')"
        ) from None

    fig = Figure(figsize=(12, 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax_step, ax_wall = fig.subplots(1, 2, sharey=True)
    wall_div, wall_label = wall_unit(float(max(c.episode_wall.max(initial=0), c.eval_wall.max(initial=0))))
    panels = (
        (ax_step, c.episode_step, c.rolling_step, c.eval_step, 1.0, "env steps"),
        (ax_wall, c.episode_wall, c.rolling_wall, c.eval_wall, wall_div, wall_label),
    )
    for ax, ep_x, roll_x, ev_x, div, label in panels:
        if len(ep_x):
            ax.scatter(
                ep_x / div, c.episode_return, s=7, alpha=0.2, color="tab:blue", linewidths=0, label="training episode"
            )
            ax.plot(
                roll_x / div,
                c.rolling_return,
                color="tab:blue",
                lw=2,
                label=f"training, mean of last {c.window} episodes",
            )
        if len(ev_x):
            ax.fill_between(
                ev_x / div,
                c.eval_mean - c.eval_std,
                c.eval_mean + c.eval_std,
                color="tab:orange",
                alpha=0.15,
                linewidth=0,
            )
            ax.plot(
                ev_x / div, c.eval_mean, "o-", color="tab:orange", lw=1.5, ms=4, label="greedy evaluation (mean ± std)"
            )
        ax.set_xlabel(label)
        ax.set_xlim(left=0)  # the run's start, so start-up time and early steps are visible
        ax.grid(alpha=0.3)
    ax_step.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax_step.set_ylabel("episodic return")
    ax_step.legend(loc="lower right", fontsize="small")
    fig.suptitle(c.title)
    out = Path(out)
    fig.savefig(out, dpi=dpi)
    return out


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Read, compute and draw: RUN_DIR/curves.png unless `out` says otherwise."""
    run = read_run(run_dir)
    return render(curves(run), Path(out) if out else Path(run_dir) / "curves.png")
