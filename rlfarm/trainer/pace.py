"""`async.tasks_in_flight = "auto"`: as many tasks in flight as keep the learner fed, and no more.

Every result learned from before a task's own adds a version to that task's policy lag. Where the
learner sets the pace (a CNN learned on a few cores), a task beyond those the learner can take in
only waits for it: lag bought with no throughput (benchmarks/results/pong-fast-lag.txt: one task in
flight instead of two on 2 cores kept the rate and cut the lag from 2.5 versions to 1). Where the
workers set the pace (CartPole, or a learner on a GPU), every worker keeps a task.

So the trainer measures two things per result, smoothed over its log intervals: how long a task
acts on its worker, and how long the trainer is busy with a result (taking it in, learning,
publishing: its time not spent waiting for one). In that time one result must arrive for the
learner never to wait, so
`ceil(task seconds / trainer seconds)` tasks in flight suffice, bounded by the farm's worker
processes. This module is the arithmetic; `AsyncTrainer` feeds it and obeys its `window`.
"""

from __future__ import annotations

import math


class InFlightPace:
    """The number of tasks to keep in flight (`window`), between 1 and `cap` (the farm's worker
    processes, at least 2): `cap` until the first results are measured."""

    def __init__(self, cap: int, smoothing: float = 0.3):
        if cap < 1:
            raise ValueError(f"cap must be at least 1, got {cap}")
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.cap = cap
        self.smoothing = smoothing
        self.window = cap
        self.task_seconds: float | None = None  # acting on its worker, per task
        self.busy_seconds: float | None = None  # the trainer's, per result

    def _smooth(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)

    def observe(self, results: int, task_seconds: float, busy_seconds: float) -> int:
        """One log interval: `results` taken in, their tasks' mean acting time, and the
        trainer's busy seconds (the interval less its waits for a result). Returns the new window;
        an interval without results changes nothing."""
        if results <= 0:
            return self.window
        self.task_seconds = self._smooth(self.task_seconds, max(0.0, task_seconds))
        self.busy_seconds = self._smooth(self.busy_seconds, max(0.0, busy_seconds) / results)
        if self.busy_seconds <= 0.0:
            self.window = self.cap
        else:
            self.window = max(1, min(self.cap, math.ceil(self.task_seconds / self.busy_seconds)))
        return self.window
