"""Where a run's numbers go: a live console display, CSV files and TensorBoard scalars.

Keys follow CleanRL / Stable-Baselines3 (`charts/episodic_return`, `charts/SPS`, `losses/...`).
Files in the run directory: config.json, progress.csv (one row per log), episodes.csv (one row per
finished training episode), TensorBoard event files.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections import deque
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlfarm.config import json_safe

ROLLING_EPISODES = 20


def _truncate_csv(path: Path, max_step: int) -> list[str] | None:
    """Keep the header and the rows with global_step <= max_step; returns the header (None: no file)."""
    if not path.exists():
        return None
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return None
    header, body = rows[0], rows[1:]
    kept = [r for r in body if r and int(float(r[0])) <= max_step]
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *kept])
    return header


class RunLogger:
    def __init__(self, run_dir: Path, config: Mapping[str, Any], total_steps: int,
                 console: Console | None = None, tensorboard: bool = True,
                 resume: Mapping[str, Any] | None = None):
        """`resume`: the `state()` of the logger of a run being resumed; its files are kept up to the
        checkpoint's env step (later rows will be produced again) and appended to."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Strict JSON: target_return inf is written as null (rlfarm.config.from_dict reads it back).
        (self.run_dir / "config.json").write_text(
            json.dumps(json_safe(config), indent=2, allow_nan=False) + "\n")
        self.console = console or Console()
        self.total_steps = total_steps
        self.start = time.time() - (resume["elapsed"] if resume else 0.0)
        self.recent_returns: deque[float] = deque(resume["recent_returns"] if resume else (),
                                                  maxlen=ROLLING_EPISODES)
        self.best_rolling = resume["best_rolling"] if resume else -math.inf
        self._progress_csv: csv.DictWriter | None = None
        self._evals_file = None
        self._evals_csv: Any = None
        if resume:
            step = resume["env_steps"]
            progress_fields = _truncate_csv(self.run_dir / "progress.csv", step)
            self._progress_file = open(self.run_dir / "progress.csv", "a", newline="")
            if progress_fields:
                self._progress_csv = csv.DictWriter(self._progress_file, fieldnames=progress_fields,
                                                    extrasaction="ignore")
            _truncate_csv(self.run_dir / "episodes.csv", step)
            self._episodes_file = open(self.run_dir / "episodes.csv", "a", newline="")
            self._episodes_csv = csv.writer(self._episodes_file)
            if _truncate_csv(self.run_dir / "evals.csv", step):
                self._evals_file = open(self.run_dir / "evals.csv", "a", newline="")
                self._evals_csv = csv.writer(self._evals_file)
        else:
            self._progress_file = open(self.run_dir / "progress.csv", "w", newline="")
            self._episodes_file = open(self.run_dir / "episodes.csv", "w", newline="")
            self._episodes_csv = csv.writer(self._episodes_file)
            self._episodes_csv.writerow(["global_step", "wall_time", "episodic_return", "episodic_length",
                                         "policy_version"])
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir))
        self._live = self.console.is_terminal
        self._last_line = 0.0
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("SPS {task.fields[sps]:>6}"), TextColumn("return {task.fields[ret]:>7}"),
            TextColumn("v{task.fields[version]}"), TextColumn("in flight {task.fields[flight]}"),
            TimeElapsedColumn(), console=self.console, disable=not self._live)
        self.task = self.progress.add_task("env steps", total=total_steps, sps="-", ret="-",
                                           version=0, flight=0)
        self.progress.start()

    def state(self, env_steps: int) -> dict[str, Any]:
        """What a resumed run needs to carry on this logger (JSON-able)."""
        return {"env_steps": env_steps, "elapsed": time.time() - self.start,
                "recent_returns": list(self.recent_returns), "best_rolling": self.best_rolling}

    @property
    def rolling_return(self) -> float:
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else math.nan

    def episodes(self, global_step: int, returns: Any, lengths: Any, version: int) -> None:
        wall = time.time() - self.start
        for ret, length in zip(returns, lengths):
            self._episodes_csv.writerow([global_step, f"{wall:.3f}", f"{float(ret):.4f}", int(length), version])
            self.recent_returns.append(float(ret))
            if self.writer:
                self.writer.add_scalar("charts/episodic_return", float(ret), global_step)
                self.writer.add_scalar("charts/episodic_length", int(length), global_step)
        if len(self.recent_returns) == ROLLING_EPISODES:
            self.best_rolling = max(self.best_rolling, self.rolling_return)
        self._episodes_file.flush()

    def evaluation(self, global_step: int, returns: list[float], version: int) -> None:
        """A finished greedy evaluation, logged at the env step it was sent at."""
        mean, std = float(np.mean(returns)), float(np.std(returns))
        if self._evals_csv is None:
            self._evals_file = open(self.run_dir / "evals.csv", "w", newline="")
            self._evals_csv = csv.writer(self._evals_file)
            self._evals_csv.writerow(["global_step", "wall_time", "mean_return", "std_return", "episodes",
                                      "policy_version"])
        self._evals_csv.writerow([global_step, f"{time.time() - self.start:.3f}", f"{mean:.4f}",
                                  f"{std:.4f}", len(returns), version])
        self._evals_file.flush()
        if self.writer:
            self.writer.add_scalar("eval/mean_return", mean, global_step)
            self.writer.add_scalar("eval/std_return", std, global_step)
        self.console.print(f"eval at step {global_step} (policy v{version}): mean return {mean:.1f} ± "
                           f"{std:.1f} over {len(returns)} greedy episodes", highlight=False)

    def histogram(self, key: str, values: Any, global_step: int) -> None:
        if self.writer:
            self.writer.add_histogram(key, np.asarray(values), global_step)

    def scalars(self, global_step: int, values: Mapping[str, float]) -> None:
        row = {"global_step": global_step, "wall_time": round(time.time() - self.start, 3),
               "charts/rolling_return": self.rolling_return, **values}
        if self._progress_csv is None:
            self._progress_csv = csv.DictWriter(self._progress_file, fieldnames=list(row),
                                                extrasaction="ignore")
            self._progress_csv.writeheader()
        self._progress_csv.writerow(row)
        self._progress_file.flush()
        if self.writer:
            for key, value in row.items():
                if key not in ("global_step", "wall_time") and value == value:  # skip NaN
                    self.writer.add_scalar(key, value, global_step)

    def status(self, global_step: int, sps: float, version: int, in_flight: int) -> None:
        ret = self.rolling_return
        ret_text = "-" if math.isnan(ret) else f"{ret:.1f}"
        self.progress.update(self.task, completed=min(global_step, self.total_steps), sps=f"{sps:.0f}",
                             ret=ret_text, version=version, flight=in_flight)
        now = time.time()
        if not self._live and now - self._last_line > 5:
            self._last_line = now
            self.console.print(f"step {global_step}/{self.total_steps}  SPS {sps:.0f}  "
                               f"return(last {ROLLING_EPISODES}) {ret_text}  policy v{version}",
                               highlight=False)

    def close(self) -> None:
        self.progress.stop()
        if self.writer:
            self.writer.close()
        self._progress_file.close()
        self._episodes_file.close()
        if self._evals_file:
            self._evals_file.close()
