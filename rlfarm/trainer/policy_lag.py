"""Policy lag, the hard part of learning from a farm that acts while the learner learns: how far behind
the learner's version a result's acting version is, which results are too stale to learn from, and
the lag and slot-wait bookkeeping the ASYNC trainer logs (rlfarm.trainer.asynchronous). Pure: no I/O."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def auto_policy_lag(tasks_in_flight: int, versions_per_result: float) -> int:
    """`async.max_policy_lag = "auto"`: the largest lag a result reaches without a fault.

    A task fetches the newest version when it starts; before its result is learned from, the other
    `tasks_in_flight - 1` results in flight and at most `tasks_in_flight` waiting in the backlog are,
    each publishing `versions_per_result` versions. So lag stays under 2 x tasks in flight results'
    worth of versions, and what is dropped is what a fault delayed (a straggler's backup, a task
    re-sent after a lost worker). A fixed bound fits one farm size only: cartpole-dqn's 48 fitted
    2 tasks in flight and dropped 19 % of the results with 3."""
    return max(1, math.ceil(2 * tasks_in_flight * versions_per_result))


def too_stale(lag: int, max_policy_lag: int) -> bool:
    """A result acted `lag` versions ago is dropped past the bound, and learned from at it."""
    return lag > max_policy_lag


def stale_result(lag: int, lags: Mapping[str, int] | None, max_policy_lag: int) -> bool:
    """A result is dropped when its version or any policy's line version it acted with (`lags`, from
    `line_lags`) is past the bound, or when what acted cannot be read (`lags` None)."""
    return lags is None or too_stale(max([lag, *lags.values()]), max_policy_lag)


def line_lags(acted: Mapping[str, Any] | None, heads: Mapping[str, int]) -> dict[str, int] | None:
    """Several policies: each one's lag on its own line (rlfarm.farm.policies.lines), its newest version
    `heads` minus the one that acted; {} when nothing says what acted (one policy). None when what
    acted is not a version of each line (a result written by someone else on a farm without a
    secret): such a result is dropped."""
    if not acted:
        return {}
    lags = {}
    for name, head in heads.items():
        number = acted.get(name)
        if type(number) is not int or not 0 <= number <= head:
            return None
        lags[name] = head - number
    return lags


class LagBook:
    """The lags of the results taken in: this log interval's (the run version's, from the oldest
    version that acted and from the newest, and each policy's on its own line) and the whole run's
    histogram, kept in the checkpoint."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}  # whole-run histogram of policy lag, consumed or dropped
        self.reset()

    def reset(self) -> None:
        """A new log interval."""
        self.lags: list[int] = []
        self.end_lags: list[int] = []
        self.by_policy: dict[str, list[int]] = {}  # several policies: each one's on its own line

    def record(self, lag: int, end_lag: int, policy_lags: Mapping[str, int] | None) -> None:
        self.lags.append(lag)
        self.end_lags.append(end_lag)
        self.counts[lag] = self.counts.get(lag, 0) + 1
        for name, line_lag in (policy_lags or {}).items():
            self.by_policy.setdefault(name, []).append(line_lag)

    def scalars(self) -> dict[str, float]:
        """This interval's lags as the log shows them (0 when no result came)."""
        lags = np.asarray(self.lags or [0])
        return {
            "farm/policy_lag": float(lags.mean()),
            "farm/policy_lag_min": int(lags.min()),
            "farm/policy_lag_max": int(lags.max()),
            "farm/policy_lag_end": float(np.mean(self.end_lags or [0])),
            **{f"{name}/policy_lag": float(np.mean(lags)) for name, lags in self.by_policy.items() if lags},
        }

    def histogram(self) -> dict[str, int]:
        return {str(k): v for k, v in sorted(self.counts.items())}

    def restore(self, counts: Mapping[str, int]) -> None:
        self.counts = {int(k): v for k, v in counts.items()}


class SlotWait:
    """Task-slot time spent waiting for the trainer (a task finished, its replacement not yet sent):
    this log interval's, for `farm/slots_waiting`, and the whole run's, for summary.json."""

    def __init__(self) -> None:
        self.interval = 0.0  # slot seconds waited this log interval
        self.total = 0.0  # ... over the run
        self.open = 0.0  # slot seconds open over the run (the window times the time)

    def waited(self, seconds: float) -> None:
        self.interval += seconds
        self.total += seconds

    def fraction(self, window: int, elapsed: float) -> float:
        """The share of this interval's slot time spent waiting."""
        return min(1.0, self.interval / (window * elapsed)) if elapsed > 0 else 0.0

    def close_interval(self, window: int, elapsed: float) -> None:
        self.open += window * elapsed

    def run_fraction(self) -> float:
        return round(self.total / self.open, 4) if self.open > 0 else 0.0
