"""Where a run's numbers go: a live console display, CSV files and TensorBoard scalars, and the
run's sinks (`Sink`: MLflow with --track, evaluation videos with --capture-video).

Keys follow CleanRL / Stable-Baselines3 (`charts/episodic_return`, `charts/SPS`, `losses/...`).
Files in the run directory: config.json, progress.csv (one row per log), episodes.csv (one row per
finished training episode), evals.csv (one row per greedy evaluation), TensorBoard event files.

On a terminal the console shows a live progress display in two lines that fit its width (env steps,
elapsed time, ETA, SPS; the rolling training return, which is while exploring, the latest greedy
evaluation, policy version, tasks in flight: `RunProgress`); elsewhere a plain status line every 5 s,
never wrapped. Evaluations are logged (rlfarm.runio.logs) at info every `EVAL_LINE_EVERY`-th time
and for the run's last one, at debug otherwise; evals.csv and TensorBoard hold all of them.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress, ProgressBar, Task
from rich.text import Text

from rlfarm.config import json_safe
from rlfarm.errors import ConfigError, RunDirError
from rlfarm.runio import fit, logs
from rlfarm.runio.rundir import RowFile, csv_text, read_whole_rows, write_atomic

ROLLING_EPISODES = 20
EVAL_LINE_EVERY = 10  # greedy evaluations: one console line every this many (and the last one)

log = logging.getLogger("rlfarm.metrics")

TRAIN_EXTRA = 'pip install -e ".[train]"'


def summary_writer_class() -> type:
    """torch's TensorBoard SummaryWriter, or a ConfigError saying how to install TensorBoard (a
    worker-only install, `pip install rlfarm` without extras, has none)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ConfigError(
            f"the trainer writes TensorBoard files, but TensorBoard is not installed here "
            f"({exc}); install the trainer's extras: {TRAIN_EXTRA} in the rlfarm "
            f"checkout (or pip install 'rlfarm[train]')"
        ) from None
    return SummaryWriter


# evals.csv's columns; a run of several policies adds one `<policy>/mean_return` column per policy.
EVAL_FIELDS = ("global_step", "wall_time", "mean_return", "std_return", "episodes", "policy_version", "confirmation")
POLICY_EVAL_SUFFIX = "/mean_return"


def _truncate_csv(path: Path, max_step: int) -> list[str] | None:
    """Keep the header and the rows with global_step <= max_step; returns the header (None: no file).
    Replaced whole (rlfarm.runio.rundir): a full disk here leaves the file as it was."""
    if not path.exists():
        return None
    rows = read_whole_rows(path)
    if not rows:
        return None
    header, body = rows[0], rows[1:]
    kept = [r for r in body if len(r) == len(header) and int(float(r[0])) <= max_step]
    write_atomic(path, csv_text([header, *kept]))
    return header


def _clock(seconds: float | None) -> str:
    """H:MM:SS, as rich's time columns write it (`-:--:--` before there is an estimate)."""
    if seconds is None:
        return "-:--:--"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class RunProgress(Progress):
    """The live progress display: two lines that fit the terminal, 80 columns included. The first has
    what a user waits for (the bar, env steps, elapsed time, ETA, speed), the second how learning goes
    (the training return, which is while exploring, the greedy evaluation, the version, the tasks in
    flight). What does not fit is left out, the least needed first, never cut (rlfarm.runio.fit)."""

    def get_renderables(self) -> Any:
        for task in self.tasks:
            yield from self.lines(task)

    @staticmethod
    def lines(task: Task) -> list[fit.Line]:
        fields = task.fields
        total = task.total or 0
        steps = Text(f"{fit.count(task.completed)}/{fit.count(total)} steps", style="bold")
        first = fit.Line(
            [
                (0, steps),
                (0, Text(_clock(task.elapsed), style="progress.elapsed")),
                (0, Text(f"ETA {_clock(task.time_remaining)}", style="progress.remaining")),
                (3, Text(f"{fields['sps']} SPS")),
            ],
            bar=(0, 2, 10, 40, lambda width: ProgressBar(total=total, completed=task.completed, width=width)),
        )
        second = [(1, Text(f"return {fields['ret']} (exploring)"))]
        if fields["eval"]:
            second.append((1, Text(fields["eval"])))
        second += [(2, Text(f"policy v{fields['version']}")), (3, Text(f"{fields['flight']} in flight"))]
        return [first, fit.Line(second, gap=2)]


class _GuardedWriter:
    """TensorBoard's SummaryWriter whose write errors name the run directory (RunDirError). Its writer
    thread meets them and TensorBoard raises them on the trainer's next call, which lands here."""

    def __init__(self, writer: Any, run_dir: Path):
        self._writer = writer
        self._run_dir = run_dir

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._writer, name)
        if not callable(attr):
            return attr

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except OSError as exc:
                raise RunDirError(self._run_dir / "events.out.tfevents.*", exc) from None

        return guarded


def _quiet_event_thread_errors() -> None:
    """TensorBoard's writer thread re-raises a write error (a full disk) after keeping it for the
    trainer's next call: without this, Python prints that thread's traceback too."""
    previous = threading.excepthook
    if getattr(previous, "rlfarm_quiet", False):
        return

    def hook(args: Any) -> None:
        if issubclass(args.exc_type, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
            return
        previous(args)

    hook.rlfarm_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class Sink:
    """What else a RunLogger tells what it logs, beside its files and TensorBoard (rlfarm.observe.tracking,
    rlfarm.observe.video). A sink keeps its own failures to itself: a tracking server or a renderer
    that fails warns, and the run goes on."""

    def scalars(self, global_step: int, row: Mapping[str, float]) -> None:
        """A progress.csv row (its keys, global_step and wall_time included)."""

    def episodes(self, global_step: int, returns: Any, lengths: Any) -> None:
        """Training episodes that ended, logged at `global_step`."""

    def evaluation(self, global_step: int, returns: list[float], version: int, confirmation: bool) -> None:
        """A finished greedy evaluation of `version` (while it is still pinned in the store)."""

    def close(self, failing: BaseException | None) -> None:
        """The run ends (the run directory's files are written): `failing` is its error, if any."""


class RunLogger:
    def __init__(
        self,
        run_dir: Path,
        config: Mapping[str, Any],
        total_steps: int,
        console: Console | None = None,
        tensorboard: bool = True,
        resume: Mapping[str, Any] | None = None,
        sinks: Any = (),
    ):
        """`resume`: the `state()` of the logger of a run being resumed; its files are kept up to the
        checkpoint's env step (later rows will be produced again) and appended to. `sinks`: Sink
        factories, called once config.json is written (so the run directory exists)."""
        writer_class = summary_writer_class() if tensorboard else None  # before anything is written
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Strict JSON: target_return inf is written as null (rlfarm.config.from_dict reads it back).
        write_atomic(self.run_dir / "config.json", json.dumps(json_safe(config), indent=2, allow_nan=False) + "\n")
        self.sinks: list[Sink] = [make() for make in sinks]
        self.console = console or Console()
        self.total_steps = total_steps
        self.start = time.time() - (resume["elapsed"] if resume else 0.0)
        self.recent_returns: deque[float] = deque(resume["recent_returns"] if resume else (), maxlen=ROLLING_EPISODES)
        self.best_rolling = resume["best_rolling"] if resume else -math.inf
        self.evaluations = resume.get("evaluations", 0) if resume else 0
        self.best_eval = resume.get("best_eval", -math.inf) if resume else -math.inf
        self.last_eval = resume.get("last_eval", math.nan) if resume else math.nan
        self._last_eval_line: str | None = None  # the latest evaluation's line, until it is shown
        # CSV files grow by whole rows only (rlfarm.runio.rundir.RowFile): a full disk never leaves half a row.
        self._progress_fields: list[str] | None = None
        self._evals_file: RowFile | None = None
        self._eval_policies: list[str] = []  # several policies: evals.csv's columns of each one's mean
        # One progress row per step: a row at a step already logged (a resumed run's first log before
        # any new step, the closing log right after a periodic one) repeats it and adds nothing.
        self._last_row_step = resume["env_steps"] if resume else -1
        if resume:
            step = resume["env_steps"]
            self._progress_fields = _truncate_csv(self.run_dir / "progress.csv", step)
            self._progress_file = RowFile(self.run_dir / "progress.csv")
            _truncate_csv(self.run_dir / "episodes.csv", step)
            self._episodes_file = RowFile(self.run_dir / "episodes.csv")
            header = _truncate_csv(self.run_dir / "evals.csv", step)
            if header:
                self._evals_file = RowFile(self.run_dir / "evals.csv")
                self._eval_policies = [c.removesuffix(POLICY_EVAL_SUFFIX) for c in header[len(EVAL_FIELDS) :]]
        else:
            self._progress_file = RowFile(self.run_dir / "progress.csv", "w")
            self._episodes_file = RowFile(self.run_dir / "episodes.csv", "w")
            self._episodes_file.append(
                [["global_step", "wall_time", "episodic_return", "episodic_length", "policy_version"]]
            )
        self.writer: Any = None
        if writer_class is not None:
            _quiet_event_thread_errors()
            try:
                self.writer = _GuardedWriter(writer_class(str(self.run_dir)), self.run_dir)
            except OSError as exc:
                raise RunDirError(self.run_dir, exc) from None
        self._live = self.console.is_terminal
        self._last_line = 0.0
        self.progress = RunProgress(console=self.console, disable=not self._live)
        # A resumed run's bar starts at its step, so the ETA's speed is not inflated by the jump.
        self.task = self.progress.add_task(
            "env steps",
            total=total_steps,
            sps="-",
            ret="-",
            version=0,
            flight=0,
            eval=self._eval_text(),
            completed=min(resume["env_steps"], total_steps) if resume else 0,
        )
        self.progress.start()
        if self._live:
            logs.set_live_console(self.console)  # log lines go above the bar

    def state(self, env_steps: int) -> dict[str, Any]:
        """What a resumed run needs to carry on this logger (JSON-able)."""
        return {
            "env_steps": env_steps,
            "elapsed": time.time() - self.start,
            "recent_returns": list(self.recent_returns),
            "best_rolling": self.best_rolling,
            "evaluations": self.evaluations,
            "best_eval": self.best_eval,
            "last_eval": self.last_eval,
        }

    def _eval_text(self) -> str:
        """The progress bar's evaluation field: the latest greedy evaluation and the best so far."""
        return f"eval {self.last_eval:.1f} (best {self.best_eval:.1f})" if self.evaluations else ""

    def eta(self) -> float | None:
        """Seconds to total_steps at the recent speed (rich's estimate), None before it has one."""
        return self.progress.tasks[0].time_remaining if self.progress.tasks else None

    @property
    def rolling_return(self) -> float:
        return sum(self.recent_returns) / len(self.recent_returns) if self.recent_returns else math.nan

    def episodes(self, global_step: int, returns: Any, lengths: Any, version: int) -> None:
        wall = time.time() - self.start
        self._episodes_file.append(
            [
                [global_step, f"{wall:.3f}", f"{float(ret):.4f}", int(length), version]
                for ret, length in zip(returns, lengths)
            ]
        )
        for ret, length in zip(returns, lengths):
            self.recent_returns.append(float(ret))
            if self.writer:
                self.writer.add_scalar("charts/episodic_return", float(ret), global_step)
                self.writer.add_scalar("charts/episodic_length", int(length), global_step)
        if len(self.recent_returns) == ROLLING_EPISODES:
            self.best_rolling = max(self.best_rolling, self.rolling_return)
        for sink in self.sinks:
            sink.episodes(global_step, returns, lengths)

    def evaluation(
        self,
        global_step: int,
        returns: list[float],
        version: int,
        confirmation: bool = False,
        by_policy: Mapping[str, float] | None = None,
    ) -> None:
        """A finished greedy evaluation, logged at the env step it was sent at. `confirmation`: the
        extra episodes that confirm an evaluation at the target (a row of its own, always on the console).
        `by_policy`: several policies' mean returns (`returns` are the first policy's), a column each."""
        mean, std = float(np.mean(returns)), float(np.std(returns))
        by_policy = dict(by_policy or {})
        if self._evals_file is None:
            self._evals_file = RowFile(self.run_dir / "evals.csv", "w")
            self._eval_policies = list(by_policy)
            self._evals_file.append([[*EVAL_FIELDS, *(f"{name}{POLICY_EVAL_SUFFIX}" for name in self._eval_policies)]])
        own = [f"{by_policy[name]:.4f}" if name in by_policy else "" for name in self._eval_policies]
        self._evals_file.append(
            [
                [
                    global_step,
                    f"{time.time() - self.start:.3f}",
                    f"{mean:.4f}",
                    f"{std:.4f}",
                    len(returns),
                    version,
                    int(confirmation),
                    *own,
                ]
            ]
        )
        if self.writer:
            for name, value in by_policy.items():
                self.writer.add_scalar(f"eval/{name}/mean_return", value, global_step)
        for sink in self.sinks:
            sink.evaluation(global_step, list(returns), version, confirmation)
        if confirmation:
            if self.writer:
                self.writer.add_scalar("eval/confirmation_mean_return", mean, global_step)
            log.info(
                "confirmation of policy v%d: mean return %.1f ± %.1f over %d more greedy episodes with other seeds",
                version,
                mean,
                std,
                len(returns),
            )
            return
        if self.writer:
            self.writer.add_scalar("eval/mean_return", mean, global_step)
            self.writer.add_scalar("eval/std_return", std, global_step)
        self.evaluations += 1
        self.last_eval = mean
        self.best_eval = max(self.best_eval, mean)
        self.progress.update(self.task, eval=self._eval_text())
        line = (
            f"eval {self.evaluations} at step {global_step} (policy v{version}): mean return "
            f"{mean:.1f} ± {std:.1f} over {len(returns)} greedy episodes (best {self.best_eval:.1f})"
        )
        if self.evaluations % EVAL_LINE_EVERY == 0:
            log.info("%s", line)
            self._last_eval_line = None
        else:  # on the bar only (and in the log file with -v); close() shows the run's last one
            log.debug("%s", line)
            self._last_eval_line = line

    def histogram(self, key: str, values: Any, global_step: int) -> None:
        if self.writer:
            self.writer.add_histogram(key, np.asarray(values), global_step)

    def scalars(self, global_step: int, values: Mapping[str, float]) -> None:
        if global_step <= self._last_row_step:
            return
        self._last_row_step = global_step
        row = {
            "global_step": global_step,
            "wall_time": round(time.time() - self.start, 3),
            "charts/rolling_return": self.rolling_return,
            **values,
        }
        if self._progress_fields is None:
            self._progress_fields = list(row)
            self._progress_file.append([self._progress_fields])
        self._progress_file.append([[row.get(key, "") for key in self._progress_fields]])
        if self.writer:
            for key, value in row.items():
                if key not in ("global_step", "wall_time") and value == value:  # skip NaN
                    self.writer.add_scalar(key, value, global_step)
        for sink in self.sinks:
            sink.scalars(global_step, row)

    def status(self, global_step: int, sps: float, version: int, in_flight: int) -> None:
        ret = self.rolling_return
        ret_text = "-" if math.isnan(ret) else f"{ret:.1f}"
        self.progress.update(
            self.task,
            completed=min(global_step, self.total_steps),
            sps=fit.count(sps),
            ret=ret_text,
            version=version,
            flight=in_flight,
        )
        now = time.time()
        if not self._live and now - self._last_line > 5:
            self._last_line = now
            eta = self.eta()
            eta_text = "-" if eta is None else str(datetime.timedelta(seconds=math.ceil(eta)))
            eval_text = f"  {self._eval_text()}" if self.evaluations else ""
            # soft_wrap: one line whatever the width (a file or pipe is 80 columns to rich), as logs are
            self.console.print(
                f"step {global_step}/{self.total_steps}  ETA {eta_text}  SPS {sps:.0f}  "
                f"return(last {ROLLING_EPISODES}, exploring) {ret_text}{eval_text}  "
                f"policy v{version}",
                highlight=False,
                soft_wrap=True,
            )

    def close(self) -> None:
        """Stop the display and close the files. A run that ends normally (no exception on its way
        out through the caller's `finally`) also gets its last evaluation's line if it was not shown."""
        failing = sys.exc_info()[1]  # the run's own error, if one is on its way out: it is the one to tell
        if self._last_eval_line is not None and sys.exc_info()[0] is None:
            log.info("%s", self._last_eval_line)
            self._last_eval_line = None
        if self._live:
            logs.set_live_console(None)
        self.progress.stop()
        if self.writer:
            try:
                self.writer.close()
            except RunDirError:
                if failing is None:
                    raise
        self._progress_file.close()
        self._episodes_file.close()
        if self._evals_file:
            self._evals_file.close()
        for sink in self.sinks:
            sink.close(failing)
